"""Fuzz campaign: odd tensor batches through every preset (``rlstab.preset_names()``).

What it generates (hypothesis), per preset:

- shapes: B in {0, 1, 2, 3, 5} responses and T in {0, 1, 2, 3, 6} tokens: empty batches, one-token
  batches, rows without a response token (padding rows), small batches;
- dtypes, each float field on its own: float16, bfloat16, float32, float64; response masks
  bool, int64, int32, uint8, float32 or float16 (0/1); rewards float or int; group ids int64,
  int32 or uint8;
- layouts, each tensor on its own: contiguous, transposed (column-major), sliced with a step,
  or expanded (stride 0); ``logprobs`` and ``entropy`` (with gradient, as a trainer computes it
  for an entropy bonus) are then non-contiguous leaves (or expanded views of ``[1, T]`` leaves);
- advantages per response, per token, or estimated from rewards and group ids (padding rows
  get any reward and group ids no other row has);
- optional fields present or not (old, rollout and reference log-probabilities, entropy,
  importance weights, token ids in int64, int32 or uint8);
- non-finite values: none; NaN, +-inf or a huge finite value (3e38, float32/64 fields only) on
  padding; or NaN / +-inf on one valid token of one field (a reward: of a response with tokens);
- values a field cannot hold (``rlstab.batch.VALUE_LIMITS``), on padding or on one valid token: a
  log-prob above 0 beyond rounding (0.75, a probability; 3 or 17, logits), an entropy below 0
  beyond rounding (-0.75, -4, log-probs).

What it checks, on both paths (``loss_fn(batch)``; ``gather([batch])`` then ``loss_fn(batch, step=...)``):

- the case ends in the result of the reference batch — the contiguous float32 copy of the same
  values with finite padding, bool mask, int64 group ids: the same loss (finite), gradients on the
  caller's leaves (logprobs, entropy) and metrics;
- or, with a non-finite value on a valid token of a field the objective reads, a
  ``FloatingPointError`` naming ``TokenBatch.<field>``, and the objective's state unchanged; with a
  value beyond its field's limits there, a ``BatchError`` naming the field and the likely mistake;
- or, when the reference itself is refused (a preset reading a field the batch lacks), the same
  ``BatchError``;
- any other exception, or a non-finite loss, fails the case.

Default run: ``EXAMPLES`` cases per preset; ``pytest --fuzz-long`` multiplies that by ``fuzzing.LONG`` (tests/fuzzing.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

import rlstab
from rlstab import BatchError, TokenBatch

from batches import column_major, draw_response_mask, stepped
from fuzzing import fuzz_settings

EXAMPLES = 40  # per preset and run: 24 presets x 40 = 960 cases by default
PRESETS = rlstab.preset_names()
OBJECTIVES = {name: rlstab.load(name) for name in PRESETS}

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
MASK_DTYPES = [torch.bool, torch.int64, torch.int32, torch.uint8, torch.float32, torch.float16]
# Transposed twice as often: a dense non-contiguous layout is the one a flat view cannot read.
LAYOUTS = ["contiguous", "transposed", "transposed", "step", "expanded"]
TOKEN_FIELDS = ["logprobs", "old_logprobs", "entropy", "rollout_logprobs", "ref_logprobs"]
NAN, INF = float("nan"), float("inf")
# Values beyond a field's limits: a probability or logits given as log-probs, log-probs given as entropy.
BEYOND_LIMITS = {
    **{name: [0.75, 3.0, 17.0] for name in ("logprobs", "old_logprobs", "rollout_logprobs", "ref_logprobs")},
    "entropy": [-0.75, -4.0],
}
# The fields that carry gradient, as a trainer supplies them: the entropy too (computed from the logits with grad, as
# an entropy bonus needs it; masks read it detached). The gradient of each is checked against the reference's.
DIFFERENTIABLE = ("logprobs", "entropy")


# ----------------------------------------------------------------------------- layouts


def laid_out(values: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values in another memory layout (``expanded`` needs equal rows: see ``draw_values``)."""
    if layout == "contiguous":
        return values.clone()
    if layout == "expanded" and values.shape[0] >= 1:
        return values[:1].expand(values.shape)
    return column_major(values) if layout == "transposed" else stepped(values)


