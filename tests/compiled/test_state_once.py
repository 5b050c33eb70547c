"""Stateful components advance exactly once per step, on every path, and not at all when the step fails.

Paths: a single call (``loss_fn(batch)``, the micro-batch is its own step); ``gather`` then the
micro-batch calls; an adapter's per-micro-batch gathers with ``update_state=False`` after the
step's first. NaN and infinities on padding must not change that: the single call then zeroes
the padding and computes the step again (it used to advance the state twice). A call or gather
that raises (a non-finite value on a valid token, a malformed step) leaves the state as it was.

Hand-computed controller moves (STARE, ``adaptive: true``, alpha 0.05, H_tgt 0.3, W 1.1, M 0.9):
the batches' valid tokens all have entropy 0.1, so H_bar = 0.1 < 0.3, sign = +1, and one step
moves W to 1.1 + 0.05 = 1.15 and M to 0.9 - 0.05 = 0.85 (two steps would give 1.2 and 0.8).
"""

from __future__ import annotations

import pytest
import torch

import rlstab
from rlstab import TokenBatch

ADAPTIVE_STARE = {
    "extends": "dapo",
    "reweighters": [{"kind": "stare", "variant": "C2", "adaptive": True, "alpha": 0.05, "target_entropy": 0.3}],
}
STARE_LABEL = "reweighters[0] (stare)"
BAPO_LABEL = "surrogate (bapo)"
# Every stateful preset, and STARE with its adaptive controller.
STATEFUL = {
    "stare (adaptive)": ADAPTIVE_STARE,
    "stare": "stare",
    "bapo": "bapo",
}
MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
NAN, INF = float("nan"), float("inf")


def batch(padding: float = 0.0, valid_nan: str | None = None) -> TokenBatch:
    """4 responses (the last a padding row), entropy 0.1 on valid tokens; ``padding`` fills every padded value."""
    g = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(4, 5, generator=g) * 2
    fields = dict(
        logprobs=logprobs,
        old_logprobs=logprobs + 0.2 * torch.randn(4, 5, generator=g),
        entropy=torch.full((4, 5), 0.1),
        advantages=torch.tensor([1.0, -1.0, 0.5, 2.0]),
    )
    for value in fields.values():
        if value.dim() == 2:
            value[~MASK] = padding
    fields["advantages"][3] = padding  # the padding row's advantage
    if valid_nan is not None:
        fields[valid_nan][(1,) if fields[valid_nan].dim() == 1 else (1, 2)] = NAN
    fields["logprobs"] = fields["logprobs"].requires_grad_()
    return TokenBatch(response_mask=MASK, **fields)


def halves(padding: float = 0.0) -> list[TokenBatch]:
    whole = batch(padding)
    fields = {f: getattr(whole, f) for f in ("logprobs", "old_logprobs", "entropy", "advantages", "response_mask")}
    fields["logprobs"] = fields["logprobs"].detach()
    parts = []
    for lo, hi in ((0, 2), (2, 4)):
        part = {k: v[lo:hi] for k, v in fields.items()}
        part["logprobs"] = part["logprobs"].clone().requires_grad_()
        parts.append(TokenBatch(**part))
    return parts


def one_step_state(objective) -> dict:
    """The state after one single call on finite data: the reference every path must reach."""
    loss_fn = rlstab.load(objective).compile()
    loss_fn(batch())
    return loss_fn.state_dict()


def test_the_reference_step_moves_the_controller_once():
    state = one_step_state(ADAPTIVE_STARE)[STARE_LABEL]
    assert state["W"] == pytest.approx(1.15) and state["M"] == pytest.approx(0.85)  # see the module docstring
    assert state["H_bar"] == pytest.approx(0.1) and state["gate"] is True
    assert one_step_state("bapo")[BAPO_LABEL]["steps"] == 1


@pytest.mark.parametrize("padding", [NAN, INF, -INF])
@pytest.mark.parametrize("name", STATEFUL)
def test_single_call_with_non_finite_padding_advances_once(name, padding):
    loss_fn = rlstab.load(STATEFUL[name]).compile()
    out = loss_fn(batch(padding))
    assert torch.isfinite(out.loss)
    assert loss_fn.state_dict() == one_step_state(STATEFUL[name])


@pytest.mark.parametrize("padding", [0.0, NAN, INF])
@pytest.mark.parametrize("name", STATEFUL)
def test_gather_and_micro_batch_calls_advance_once(name, padding):
    loss_fn = rlstab.load(STATEFUL[name]).compile()
    micro = halves(padding)
    stats = loss_fn.gather(micro)
    for mb in micro:
        assert torch.isfinite(loss_fn(mb, step=stats).loss)
    assert loss_fn.state_dict() == one_step_state(STATEFUL[name])


@pytest.mark.parametrize("padding", [0.0, NAN])
@pytest.mark.parametrize("name", STATEFUL)
def test_per_micro_batch_gathers_advance_once(name, padding):
    """An adapter gathering each micro-batch as it comes: update_state=False on all but the step's first."""
    loss_fn = rlstab.load(STATEFUL[name]).compile()
    for i, mb in enumerate(halves(padding)):
        stats = loss_fn.gather([mb], update_state=i == 0)
        loss_fn(mb, step=stats)
    state = loss_fn.state_dict()
    if name == "bapo":
        assert state[BAPO_LABEL]["steps"] == 1
    else:  # the controller moved once, from the first micro-batch's entropy (0.1 too)
        reference = one_step_state(STATEFUL[name])[STARE_LABEL]
        assert state[STARE_LABEL] == reference


@pytest.mark.parametrize("field", ["logprobs", "old_logprobs", "entropy", "advantages"])
@pytest.mark.parametrize("name", STATEFUL)
def test_a_call_that_raises_leaves_the_state(name, field):
    loss_fn = rlstab.load(STATEFUL[name]).compile()
    loss_fn(batch())  # one step done: a state that is not the initial one
    before = loss_fn.state_dict()
    with pytest.raises(FloatingPointError, match=rf"TokenBatch\.{field}"):
        loss_fn(batch(NAN, valid_nan=field))
    assert loss_fn.state_dict() == before
    with pytest.raises(FloatingPointError, match=rf"TokenBatch\.{field}"):
        loss_fn.gather([batch(), batch(NAN, valid_nan=field)])
    assert loss_fn.state_dict() == before
    loss_fn(batch())  # and the next step moves on from there, once
    if name == "bapo":
        assert loss_fn.state_dict()[BAPO_LABEL]["steps"] == 2


def test_an_error_after_the_step_statistics_leaves_the_state():
    """An entropy bonus refuses a detached entropy in the loss phase, after the single call computed the
    step's statistics (and, before the state became transactional, had already moved the controller)."""
    objective = {**ADAPTIVE_STARE, "regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]}
    loss_fn = rlstab.load(objective).compile()
    before = loss_fn.state_dict()
    with pytest.raises(ValueError, match="entropy_bonus needs TokenBatch.entropy with gradient"):
        loss_fn(batch())
    assert loss_fn.state_dict() == before
