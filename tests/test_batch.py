"""TokenBatch validation, and the loss's checks of the inputs it reads."""

from __future__ import annotations

import math
import re

import pytest
import torch

import rlstab
from rlstab import BatchError, LossOutput, TokenBatch

from batches import with_trainer_fields

B, T = 3, 5
NAN = float("nan")


def mask() -> torch.Tensor:
    return torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)


def fields(**override) -> dict:
    g = torch.Generator().manual_seed(0)
    base = dict(
        logprobs=-torch.rand(B, T, generator=g) * 3,
        response_mask=mask(),
        old_logprobs=-torch.rand(B, T, generator=g) * 3,
        advantages=torch.tensor([1.0, -0.5, 0.25]),
        entropy=torch.rand(B, T, generator=g) * 2,
    )
    # the inference engine's log-probs, near the trainer's old ones (own stream: the rest keeps its values)
    noise = torch.Generator().manual_seed(1)
    base["rollout_logprobs"] = base["old_logprobs"] + 0.05 * torch.randn(B, T, generator=noise)
    base.update(override)
    return base


def loss(name: str, **override) -> tuple[LossOutput, torch.Tensor]:
    objective = rlstab.load(name)
    f = with_trainer_fields(objective, fields(**override))
    if f.get("entropy") is not None:  # with gradient, as a trainer computes it from the logits (an entropy bonus needs it)
        f["entropy"] = f["entropy"].detach().clone().requires_grad_(True)
    lp = f.pop("logprobs").detach().clone().requires_grad_(True)
    out = objective.compile()(TokenBatch(logprobs=lp, **f))
    assert isinstance(out, LossOutput)
    out.loss.backward()
    return out, lp.grad


# ----------------------------------------------------------------------------- construction


def test_valid_batch():
    b = TokenBatch(**fields())
    assert b.shape == (B, T)
    assert b.has("entropy") and not b.has("rewards")
    assert b.response_mask.dtype == torch.bool


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("response_mask", torch.ones(B, T + 1, dtype=torch.bool), "[3, 5]"),
        ("response_mask", torch.ones(B, dtype=torch.bool), "[3, 5]"),
        ("old_logprobs", torch.zeros(B, T - 1), "[3, 5]"),
        ("old_logprobs", torch.zeros(T, B), "[3, 5]"),
        ("entropy", torch.zeros(B + 1, T), "[3, 5]"),
        ("rollout_logprobs", torch.zeros(B, 1), "[3, 5]"),
        ("ref_logprobs", torch.zeros(B, T, 1), "[3, 5]"),
        ("advantages", torch.zeros(B + 1), "[B] or [B, T]"),
        ("advantages", torch.zeros(B, T + 2), "[B] or [B, T]"),
        ("rewards", torch.zeros(B, T), "[3]"),
        ("group_ids", torch.zeros(B + 1, dtype=torch.long), "[3]"),
    ],
)
def test_wrong_shape_names_field_and_expected_shape(name, value, expected):
    with pytest.raises(BatchError) as info:
        TokenBatch(**fields(**{name: value}))
    message = str(info.value)
    assert f"TokenBatch.{name}" in message
    assert expected in message
    assert str(list(value.shape)) in message  # what it got


