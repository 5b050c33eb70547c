"""Properties every preset's loss must have, on random batches (hypothesis).

- a mask that keeps every token changes nothing;
- padding (columns and rows, whatever values it holds) changes nothing;
- tokens a mask silences get exactly zero gradient;
- a batch with no valid token gives loss 0 and zero gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import rlstab
from rlstab import LossOutput, TokenBatch

from batches import draw_response_mask, with_trainer_fields


# Per-preset tests run max_examples examples for each preset. Masks with a step quantile cost tens
# of milliseconds per call on CPU, hence the modest counts. database=None: nothing is written.
def SETTINGS(max_examples: int = 40, **kw):
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
        **kw,
    )


PRESETS = rlstab.preset_names()
OBJECTIVES = {name: rlstab.load(name) for name in PRESETS}
COMPILED = {name: o.compile() for name, o in OBJECTIVES.items()}
MASKED_PRESETS = [name for name in PRESETS if OBJECTIVES[name].masks]
# The policy term alone: a regulariser on every valid token (tokens: valid) trains silenced tokens by design.
POLICY_COMPILED = {
    name: OBJECTIVES[name].model_copy(
        update={"regularisers": [r for r in OBJECTIVES[name].regularisers if r.tokens == "kept"]}).compile()
    for name in MASKED_PRESETS
}
assert {"stapo", "20-entropy", "stapo-high-entropy", "stapo-probability-only"} <= set(MASKED_PRESETS)

NAN, INF = float("nan"), float("inf")


# ----------------------------------------------------------------------------- batches


@dataclass
class Spec:
    """The tensors of a random batch (logprobs without gradient)."""

    logprobs: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    entropy: torch.Tensor
    rollout_logprobs: torch.Tensor | None = None

    def tensors(self) -> dict:
        return dict(
            logprobs=self.logprobs,
            response_mask=self.response_mask,
            old_logprobs=self.old_logprobs,
            advantages=self.advantages,
            entropy=self.entropy,
            rollout_logprobs=self.rollout_logprobs,
        )


@st.composite
def specs(draw) -> Spec:
    B = draw(st.integers(1, 6))
    T = draw(st.integers(1, 12))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    response_mask = draw_response_mask(draw, B, T)

    # logprobs <= 0, often below log(0.002) = -6.2 so that the probability masks fire
    low = draw(st.sampled_from([2.0, 12.0, 20.0]))
    logprobs = -torch.rand(B, T, generator=g) * low
    old_kind = draw(st.sampled_from(["none", "near", "independent"]))
    if old_kind == "none":
        old = None
    elif old_kind == "near":
        old = (logprobs + (torch.rand(B, T, generator=g) - 0.5) * 2).clamp(max=0.0)
    else:
        old = -torch.rand(B, T, generator=g) * low

    adv_kind = draw(st.sampled_from(["sequence", "token"]))
    adv_shape = (B,) if adv_kind == "sequence" else (B, T)
    if draw(st.booleans()):
        advantages = (torch.rand(adv_shape, generator=g) - 0.5) * 6
    else:  # exact zeros, and ties
        advantages = torch.randint(-1, 2, adv_shape, generator=g).to(torch.float32)

    if draw(st.booleans()):
        entropy = torch.rand(B, T, generator=g) * 3
    else:  # ties at the quantile threshold
        entropy = torch.randint(0, 4, (B, T), generator=g).to(torch.float32) * 0.5
    # The inference engine's log-probs of the same tokens: close to the trainer's old ones, with a
    # few far off so that IcePop and rejection masks fire.
    base = logprobs if old is None else old
    far = torch.rand(B, T, generator=g) < draw(st.sampled_from([0.0, 0.2]))
    rollout = base + (torch.rand(B, T, generator=g) - 0.5) * 0.02 + far * (torch.rand(B, T, generator=g) - 0.5) * 8
    rollout = rollout.clamp(max=0.0)
    return Spec(logprobs, response_mask, old, advantages, entropy, rollout)


def run(fn, tensors: dict) -> tuple[LossOutput, torch.Tensor]:
    """Loss and gradient with respect to logprobs.

    The entropy comes with gradient, as a trainer computes it from the logits (an entropy bonus
    needs it; masks read it detached), like ``batches.random_batch``.
    """
    tensors = with_trainer_fields(fn.objective, tensors)
    if tensors.get("entropy") is not None:
        tensors["entropy"] = tensors["entropy"].detach().clone().requires_grad_(True)
    lp = tensors.pop("logprobs").detach().clone().requires_grad_(True)
    out = fn(TokenBatch(logprobs=lp, **tensors))
    assert isinstance(out, LossOutput), f"the loss returned {out!r} instead of a LossOutput"
    out.loss.backward()
    assert lp.grad is not None
    return out, lp.grad


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=lambda m: f"{what}: {m}")


def assert_same_state(a: dict, b: dict, what: str) -> None:
    """Two ``state_dict()``s of stateful components (numbers, None), equal up to float32 rounding."""
    assert a.keys() == b.keys(), what
    for key in a:
        assert a[key].keys() == b[key].keys(), (what, key)
        for field, value in a[key].items():
            other = b[key][field]
            if isinstance(value, float) and isinstance(other, float):
                assert value == pytest.approx(other, rel=1e-6, abs=1e-9), (what, key, field, value, other)
            else:  # None (nothing measured yet), bools, step counts: exactly
                assert value == other, (what, key, field, value, other)


# ----------------------------------------------------------------------------- keep-all mask

KEEP_ALL = [
    {"kind": "entropy_quantile", "rho": 1.0, "side": "top"},
    {"kind": "low_probability", "tau_p": 1e-30},
    {"kind": "s2t", "tau_p": 1e-30},
]


def with_extra_mask(objective: rlstab.Objective, extra: dict) -> rlstab.Objective:
    data = objective.model_dump(mode="json")
    data["masks"] = data["masks"] + [extra]
    return rlstab.load(data)


def mask_labels(objective: rlstab.Objective) -> list[str]:
    kinds = [m.kind for m in objective.masks]
    return [k if kinds.count(k) == 1 else f"{k}_{i}" for i, k in enumerate(kinds)]


WITH_KEEP_ALL = {
    (name, i): with_extra_mask(OBJECTIVES[name], extra).compile()
    for name in PRESETS
    for i, extra in enumerate(KEEP_ALL)
}


@pytest.mark.parametrize("name", PRESETS)
@SETTINGS(10)
@given(spec=specs(), i=st.integers(0, len(KEEP_ALL) - 1))
def test_keep_all_mask_changes_nothing(name, spec, i):
    fn = WITH_KEEP_ALL[(name, i)]
    fn.load_state_dict(COMPILED[name].state_dict())  # both as the same step of a stateful objective
    base_out, base_grad = run(COMPILED[name], spec.tensors())
    n_valid = base_out.metrics["tokens/valid"]  # response tokens not rejected as padding
    out, grad = run(fn, spec.tensors())
    assert_same_state(fn.state_dict(), COMPILED[name].state_dict(), f"{name} + {KEEP_ALL[i]}")
    label = mask_labels(fn.objective)[-1]
    # the extra mask really keeps every valid token
    assert out.metrics[f"mask/{label}/silenced"] == 0, (name, label)
    assert out.metrics[f"mask/{label}/kept"] == n_valid, (name, label)
    assert out.metrics["tokens/kept"] == base_out.metrics["tokens/kept"]
    assert_close(out.loss, base_out.loss, f"{name} + {KEEP_ALL[i]} loss")
    assert_close(grad, base_grad, f"{name} + {KEEP_ALL[i]} gradient")


# ----------------------------------------------------------------------------- padding

# dr_grpo divides by the padded response length (norm: max_length, by design), so extra padded
# columns rescale it; it is checked with a constant norm here and its own rule below.
PADDING_OBJECTIVES = {
    name: (
        rlstab.load({"extends": name, "aggregation": {"norm": 16}}).compile()
        if OBJECTIVES[name].aggregation.model_dump().get("norm") == "max_length"
        else COMPILED[name]
    )
    for name in PRESETS
}

ODD_VALUES = [NAN, INF, -INF, 0.0, -7.0, 3.0, 1e6, -1e6, -1e-30]
HUGE_VALUES = [1e38, -1e38, 3e38, -3e38]


def pad(spec: Spec, cols: int, rows: int, fills: list[float], seed: int) -> dict:
    """``spec`` with ``cols`` padded columns and ``rows`` fully padded rows holding ``fills``."""
    B, T = spec.response_mask.shape
    g = torch.Generator().manual_seed(seed)
    fill_values = torch.tensor(fills, dtype=torch.float32)

    def grow(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        shape = (B + rows,) if t.dim() == 1 else (B + rows, T + cols)
        out = fill_values[torch.randint(len(fills), shape, generator=g)]
        if t.dim() == 1:
            out[:B] = t
        else:
            out[:B, :T] = t
        return out

    mask = torch.zeros(B + rows, T + cols, dtype=torch.bool)
    mask[:B, :T] = spec.response_mask
    return dict(
        logprobs=grow(spec.logprobs),
        response_mask=mask,
        old_logprobs=grow(spec.old_logprobs),
        advantages=grow(spec.advantages),
        entropy=grow(spec.entropy),
        rollout_logprobs=grow(spec.rollout_logprobs),
    )


def check_padding(name: str, spec: Spec, cols: int, rows: int, fills: list[float], seed: int) -> None:
    B, T = spec.response_mask.shape
    padded = pad(spec, cols, rows, fills, seed)
    fn = PADDING_OBJECTIVES[name]
    # Each call is an optimizer step and moves a stateful objective (skywork_entropy's controller, BAPO's
    # bounds): the padded batch runs as the same step, from the same state, and must move it the same way.
    before = fn.state_dict()
    out, grad = run(fn, spec.tensors())
    after = fn.state_dict()
    fn.load_state_dict(before)
    pout, pgrad = run(fn, padded)
    assert_same_state(fn.state_dict(), after, name)
    assert torch.isfinite(pout.loss), name
    assert_close(pout.loss, out.loss, f"{name} loss")
    assert_close(pgrad[:B, :T], grad, f"{name} gradient")
    assert torch.all(pgrad[:B, T:] == 0), f"{name}: gradient on padded columns {pgrad[:B, T:]}"
    assert torch.all(pgrad[B:] == 0), f"{name}: gradient on padded rows {pgrad[B:]}"
    assert torch.all(pgrad[~padded["response_mask"]] == 0), name
    for key in ("tokens/valid", "tokens/kept"):
        assert pout.metrics[key] == out.metrics[key], (name, key)


@pytest.mark.parametrize("name", PRESETS)
@SETTINGS(10)
@given(
    spec=specs(),
    cols=st.integers(0, 4),
    rows=st.integers(0, 3),
    fills=st.lists(st.sampled_from(ODD_VALUES), min_size=1, max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_padding_never_changes_the_loss(name, spec, cols, rows, fills, seed):
    check_padding(name, spec, cols, rows, fills, seed)


@pytest.mark.parametrize("name", PRESETS)
@SETTINGS(5, phases=[Phase.explicit, Phase.generate])  # no shrinking: see the minimal example below
@given(
    spec=specs(),
    cols=st.integers(1, 4),
    rows=st.integers(0, 3),
    fills=st.lists(st.sampled_from(HUGE_VALUES), min_size=1, max_size=2),
    seed=st.integers(0, 2**31 - 1),
)
def test_huge_finite_padding_never_changes_the_loss(name, spec, cols, rows, fills, seed):
    # finite values whose float32 sum overflows to inf
    check_padding(name, spec, cols, rows, fills, seed)


def test_huge_finite_padding_example():
    """A minimal case of the property above: two finite padded advantages of 3e38 (sum: inf in float32)."""
    spec = Spec(
        logprobs=torch.tensor([[-1.0, -1.0, -1.0, -1.0]]),
        response_mask=torch.tensor([[True, True, False, False]]),
        old_logprobs=torch.tensor([[-1.1, -0.9, -1.0, -1.0]]),
        advantages=torch.tensor([[1.0, -1.0, 3e38, 3e38]]),
        entropy=torch.ones(1, 4),
    )
    out = COMPILED["dapo"](TokenBatch(**spec.tensors()))
    assert isinstance(out, LossOutput), f"the loss returned {out!r} instead of a LossOutput"
    assert torch.isfinite(out.loss)


@SETTINGS(30)
@given(spec=specs(), cols=st.integers(1, 4))
def test_dr_grpo_max_length_scales_with_padded_length(spec, cols):
    """dr_grpo's documented denominator is the padded response length: L(T + c) * (T + c) == L(T) * T."""
    B, T = spec.response_mask.shape
    fn = COMPILED["dr_grpo"]
    out, grad = run(fn, spec.tensors())
    pout, pgrad = run(fn, pad(spec, cols, 0, [0.0], 0))
    assert_close(pout.loss * (T + cols), out.loss * T, "dr_grpo loss")
    assert_close(pgrad[:, :T] * (T + cols), grad * T, "dr_grpo gradient")