def leaf_of(values: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(leaf, values)``: a differentiable field in ``layout`` whose gradient reaches ``leaf``."""
    if layout == "expanded" and values.shape[0] >= 1:
        leaf = values[:1].clone().requires_grad_()
        return leaf, leaf.expand(values.shape)
    leaf = laid_out(values, layout).detach().requires_grad_()  # a non-contiguous leaf
    return leaf, leaf


# ----------------------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    values: dict  # field -> final values (contiguous, in the field's dtype, finite padding)
    layouts: dict  # field -> layout
    injected: dict = field(default_factory=dict)  # field -> values with the injection (non-finite, or beyond limits)
    placement: str = "none"  # none | padding | valid
    target: str | None = None  # the injected field
    index: tuple = ()

    def batch(self, reference: bool) -> tuple[TokenBatch, dict]:
        """The batch (or its reference) and the leaves of its differentiable fields (``DIFFERENTIABLE``, when present)."""
        fields = {}
        leaves = {}
        for name, v in self.values.items():
            if v is None:
                fields[name] = None
                continue
            if reference:
                v = v.to(torch.float32) if v.is_floating_point() else v.to(torch.int64 if name in ("group_ids", "token_ids") else torch.bool)
                if name in DIFFERENTIABLE:
                    leaves[name] = v = v.clone().requires_grad_()
                fields[name] = v
                continue
            v = self.injected.get(name, v)
            if name in DIFFERENTIABLE:
                leaves[name], v = leaf_of(v, self.layouts[name])
            else:
                v = laid_out(v, self.layouts[name])
            fields[name] = v
        return TokenBatch(**fields), leaves


@st.composite
def cases(draw, name: str) -> Case:
    B = draw(st.sampled_from([0, 1, 2, 3, 5]))
    T = draw(st.sampled_from([0, 1, 2, 3, 6]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    layouts = {}

    def layout(name: str) -> str:
        layouts[name] = draw(st.sampled_from(LAYOUTS))
        return layouts[name]

    def shaped(name: str, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``values`` in ``dtype``; equal rows when the field's layout is ``expanded``."""
        if layout(name) == "expanded" and values.shape[0] >= 1:
            values = values[:1].expand(values.shape).clone()
        return values.to(dtype)

    mask = shaped("response_mask", draw_response_mask(draw, B, T), draw(st.sampled_from(MASK_DTYPES)))

    def floats(name: str, values: torch.Tensor) -> torch.Tensor:
        return shaped(name, values, draw(st.sampled_from(FLOATS)))

    scale = draw(st.sampled_from([2.0, 12.0]))
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * scale
    values = {"logprobs": floats("logprobs", lp), "response_mask": mask}
    optional = lambda: draw(st.integers(0, 4)) > 0  # noqa: E731 - present 4 times in 5
    old = (lp + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5)).clamp(max=0.0)
    values["old_logprobs"] = floats("old_logprobs", old) if optional() else None
    values["entropy"] = floats("entropy", torch.rand(B, T, generator=g, dtype=torch.float64) * 3) if optional() else None
    far = (torch.rand(B, T, generator=g) < 0.2).double() * (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 8
    rollout = (old + far + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.02).clamp(max=0.0)
    values["rollout_logprobs"] = floats("rollout_logprobs", rollout) if optional() else None
    values["ref_logprobs"] = floats("ref_logprobs", lp + 0.1) if optional() else None
    weights = draw(st.sampled_from([None, "sequence", "token"]))
    shape = (B,) if weights == "sequence" else (B, T)
    values["is_weights"] = None if weights is None else floats("is_weights", torch.rand(shape, generator=g, dtype=torch.float64) + 0.5)

    advantages = draw(st.sampled_from(["sequence", "token", "estimated"]))
    values["advantages"] = values["rewards"] = values["group_ids"] = None
    if advantages == "estimated":
        rewards = torch.randint(0, 2, (B,), generator=g).to(torch.float64)
        reward_dtype = draw(st.sampled_from(FLOATS + [torch.int64]))
        values["rewards"] = shaped("rewards", rewards, reward_dtype)
        ids = torch.randint(0, 3, (B,), generator=g)
        padding_rows = ~values["response_mask"].to(torch.bool).any(-1)
        ids = torch.where(padding_rows, 100 + torch.arange(B), ids)  # ids no other row has
        values["group_ids"] = shaped("group_ids", ids, draw(st.sampled_from([torch.int64, torch.int32, torch.uint8])))
    else:
        shape = (B,) if advantages == "sequence" else (B, T)
        values["advantages"] = floats("advantages", (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5) * 4)

    # GTPO's conflict tokens read the response token ids: any integer dtype, any layout, anything on padding
    ids = torch.randint(0, 3, (B, T), generator=g)
    values["token_ids"] = shaped("token_ids", ids, draw(st.sampled_from([torch.int64, torch.int32, torch.uint8]))) if optional() else None

    case = Case(name, values, layouts)
    placement = draw(st.sampled_from(["none", "padding", "padding", "valid"]))
    floats_present = [f for f, v in values.items() if v is not None and v.is_floating_point() and f != "response_mask"]
    if placement == "none" or not floats_present:
        return case
    target = draw(st.sampled_from(floats_present))
    v = values[target]
    valid = values["response_mask"].to(torch.bool)
    where = valid.any(-1) if v.dim() == 1 else valid
    candidates = (where if placement == "valid" else ~where).nonzero().tolist()
    if not candidates:
        return case
    index = tuple(draw(st.sampled_from(candidates)))
    choices = [NAN, INF, -INF] + ([3e38, -3e38] if placement == "padding" and v.dtype in (torch.float32, torch.float64) else [])
    choices += BEYOND_LIMITS.get(target, [])
    bad = v.clone()
    bad[index] = draw(st.sampled_from(choices))
    if layouts[target] == "expanded":  # rows are no longer equal: keep the layout odd another way
        layouts[target] = "transposed"
    case.injected = {target: bad}
    case.placement, case.target, case.index = placement, target, index
    return case


# ----------------------------------------------------------------------------- the oracle


def checked_by(loss_fn: rlstab.CompiledObjective, batch: TokenBatch, name: str) -> bool:
    """Whether the loss checks the values of ``TokenBatch.<name>`` (it reads it): finite, and within limits."""
    if name in ("logprobs", "old_logprobs", "is_weights", "entropy"):
        return True
    if name == "advantages":
        return True
    if name == "rewards":
        return batch.advantages is None or bool(loss_fn.readers("rewards"))
    return bool(loss_fn.readers(name))


def run(case: Case, path: str, reference: bool):
    """``(LossOutput, {field: grad of its leaf}, state before, state after)`` or the exception raised."""
    loss_fn = OBJECTIVES[case.name].compile()
    batch, leaves = case.batch(reference)
    before = loss_fn.state_dict()
    try:
        if path == "single":
            out = loss_fn(batch)
        else:
            out = loss_fn(batch, step=loss_fn.gather([batch]))
        out.loss.backward()
    except (BatchError, FloatingPointError) as err:
        return err, before, loss_fn.state_dict()
    grads = {name: leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for name, leaf in leaves.items()}
    return (out, grads), before, loss_fn.state_dict()


TOLERANCE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1e-5, 1e-6), torch.float64: (1e-5, 1e-6)}


