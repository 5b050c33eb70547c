"""rlstab.testing.state: which components keep state, and the checkpoint round trip, which fails on state kept
where it is never saved, state that never moves, and a runtime that forgets what it loads."""

from typing import Any, Literal

import pytest
import torch
from pydantic import Field

import rlstab
from rlstab.components import ComponentState
from rlstab.exploration.deep_grpo import DeepGRPO
from rlstab.masks.base import Mask
from rlstab.masks.s2t import S2T
from rlstab.registry import isolated
from rlstab.reweighters.base import Reweighter
from rlstab.reweighters.stare import STARE
from rlstab.sampling.base import Sampler
from rlstab.testing.state import check_state_round_trip, is_stateful, runtime_factory


class StatefulMask(Mask):
    """A mask with state: the compiled objective never saves or advances a mask's state."""

    kind: Literal["kit-stateful-mask"] = "kit-stateful-mask"

    def initial_state(self) -> dict[str, Any]:
        return {"n": 0}

    def keep(self, t, threshold):
        return torch.ones_like(t.logprobs)

    def describe(self) -> str:
        return "kit-stateful-mask: keep every token"


class Steps(ComponentState):
    steps: int = Field(ge=0)


class FrozenReweighter(Reweighter):
    """Declares state that never changes: the round trip would prove nothing."""

    kind: Literal["kit-frozen"] = "kit-frozen"
    state_model = Steps

    def initial_state(self) -> dict[str, Any]:
        return {"steps": 0}

    def begin_step(self, sums, state):
        return 0, dict(state or self.initial_state())

    def weights(self, t, step):
        return torch.ones_like(t.logprobs)

    def describe(self) -> str:
        return "kit-frozen: w = 1"


class Counter:
    """A sampler runtime: choose rotates by the steps observed so far."""

    def __init__(self, seed: int, forgets: bool):
        self.seen, self.forgets = seed, forgets

    def pool_size(self, n):
        return n + 1

    def choose(self, prompts, n):
        return [(self.seen + i) % len(prompts) for i in range(n)]

    def observe(self, prompts, rates):
        self.seen += 1
        return {"seen": float(self.seen)}

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        if not self.forgets:
            self.seen = state["seen"]


class CountingSampler(Sampler):
    kind: Literal["kit-counting"] = "kit-counting"
    forgets: bool = False

    def curriculum(self, seed: int):
        return Counter(seed, self.forgets)

    def describe(self) -> str:
        return "kit-counting: rotate the pool"


@pytest.fixture(scope="module", autouse=True)
def registered():
    with isolated():
        for cls in (StatefulMask, FrozenReweighter, CountingSampler):
            rlstab.register(cls)
        yield


def test_which_components_keep_state():
    # (Goldilocks is stateful too, but building its runtime builds an optimizer: tests/testing/test_builtin_conformance.py)
    assert is_stateful(STARE(variant="C2", adaptive=True)) and is_stateful(DeepGRPO()) and is_stateful(CountingSampler())
    assert not is_stateful(S2T())
    assert is_stateful(StatefulMask())  # so that the check can say why its state is lost


def test_runtime_factory():
    sampler = CountingSampler()
    assert runtime_factory(sampler) == sampler.curriculum
    deep = DeepGRPO()
    assert runtime_factory(deep) == deep.explorer
    assert runtime_factory(S2T()) is None


def test_a_builtin_controller_survives_its_checkpoint():
    check_state_round_trip(STARE(variant="C2", adaptive=True, alpha=0.05, target_entropy=1.0))


def test_state_outside_the_hooked_families_is_never_kept():
    with pytest.raises(AssertionError, match=r"compiled objective keeps state only for reweighters and surrogate and "
                                             r"regularisers \(StepHook\): a masks component's state is never saved"):
        check_state_round_trip(StatefulMask())


def test_a_state_that_never_moves_proves_nothing():
    # 5 steps (STEPS), and begin_step hands back {"steps": 0} each time
    with pytest.raises(AssertionError, match=r"the state never changed over 5 steps \(\{'steps': 0\}\)"):
        check_state_round_trip(FrozenReweighter())


def test_a_runtime_that_resumes_passes_and_one_that_forgets_its_checkpoint_fails():
    check_state_round_trip(CountingSampler())
    with pytest.raises(AssertionError) as caught:
        check_state_round_trip(CountingSampler(forgets=True))
    # resumed after step 1: a fresh runtime of seed 3 chooses from seen = 3 instead of 4
    assert "sampler kind 'kit-counting'" in str(caught.value)
    assert "resumed after step 1: the runtime's decisions and metrics differ" in str(caught.value)