# ----------------------------------------------------------------------------- silenced tokens


def silenced_by(mask, spec: Spec, threshold: float | None) -> torch.Tensor:
    """Tokens ``mask`` silences, recomputed from its documented rule (bool [B, T], valid or not)."""
    B, T = spec.response_mask.shape
    adv = spec.advantages if spec.advantages.dim() == 2 else spec.advantages[:, None].expand(B, T)
    H = spec.entropy
    if mask.kind in ("s2t", "low_probability"):
        source = (
            spec.logprobs if mask.prob_source == "current" or spec.old_logprobs is None else spec.old_logprobs
        )
        candidate = (adv > 0) & (source < math.log(mask.tau_p))
        if mask.kind == "low_probability":
            return candidate
        if threshold is None:
            return torch.zeros(B, T, dtype=torch.bool)
        return candidate & ((H < threshold) if mask.entropy_side == "low" else (H >= threshold))
    if mask.kind == "entropy_quantile":
        if threshold is None:
            return torch.zeros(B, T, dtype=torch.bool)
        return (H < threshold) if mask.side == "top" else (H >= threshold)
    old = spec.logprobs if spec.old_logprobs is None else spec.old_logprobs
    if mask.kind == "lopti":
        return (old >= math.log(mask.eta)) if mask.phase == "low" else (old < math.log(mask.eta))
    if mask.kind == "off_policy_sequence":
        # DeepSeek-V3.2 eq. 9: A < 0 and the response's mean log(pi_sampling / pi_theta) over its own tokens > delta
        sampling = spec.rollout_logprobs if mask.behaviour == "rollout" else old
        gap = torch.where(spec.response_mask, sampling - spec.logprobs, 0.0)
        mean = gap.sum(-1, keepdim=True) / spec.response_mask.sum(-1, keepdim=True).clamp(min=1)
        return (mean > mask.threshold) & (adv < 0)
    if mask.kind == "gtpo_entropy_filter":  # GTPO: a response whose mean token entropy exceeds the bound
        mean = torch.where(spec.response_mask, H, 0.0).sum(-1, keepdim=True) / spec.response_mask.sum(-1, keepdim=True).clamp(min=1)
        return (mean > mask.bound).expand(B, T)
    # rollout masks: log r = clamp(log pi_train(old) - log pi_infer, -20, 20) on response tokens; bypass rejection
    # tests the current policy against the old one the same way
    log_r = torch.where(spec.response_mask, (old - spec.rollout_logprobs).clamp(-20, 20), 0.0)
    if mask.kind == "bypass_rejection":
        log_r = torch.where(spec.response_mask, (spec.logprobs - old).clamp(-20, 20), 0.0)
    if mask.kind == "icepop":
        k = log_r.exp()
        return (k < mask.low) | (k > mask.high)
    if mask.kind in ("rollout_rejection", "bypass_rejection"):
        if mask.divergence.startswith("binary_kl"):
            # D_B(a||b) = a ln(a/b) + (1-a) ln((1-a)/(1-b)) of the clamped probabilities, 0 on padding; in float64,
            # where 1 - 1e-8 is not 1
            eps = 1e-6 if mask.binary_kl_floor is None else mask.binary_kl_floor
            train = old.double().exp().clamp(eps, 1 - eps)
            infer = spec.rollout_logprobs.double().exp().clamp(eps, 1 - eps)

            def d_b(a, b):
                return a * (a / b).log() + (1 - a) * ((1 - a) / (1 - b)).log()
            stat = d_b(infer, train) if mask.divergence == "binary_kl_rollout" else torch.maximum(
                d_b(train, infer), d_b(infer, train))
            stat = torch.where(spec.response_mask, stat, 0.0)
        else:
            stat = {"k1": log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - 1 - log_r}[mask.divergence]
        if mask.divergence == "k1":
            low = math.log(1 / mask.high if mask.low is None else mask.low)

            def fails(x):
                return (x < low) | (x > math.log(mask.high))
        else:

            def fails(x):
                return x > mask.high
        if mask.level == "token":
            return fails(stat)
        if mask.level == "sequence_max":
            row = (fails(stat) & spec.response_mask).any(-1, keepdim=True)
        else:
            total = stat.sum(-1, keepdim=True)
            if mask.level == "sequence_mean":
                total = total / spec.response_mask.sum(-1, keepdim=True).clamp(min=1)
            row = fails(total)
        return row.expand(B, T)
    raise AssertionError(f"no reference rule for mask kind {mask.kind}")