def check(case: Case, path: str) -> None:
    expected, _, _ = run(case, path, reference=True)
    got, before, after = run(case, path, reference=False)
    where = f"{case.name} ({path}, {case.placement} {case.target} {case.index})"
    if isinstance(expected, BatchError):
        assert isinstance(got, BatchError) and str(got) == str(expected), f"{where}: {got!r} vs reference {expected!r}"
        event("BatchError, as the reference")  # for --hypothesis-show-statistics
        return
    assert not isinstance(expected, Exception), f"{where}: the reference batch raised {expected!r}"
    ref_out, ref_grads = expected
    assert torch.isfinite(ref_out.loss), where
    batch, _ = case.batch(reference=False)
    loss_fn = OBJECTIVES[case.name].compile()
    if case.placement == "valid" and checked_by(loss_fn, batch, case.target):
        finite = math.isfinite(float(case.injected[case.target][case.index]))
        expected_error = BatchError if finite else FloatingPointError
        assert isinstance(got, expected_error), f"{where}: expected a {expected_error.__name__}, got {got!r}"
        assert f"TokenBatch.{case.target}" in str(got), f"{where}: {got}"
        assert finite == ("passed as" in str(got)), f"{where}: {got}"  # the likely mistake, for a value beyond limits
        assert after == before, f"{where}: the state moved although the step raised"
        event(f"{expected_error.__name__} naming the field")
        return
    assert not isinstance(got, Exception), f"{where}: {got!r}"
    out, grads = got
    assert torch.isfinite(out.loss), f"{where}: loss {out.loss}"
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-5, atol=1e-6, msg=lambda m: f"{where} loss: {m}")
    assert grads.keys() == ref_grads.keys(), where
    for name, grad in grads.items():
        dtype = case.values[name].dtype
        expected_grad = ref_grads[name].to(dtype)  # the loss casts its float32 gradient to the field's dtype
        if grad.shape != expected_grad.shape:  # an expanded [1, T] leaf: autograd sums the rows, in that dtype
            expected_grad = expected_grad.sum(0, keepdim=True)
        rtol, atol = TOLERANCE[dtype]
        torch.testing.assert_close(
            grad.float(), expected_grad.float(), rtol=rtol, atol=atol, msg=lambda m, name=name: f"{where} gradient of {name}: {m}"
        )
    assert out.metrics == pytest.approx(ref_out.metrics, rel=1e-5, abs=1e-6, nan_ok=True), where
    assert all(math.isfinite(v) for k, v in out.metrics.items() if not k.endswith("H_bar")), (where, out.metrics)
    event("the reference result, " + {"none": "all finite", "padding": "offending padding", "valid": "offending unread field"}[case.placement])


@pytest.mark.parametrize("name", PRESETS)
@fuzz_settings(EXAMPLES)
@given(data=st.data())
def test_odd_batches_give_the_reference_result_or_a_clear_error(name, data):
    case = data.draw(cases(name))
    check(case, "single")
    check(case, "gather")