@pytest.mark.parametrize("shape", [(B * T,), (1, B, T), ()])
def test_logprobs_must_be_2d(shape):
    with pytest.raises(BatchError, match=r"TokenBatch\.logprobs must be \[B, T\]"):
        TokenBatch(logprobs=torch.zeros(shape), response_mask=torch.ones(B, T, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_non_float_logprobs(dtype):
    with pytest.raises(BatchError) as info:
        TokenBatch(logprobs=torch.zeros(B, T, dtype=dtype), response_mask=mask())
    assert "TokenBatch.logprobs" in str(info.value)
    assert "floating point" in str(info.value)
    assert str(dtype) in str(info.value)


@pytest.mark.parametrize("name", ["old_logprobs", "entropy", "ref_logprobs", "rollout_logprobs"])
def test_non_float_token_fields(name):
    with pytest.raises(BatchError, match=rf"TokenBatch\.{name} must be floating point"):
        TokenBatch(**fields(**{name: torch.zeros(B, T, dtype=torch.long)}))


def test_non_float_advantages():
    with pytest.raises(BatchError, match=r"TokenBatch\.advantages must be floating point"):
        TokenBatch(**fields(advantages=torch.tensor([1, 0, -1])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_float_or_bool_group_ids_refused(dtype):
    with pytest.raises(BatchError) as info:
        TokenBatch(**fields(advantages=None, rewards=torch.ones(B), group_ids=torch.zeros(B, dtype=dtype)))
    assert "TokenBatch.group_ids" in str(info.value)
    assert "integer" in str(info.value)


def test_integer_rewards_become_float():
    b = TokenBatch(
        **fields(advantages=None, rewards=torch.tensor([1, 0, 1]), group_ids=torch.tensor([0, 0, 1]))
    )
    assert b.rewards.is_floating_point()
    assert b.rewards.tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("name", ["entropy", "response_mask", "advantages"])
def test_non_tensor_field(name):
    with pytest.raises(BatchError) as info:
        TokenBatch(**fields(**{name: [[0.0] * T] * B}))
    assert f"TokenBatch.{name} must be a torch.Tensor" in str(info.value)
    assert "list" in str(info.value)


def test_logprobs_not_a_tensor():
    with pytest.raises(BatchError, match=r"TokenBatch\.logprobs must be a torch\.Tensor"):
        TokenBatch(logprobs=[[0.0]], response_mask=torch.ones(1, 1, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float32, torch.float64])
def test_numeric_response_mask_becomes_bool(dtype):
    numeric = mask().to(dtype)
    b = TokenBatch(**fields(response_mask=numeric))
    assert b.response_mask.dtype == torch.bool
    assert torch.equal(b.response_mask, mask())
    out_numeric, grad_numeric = loss("stapo", response_mask=numeric)
    out_bool, grad_bool = loss("stapo")
    assert out_numeric.loss.item() == out_bool.loss.item()
    assert torch.equal(grad_numeric, grad_bool)
    assert out_numeric.metrics["tokens/valid"] == mask().sum().item()


@pytest.mark.parametrize(
    ("value", "dtype", "shown"),
    [
        (0.5, torch.float32, "0.5"),
        (-1.0, torch.float32, "-1.0"),
        (NAN, torch.float32, "nan"),
        (float("inf"), torch.float64, "inf"),
        (2, torch.int64, "2"),
        (-1, torch.int32, "-1"),
        (255, torch.uint8, "255"),
    ],
)
def test_response_mask_values_other_than_0_and_1_are_refused(value, dtype, shown):
    """A 0.5 or a NaN used to count as valid (``mask != 0``); now the field, the first index and the value are named."""
    numeric = mask().to(dtype)
    numeric[1, 3] = value
    numeric[2, 4] = value  # a second one: only the first is shown, with the count
    with pytest.raises(BatchError) as info:
        TokenBatch(**fields(response_mask=numeric))
    assert str(info.value) == (
        f"TokenBatch.response_mask must hold only 0 and 1 (or be bool): 2 value(s) are neither, "
        f"the first at index [1, 3]: {shown}"
    )


def test_negative_zero_is_a_zero():
    numeric = mask().to(torch.float32)
    numeric[~mask()] = -0.0
    assert torch.equal(TokenBatch(**fields(response_mask=numeric)).response_mask, mask())


# ----------------------------------------------------------------------------- non-finite inputs


def _with(name: str, index, value, base=None) -> torch.Tensor:
    t = (fields()[name] if base is None else base).clone()
    t[index] = value
    return t


@pytest.mark.parametrize(
    "name, index",
    [
        ("logprobs", (0, 1)),
        ("old_logprobs", (1, 4)),
        ("advantages", (2,)),
        ("entropy", (2, 0)),
    ],
)
@pytest.mark.parametrize("bad", [NAN, float("inf"), float("-inf")])
def test_non_finite_on_valid_token_raises_naming_field(name, index, bad):
    f = fields(**{name: _with(name, index, bad)})
    fn = rlstab.load("stapo").compile()
    with pytest.raises(FloatingPointError) as info:
        fn(TokenBatch(**f))
    message = str(info.value)
    assert f"TokenBatch.{name}" in message
    assert str(list(index)) in message


def test_nan_in_per_token_advantages_on_valid_token():
    adv = torch.ones(B, T)
    adv[1, 3] = NAN
    with pytest.raises(FloatingPointError, match=r"TokenBatch\.advantages.*\[1, 3\]"):
        rlstab.load("grpo").compile()(TokenBatch(**fields(advantages=adv)))


def test_nan_reward_of_valid_response_raises():
    f = fields(advantages=None, rewards=torch.tensor([1.0, NAN, 0.0]), group_ids=torch.tensor([0, 0, 0]))
    with pytest.raises(FloatingPointError, match=r"TokenBatch\.rewards"):
        rlstab.load("grpo").compile()(TokenBatch(**f))


def test_nan_on_valid_token_raises_with_gradient_too():
    f = fields(logprobs=_with("logprobs", (0, 0), NAN).requires_grad_(True))
    with pytest.raises(FloatingPointError, match=r"TokenBatch\.logprobs"):
        rlstab.load("dapo").compile()(TokenBatch(**f))


@pytest.mark.parametrize("name", ["logprobs", "old_logprobs", "entropy"])
@pytest.mark.parametrize("preset", ["stapo", "20-entropy", "grpo"])
def test_nan_only_on_padding_is_ignored(name, preset):
    m = mask()
    clean_out, clean_grad = loss(preset)
    dirty = fields()[name].clone()
    dirty[~m] = NAN
    dirty[0, 3] = float("inf")
    dirty[2, 4] = float("-inf")
    out, grad = loss(preset, **{name: dirty})
    assert torch.isfinite(out.loss)
    assert out.loss.item() == pytest.approx(clean_out.loss.item(), abs=1e-6)
    assert torch.allclose(grad, clean_grad, atol=1e-6)
    assert torch.all(grad[~m] == 0)


@pytest.mark.parametrize("name", ["logprobs", "old_logprobs", "entropy", "rollout_logprobs"])
@pytest.mark.parametrize("preset", rlstab.preset_names())
def test_nan_only_on_padding_leaves_metrics_finite(name, preset):
    dirty = fields()[name].clone()
    dirty[~mask()] = NAN
    out, _ = loss(preset, **{name: dirty})
    clean, _ = loss(preset)
    bad = {k: v for k, v in out.metrics.items() if v != v}
    assert not bad, f"metrics poisoned by NaN on padding of TokenBatch.{name}: {bad}"
    assert out.metrics == pytest.approx(clean.metrics, abs=1e-6)


def test_nan_advantages_only_on_padding_is_ignored():
    m = mask()
    clean_out, clean_grad = loss(
        "stapo", advantages=torch.tensor([[1.0], [-0.5], [0.25]]).expand(B, T).clone()
    )
    adv = torch.tensor([[1.0], [-0.5], [0.25]]).expand(B, T).clone()
    adv[~m] = NAN
    out, grad = loss("stapo", advantages=adv)
    assert out.loss.item() == pytest.approx(clean_out.loss.item(), abs=1e-6)
    assert torch.allclose(grad, clean_grad, atol=1e-6)


def test_nan_sequence_advantage_of_fully_padded_row_is_ignored():
    m = mask()
    m[1] = False
    clean_out, clean_grad = loss("dapo", response_mask=m)
    out, grad = loss("dapo", response_mask=m, advantages=torch.tensor([1.0, NAN, 0.25]))
    assert torch.isfinite(out.loss)
    assert out.loss.item() == pytest.approx(clean_out.loss.item(), abs=1e-6)
    assert torch.equal(grad[1], torch.zeros(T))


def test_nan_sequence_advantage_of_partly_valid_row_raises():
    with pytest.raises(FloatingPointError, match=r"TokenBatch\.advantages"):
        rlstab.load("dapo").compile()(TokenBatch(**fields(advantages=torch.tensor([1.0, 2.0, NAN]))))


def test_inputs_are_not_modified_by_padding_cleanup():
    lp = fields()["logprobs"].clone()
    lp[~mask()] = NAN
    before = lp.clone()
    rlstab.load("stapo").compile()(TokenBatch(**fields(logprobs=lp)))
    assert torch.equal(torch.isnan(lp), torch.isnan(before))


# ----------------------------------------------------------------------------- values a field cannot hold

# A preset (or objective) that reads each log-prob field; mask(): row 0 valid at 0..2, row 1 at 0..4, row 2 at 0.
READER = {
    "logprobs": "stapo", "old_logprobs": "stapo", "rollout_logprobs": "tis", "proxy_logprobs": "lp_reg",
    "ref_logprobs": {"extends": "grpo", "regularisers": [{"kind": "kl", "coef": 0.01}]},
}
# The ways a loss runs: checked on the host (a call that is its own step; gather then a frozen step), and the
# GPU's deferring path on CPU tensors (defer_checks: raised at the metrics' read).
PATHS = ["single", "gather", "deferred single", "deferred frozen step"]


def run_path(objective, batch: TokenBatch, path: str) -> dict:
    """The metrics of ``batch``'s loss on ``path`` (read: a deferred check raises here)."""
    fn = rlstab.load(objective).compile()
    fn.defer_checks = path.startswith("deferred")
    if path.endswith("single"):
        return dict(fn(batch).metrics)
    stats = (fn if path == "gather" else rlstab.load(objective).compile()).gather([batch])
    return dict(fn(batch, step=stats).metrics)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", sorted(READER))
def test_log_prob_above_zero_on_a_valid_token_names_the_field_the_worst_value_and_the_mistake(name, path):
    objective = READER[name]
    lp = fields()[name if name in fields() else "old_logprobs"].clone()  # ref and proxy log-probs: the old ones
    lp[0, 1] = 0.9  # a probability
    lp[1, 3] = 2.5  # a logit: the worst
    lp[2, 0] = 0.25  # within rounding (0.5): not counted
    lp[0, 4] = 40.0  # padding: ignored
    with pytest.raises(BatchError) as info:
        run_path(objective, TokenBatch(**with_trainer_fields(rlstab.load(objective), fields(**{name: lp}))), path)
    assert str(info.value) == (
        f"TokenBatch.{name} has 2 value(s) on valid tokens above 0.5, the largest 2.5 at index [1, 3]: a "
        "log-probability is at most 0 (0.5 allows for rounding). Logits or probabilities passed as log-probs?"
    )


@pytest.mark.parametrize("path", PATHS)
def test_negative_entropy_on_a_valid_token_names_the_worst_value_and_the_mistake(path):
    ent = fields()["entropy"].clone()
    ent[2, 0] = -1.25  # a log-prob: the worst
    ent[1, 1] = -0.75
    ent[1, 2] = -0.5  # at the limit (0.5 for rounding): accepted
    ent[0, 3] = -7.0  # padding: ignored
    with pytest.raises(BatchError) as info:
        run_path("stapo", TokenBatch(**fields(entropy=ent)), path)
    assert str(info.value) == (
        "TokenBatch.entropy has 2 value(s) on valid tokens below -0.5, the smallest -1.25 at index [2, 0]: an "
        "entropy is at least 0 (0.5 allows for rounding). Log-probs passed as entropy?"
    )


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("preset", ["stapo", "tis", "lp_reg"])
def test_log_probs_above_zero_and_negative_entropy_only_on_padding_change_nothing(preset, path):
    m = mask()
    clean = with_trainer_fields(rlstab.load(preset), fields())
    dirty = dict(clean)
    for name in ("logprobs", "old_logprobs", "rollout_logprobs", "proxy_logprobs"):
        if dirty.get(name) is not None:
            dirty[name] = torch.where(m, dirty[name], 17.0)  # logits on padding
    dirty["entropy"] = torch.where(m, dirty["entropy"], -3.0)
    assert run_path(preset, TokenBatch(**dirty), path) == run_path(preset, TokenBatch(**clean), path)


def test_values_within_rounding_of_their_limits_are_accepted():
    # At the limits exactly: log-probs 0.5, entropy -0.5 on valid tokens.
    lp, ent = fields()["logprobs"].clone(), fields()["entropy"].clone()
    lp[1, 4], ent[0, 0] = 0.5, -0.5
    for path in PATHS:
        assert math.isfinite(run_path("stapo", TokenBatch(**fields(logprobs=lp, entropy=ent)), path)["loss"])


def test_bfloat16_rounding_of_real_log_probs_and_entropies_is_accepted():
    # veRL's entropy_from_logits, logsumexp(x) - sum(softmax(x) * x), on bfloat16 logits [122, 124.5] (spacing 0.5 in
    # [64, 128)): softmax 0.0757, 0.9258; the products 9.2334 -> 9.25 and 115.2598 -> 115.5, whose sum 124.75 rounds
    # (to even) to 125; logsumexp 124.5789 -> 124.5. Entropy 124.5 - 125 = -0.5 where the exact one is 0.2685.
    x = torch.tensor([[122.0, 124.5]], dtype=torch.bfloat16)
    entropy = (torch.logsumexp(x, -1) - (torch.softmax(x, -1) * x).sum(-1)).float()
    assert entropy.item() == -0.5
    # A float32 target logit 124.7 (124.5 in bfloat16) minus that bfloat16 log-sum-exp: log-prob 124.7 - 124.5 = +0.2.
    mixed = torch.tensor(124.7) - torch.logsumexp(x, -1).float()
    assert mixed.item() == pytest.approx(0.2, abs=1e-5)
    ent, lp = fields()["entropy"].clone(), fields()["logprobs"].clone()
    ent[1, 2], lp[1, 3] = entropy, mixed
    lp[0, 0] = torch.log_softmax(x, -1)[0, 1].float()  # -0.0825: log_softmax in bfloat16 is never above 0
    for path in PATHS:
        assert math.isfinite(run_path("stapo", TokenBatch(**fields(logprobs=lp, entropy=ent)), path)["loss"])


def test_a_deferred_frozen_step_judges_the_values_without_a_host_read():
    # The GPU's path (on CPU tensors): the check rides on the metrics' one transfer (the extremes the finiteness
    # check reads already), so the call reads nothing; the error comes at the read.
    from rlstab.testing.syncs import host_syncs

    fn = rlstab.load("grpo").compile()
    fn.defer_checks = True
    stats = fn.gather([TokenBatch(**fields())])
    lp = fields()["logprobs"].clone()
    lp[1, 1] = 3.0
    batch = TokenBatch(**fields(logprobs=lp))
    with host_syncs() as syncs:
        out = fn(batch, step=stats)
    assert syncs == []
    with pytest.raises(BatchError, match=r"TokenBatch\.logprobs has 1 value\(s\) on valid tokens above 0\.5, the largest 3 "):
        dict(out.metrics)


def test_gather_raises_on_every_rank_for_a_log_prob_above_zero_on_another():
    from rlstab.comm import Comm
    from rlstab.compiler.offending_inputs import without_bad_padding_on_every_rank

    class Rank(Comm):
        """One process standing for a rank of two: its sum adds what the other rank sent."""

        def __init__(self, other=None):
            super().__init__(distributed=False)
            self.other, self.sent = other, None

        def sum(self, t):
            self.sent = t
            return t if self.other is None else t + self.other.sent

    lp = fields()["logprobs"].clone()
    lp[0, 2], lp[1, 0] = 1.0, 4.0
    offending, clean = TokenBatch(**fields(logprobs=lp)), TokenBatch(**fields())
    checked = lambda batch: ["logprobs", "old_logprobs", "advantages"]  # noqa: E731
    one = Rank()
    with pytest.raises(BatchError, match=r"the largest 4 at index \[1, 0\]"):
        without_bad_padding_on_every_rank([offending], checked, one)
    with pytest.raises(BatchError) as info:
        without_bad_padding_on_every_rank([clean], checked, Rank(other=one))
    assert str(info.value) == (
        "TokenBatch.logprobs has 2 value(s) on valid tokens above 0.5, on another rank: a log-probability is at most "
        "0 (0.5 allows for rounding). Logits or probabilities passed as log-probs?"
    )


def test_a_batch_on_the_meta_device_is_refused_in_one_line():
    meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in fields().items()}
    with pytest.raises(BatchError) as info:
        TokenBatch(**meta)
    assert str(info.value) == (
        "TokenBatch.logprobs is on the meta device, which holds shapes but no values: build the batch from tensors "
        "with values (on the CPU or a GPU)"
    )


@pytest.mark.parametrize("method", ["gather", "begin_training_batch"])
def test_one_batch_where_a_list_is_expected_says_to_pass_a_list(method):
    fn = rlstab.load("stare").compile()  # STARE moves once per training batch: begin_training_batch reads its batches
    with pytest.raises(BatchError) as info:
        getattr(fn, method)(TokenBatch(**fields()))
    assert str(info.value) == f"{method} takes a list of the step's micro-batches, got one TokenBatch: pass [batch]"
    with pytest.raises(BatchError, match=f"^{method} takes a list of the step's micro-batches \\(TokenBatch\\), got int$"):
        getattr(fn, method)(3)
    getattr(fn, method)([TokenBatch(**fields())])  # a list is fine


# ----------------------------------------------------------------------------- fields an objective needs


@pytest.mark.parametrize(
    "preset, who",
    [
        ("stapo", "masks[0] (s2t)"),
        ("stapo-high-entropy", "masks[0] (s2t)"),
        ("20-entropy", "masks[0] (entropy_quantile)"),
    ],
)
def test_missing_entropy_names_component_and_field(preset, who):
    fn = rlstab.load(preset).compile()
    with pytest.raises(BatchError) as info:
        fn(TokenBatch(**fields(entropy=None)))
    message = str(info.value)
    assert who in message
    assert "TokenBatch.entropy" in message


def test_objectives_that_do_not_read_entropy_work_without_it():
    for preset in ("grpo", "dapo", "stapo-probability-only"):
        out, _ = loss(preset, entropy=None)
        assert torch.isfinite(out.loss)


def test_missing_ref_logprobs_names_regulariser():
    fn = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "kl", "coef": 0.1}]}).compile()
    with pytest.raises(BatchError) as info:
        fn(TokenBatch(**fields()))
    assert "regularisers[0] (kl)" in str(info.value)
    assert "TokenBatch.ref_logprobs" in str(info.value)


