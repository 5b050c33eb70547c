"""The demo's tests: one torch thread (``torch_threads``); a lab run's folder with kept checkpoints (``run_folder``)."""

import json

import pytest
import torch
from torch_threads import one_torch_thread  # noqa: F401  (autouse)

from rlstab.demo.counterfactual_states import policy_for
from rlstab.lab.checkpoint import keep_checkpoint
from rlstab.trainer.tasks import get_task


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A lab run's folder as ``rlstab compare --keep-checkpoints`` leaves it: spec.json and checkpoints of steps 5, 10."""
    folder = tmp_path_factory.mktemp("lab") / "runs" / "collapse" / "dapo" / "seed0"
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    policy = policy_for("tiny", get_task("perm3"))
    params = policy.trainable_parameters()
    optimizer = torch.optim.Adam(params, lr=3e-4)
    spec = {"label": "dapo", "model": "tiny", "task": "perm3", "seed": 0,
            "regime": {"name": "collapse", "max_grad_norm": 1.0}}
    (folder / "spec.json").write_text(json.dumps(spec))
    for step in (5, 10):
        sum(p.square().sum() for p in params).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        keep_checkpoint(folder, step, {"step": step, "weights": [p.detach().clone() for p in params],
                                       "optimizer": optimizer.state_dict(), "rows": []})
    return folder
