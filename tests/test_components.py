"""The component base model: number fields take Python numbers, not tensors or numpy scalars (issue 38)."""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
import pytest
import torch
from pydantic import ValidationError

import rlstab
from rlstab import StateError
from rlstab.masks import S2T, Mask

REFUSED = "is not accepted: pass a Python number, e.g. x.item() or float(x)"
TENSOR = re.escape(f"a torch.Tensor {REFUSED}")


class Plugin(Mask):
    """A third-party mask: its own fields get the base model's rule."""

    kind: Literal["issue38_plugin"] = "issue38_plugin"
    scale: float = 1.0
    scales: tuple[float, ...] = ()

    def keep(self, t, threshold):
        return t.valid

    def describe(self) -> str:
        return "issue38_plugin"


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (torch.tensor(0.3), "torch.Tensor"),  # float32: it would be stored as 0.30000001192092896
        (torch.tensor(0.3, dtype=torch.float64), "torch.Tensor"),  # exact, refused all the same: one rule for every dtype
        (torch.tensor([0.3]), "torch.Tensor"),
        (np.float32(0.3), "numpy.float32"),
        (np.array(0.3), "numpy.ndarray"),
    ],
)
def test_a_tensor_or_numpy_value_is_refused_naming_its_type(value, name):
    with pytest.raises(ValidationError) as info:
        S2T(tau_p=value)
    (error,) = info.value.errors()
    assert error["loc"] == ("tau_p",)
    assert f"a {name} {REFUSED}" in error["msg"]


def test_python_numbers_are_kept_exactly():
    assert S2T(tau_p=0.3).tau_p == 0.3
    value = S2T(tau_p=np.float64(0.3)).tau_p  # a float subclass: the same double
    assert value == 0.3 and type(value) is float


def test_plugin_fields_and_tuples_of_numbers_follow_the_same_rule():
    with pytest.raises(ValidationError, match=f"scale\n.*{TENSOR}"):
        Plugin(scale=torch.tensor(2.0))
    with pytest.raises(ValidationError, match=f"scales\n.*{TENSOR}"):
        Plugin(scales=(0.5, torch.tensor(2.0)))
    assert Plugin(scale=2.0, scales=(0.5, 2.0)).scales == (0.5, 2.0)


def test_objective_fields_and_nested_components_follow_the_same_rule():
    data = rlstab.load("stapo").model_dump()
    with pytest.raises(ValidationError, match=f"log_ratio_clamp\n.*{TENSOR}"):
        rlstab.Objective.model_validate({**data, "log_ratio_clamp": torch.tensor(20.0)})
    data["masks"][0]["tau_p"] = torch.tensor(0.002)
    with pytest.raises(ValidationError, match=f"tau_p\n.*{TENSOR}"):
        rlstab.Objective.model_validate(data)


def test_a_component_state_with_a_tensor_is_refused():
    loss_fn = rlstab.load("stare").compile()
    state = loss_fn.state_dict()
    (label,) = state
    with pytest.raises(StateError, match=re.escape(f"state[{label!r}].W = tensor(1.1000): ") + TENSOR):
        loss_fn.load_state_dict({label: {**state[label], "W": torch.tensor(1.1)}})
    loss_fn.load_state_dict(state)