@pytest.mark.parametrize(
    "present, missing",
    [
        ({}, "group_ids"),
        ({"rewards": torch.ones(B)}, "group_ids"),
        ({"group_ids": torch.tensor([0, 0, 1])}, "rewards"),
    ],
)
def test_missing_rewards_or_group_ids_names_estimator_and_field(present, missing):
    fn = rlstab.load("grpo").compile()
    with pytest.raises(BatchError) as info:
        fn(TokenBatch(**fields(advantages=None, **present)))
    message = str(info.value)
    assert "advantage (grpo)" in message
    assert f"TokenBatch.{missing}" in message


def test_given_advantage_requires_advantages():
    fn = rlstab.load({"extends": "grpo", "advantage": {"kind": "given"}}).compile()
    with pytest.raises(BatchError, match=re.escape("advantage (given)")):
        fn(TokenBatch(**fields(advantages=None, rewards=torch.ones(B), group_ids=torch.tensor([0, 0, 1]))))


def test_rewards_and_group_ids_suffice_without_advantages():
    f = fields(advantages=None, rewards=torch.tensor([1.0, 0.0, 1.0]), group_ids=torch.tensor([7, 7, 7]))
    lp = f.pop("logprobs").requires_grad_(True)
    out = rlstab.load("stapo").compile()(TokenBatch(logprobs=lp, **f))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    # group mean 2/3, unbiased std sqrt(1/3): A = (R - 2/3) / sqrt(1/3) for each response
    token_adv = torch.tensor([1 / 3, -2 / 3, 1 / 3]) / (1 / 3) ** 0.5
    valid = mask().float()
    assert out.metrics["advantage/mean"] == pytest.approx(
        float((token_adv[:, None] * valid).sum() / valid.sum()), rel=1e-5
    )