def quantile_q(mask) -> float:
    if mask.kind == "s2t":
        return mask.entropy_quantile
    return 1.0 - mask.rho if mask.side == "top" else mask.rho


@pytest.mark.parametrize("name", MASKED_PRESETS)
@SETTINGS(20)
@given(spec=specs())
def test_silenced_tokens_get_zero_gradient(name, spec):
    response = spec.response_mask
    objective = OBJECTIVES[name]
    out, grad = run(POLICY_COMPILED[name], spec.tensors())
    # Rejections with `rejected: padding` turn tokens into padding first: what is valid for the other masks.
    valid = response.clone()
    for mask in objective.masks:
        if getattr(mask, "rejected", None) == "padding":
            valid &= ~silenced_by(mask, spec, None)
    silenced = torch.zeros_like(valid)
    for mask, label in zip(objective.masks, mask_labels(objective), strict=True):
        key = f"mask/{label}/entropy_threshold"
        threshold = out.metrics.get(key)
        if mask.kind in ("s2t", "entropy_quantile"):
            population = valid
            if mask.kind == "s2t" and mask.population == "positive":
                adv = spec.advantages if spec.advantages.dim() == 2 else spec.advantages[:, None]
                population = valid & (adv.expand_as(valid) > 0)
            if population.any():
                assert threshold is not None, f"{name}: no {key} metric"
                expected = torch.quantile(spec.entropy[population], quantile_q(mask))
                torch.testing.assert_close(torch.tensor(threshold), expected, msg=f"{name} {key}")
            else:
                assert threshold is None, f"{name}: {key} without a population"
        # rejections count over the response tokens before any rejection; other masks over valid ones
        by_mask = silenced_by(mask, spec, threshold) & (response if getattr(mask, "rejected", None) == "padding" else valid)
        assert out.metrics[f"mask/{label}/silenced"] == int(by_mask.sum()), (name, label)
        silenced |= by_mask
    assert torch.all(grad[silenced] == 0.0), f"{name}: gradient on silenced tokens {grad[silenced]}"
    assert torch.all(grad[~response] == 0.0), f"{name}: gradient on padding"
    assert out.metrics["tokens/kept"] == int((valid & ~silenced).sum()), name

    # kept tokens with a clear advantage and an unclipped ratio do get a gradient (GTPO's conflict weight is 0 on a
    # negative response's conflict tokens by design: its own tests check those weights)
    if any(r.kind == "gtpo_conflict" for r in objective.reweighters):
        return
    B, T = valid.shape
    adv = spec.advantages if spec.advantages.dim() == 2 else spec.advantages[:, None].expand(B, T)
    old = spec.logprobs if spec.old_logprobs is None else spec.old_logprobs
    log_ratio = (spec.logprobs - old).clamp(-objective.log_ratio_clamp, objective.log_ratio_clamp)
    r = torch.exp(log_ratio)
    s = objective.surrogate
    if hasattr(s, "eps_high"):
        upper, lower, dual = 1 + s.eps_high, 1 - s.eps_low, s.dual_clip or INF
    else:  # no ratio clip (REINFORCE, no clip): every kept token with an advantage trains
        upper, lower, dual = INF, -INF, INF
    margin = 1e-3
    active = ((adv > 1e-3) & (r < upper - margin)) | (
        (adv < -1e-3) & (r > lower + margin) & (r < dual - margin)
    )
    active &= log_ratio.abs() < objective.log_ratio_clamp - 1e-3
    trained = valid & ~silenced & active
    assert torch.all(grad[trained] != 0.0), f"{name}: kept tokens without gradient"


# ----------------------------------------------------------------------------- nothing valid


@SETTINGS(15)
@given(spec=specs(), use_rewards=st.booleans())
def test_all_masked_batch_gives_zero(spec, use_rewards):
    B, T = spec.response_mask.shape
    tensors = spec.tensors()
    tensors["response_mask"] = torch.zeros(B, T, dtype=torch.bool)
    if use_rewards:
        tensors["advantages"] = None
        g = torch.Generator().manual_seed(B * 100 + T)
        tensors["rewards"] = torch.randint(0, 2, (B,), generator=g).to(torch.float32)
        tensors["group_ids"] = torch.randint(0, 2, (B,), generator=g)
    for name in PRESETS:
        # A controller that has never seen a valid token has nothing to report (STARE's H_bar: NaN, documented in
        # rlstab/reweighters/stare.py), and a batch without valid tokens measures nothing: those metrics only,
        # and only while the state holds no measurement (COMPILED's state depends on the tests run before).
        unmeasured = {f for state in COMPILED[name].state_dict().values() for f, v in state.items() if v is None}
        out, grad = run(COMPILED[name], tensors)
        assert out.loss.item() == 0.0, name
        assert not torch.isnan(out.loss)
        assert torch.all(grad == 0.0), name
        assert out.metrics["loss"] == 0.0
        assert out.metrics["tokens/valid"] == 0 and out.metrics["tokens/kept"] == 0
        measured = {k: v for k, v in out.metrics.items() if k.rsplit("/", 1)[-1] not in unmeasured}
        assert all(math.isfinite(v) for v in measured.values()), (name, out.metrics)


@SETTINGS(8)
@given(spec=specs())
def test_all_masked_batch_with_non_finite_padding(spec):
    B, T = spec.response_mask.shape
    tensors = spec.tensors()
    tensors["response_mask"] = torch.zeros(B, T, dtype=torch.bool)
    tensors["logprobs"] = torch.full((B, T), NAN)
    tensors["entropy"] = torch.full((B, T), INF)
    for name in PRESETS:
        out, grad = run(COMPILED[name], tensors)
        assert out.loss.item() == 0.0, name
        assert torch.all(grad == 0.0), name