def test_not_a_token_batch():
    with pytest.raises(BatchError, match="TokenBatch"):
        rlstab.load("grpo").compile()(fields())


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_gradient_has_the_dtype_of_logprobs(dtype):
    f = fields()
    lp = f.pop("logprobs").to(dtype).requires_grad_(True)
    out = rlstab.load("stapo").compile()(TokenBatch(logprobs=lp, **f))
    assert out.loss.dtype == torch.float32
    out.loss.backward()
    assert lp.grad.dtype == dtype
    assert torch.all(torch.isfinite(lp.grad))


@pytest.mark.parametrize("name", ["logprobs", "old_logprobs", "entropy", "advantages"])
@pytest.mark.parametrize("value", [1e300, -1e300, 1e38])
def test_float64_padding_beyond_float32_range_is_ignored(name, value):
    """Finite float64 padding that does not fit float32 (or whose float32 sum would overflow)."""
    m = mask()
    f64 = {k: fields()[k].to(torch.float64) for k in ("logprobs", "old_logprobs", "entropy")}
    f64["advantages"] = torch.tensor([[1.0], [-0.5], [0.25]], dtype=torch.float64).expand(B, T).clone()
    clean_out, clean_grad = loss("stapo", **f64)
    dirty = f64[name].clone()
    dirty[~m] = value
    out, grad = loss("stapo", **{**f64, name: dirty})
    assert out.loss.item() == pytest.approx(clean_out.loss.item(), abs=1e-6)
    assert torch.allclose(grad, clean_grad, atol=1e-6)
    assert torch.all(grad[~m] == 0)
