"""The clip range, its dual-clip and delta rules, their checks and their text live once (rlstab/clipping/clip_range.py),
and the one clamp and its counts once (rlstab/clipping/bounded.py): PPO clip, GSPO, GPPO and BAPO use them."""

from typing import Literal

import pytest
import torch

import rlstab
from rlstab.clipping import BAPO, GPPO, GSPO, PPOClip
from rlstab.clipping.bounded import clamp_between, clip_counts
from rlstab.clipping.clip_range import ClipRange, DualClipped
from rlstab.tokens import Tokens

AGG = {"kind": "token-mean", "count": "valid"}


def test_the_four_clips_take_their_rules_from_the_base():
    assert all(issubclass(cls, ClipRange) for cls in (PPOClip, GSPO, GPPO))
    assert issubclass(BAPO, DualClipped) and not issubclass(BAPO, ClipRange)  # its bounds change every step
    for cls in (PPOClip, GSPO, GPPO, BAPO):
        # one model validator, the base's: none of them checks dual_clip (or delta) on its own
        assert set(cls.__pydantic_decorators__.model_validators) == {"_clip_rules"}, cls
        assert "describe" in vars(cls) and "dual_clip_text" not in vars(cls) and "clip_text" not in vars(cls)


def test_ratio_bounds_hand_computed():
    # (lower, upper for A > 0, cap for A < 0), eps_low 0.2, eps_high 0.28: 1 - 0.2 = 0.8, 1 + 0.28 = 1.28
    assert PPOClip(eps_high=0.28).ratio_bounds() == (0.8, 1.28, None)
    assert PPOClip(eps_high=0.28, dual_clip=3.0).ratio_bounds() == (0.8, 1.28, 3.0)
    # delta 1.1 < 1.28: A > 0 capped at min(1.28, 1.1) = 1.1, A < 0 at max(1.28, 1.1) = 1.28
    assert PPOClip(eps_high=0.28, delta=1.1).ratio_bounds() == (0.8, 1.1, 1.28)
    # delta 4 > 1.28: dual-clip at 4 (A > 0 keeps 1.28)
    assert PPOClip(eps_high=0.28, delta=4.0).ratio_bounds() == (0.8, 1.28, 4.0)
    # GSPO's paper ranges: 1 - 3e-4 = 0.9997, 1 + 4e-4 = 1.0004
    assert GSPO().ratio_bounds() == (0.9997, 1.0004, None)


@pytest.mark.parametrize(
    ("surrogate", "message"),
    [
        ({"kind": "ppo_clip", "eps_high": 0.28, "dual_clip": 1.28}, "dual_clip (1.28) must exceed 1 + eps_high (1.28)"),
        ({"kind": "gspo", "dual_clip": 1.0003}, "dual_clip (1.0003) must exceed 1 + eps_high (1.0004)"),
        ({"kind": "gppo", "dual_clip": 1.2}, "dual_clip (1.2) must exceed 1 + eps_high (1.28)"),  # GPPO: eps_high 0.28
        ({"kind": "bapo", "dual_clip": 3.0}, "dual_clip (3.0) must exceed upper_max (3.0)"),  # BAPO: upper_max 3
        ({"kind": "ppo_clip", "dual_clip": 3.0, "delta": 4.0}, "dual_clip (3.0) and delta (4.0) both bound"),
    ],
)
def test_one_rule_one_message_at_the_surrogate(surrogate, message):
    with pytest.raises(rlstab.ConfigError) as err:
        rlstab.load({"surrogate": surrogate, "aggregation": AGG})
    assert "surrogate = {" in str(err.value) and message in str(err.value)


def test_a_subclass_checks_its_ranges_before_the_dual_clip():
    # both wrong: BAPO's own range (lower_start 0.95 > lower_max 0.9) is named first, as before the base existed
    with pytest.raises(rlstab.ConfigError, match=r"lower_start \(0.95\) must not exceed lower_max \(0.9\)"):
        rlstab.load({"surrogate": {"kind": "bapo", "lower_start": 0.95, "dual_clip": 2.0}, "aggregation": AGG})


def test_describe_text_hand_computed():
    assert PPOClip(dual_clip=3.0).dual_clip_text() == "; for A < 0, l = min(l, -3 A) (dual-clip)"
    assert BAPO().dual_clip_text() == ""
    assert GSPO(eps_low=0.2, eps_high=0.28, dual_clip=10.0).clip_text("s_i") == (
        "l = max(-A s_i, -A clip(s_i, 0.8, 1.28)); for A < 0, l = min(l, -10 A) (dual-clip)"
    )
    assert PPOClip(eps_high=0.28, delta=1.1).clip_text() == (
        "l = max(-A min(r, 1.1), -A clip(r, 0.8, 1.28)) (two-sided clip, delta)"
    )


def test_a_clip_without_its_fields_is_refused_when_defined():
    with pytest.raises(TypeError, match="no field dual_clip"):

        class NoDual(ClipRange):
            kind: Literal["no_dual"] = "no_dual"
            eps_low: float = 0.2
            eps_high: float = 0.2

    with pytest.raises(TypeError, match="no field eps_high"):

        class NoHigh(ClipRange):
            kind: Literal["no_high"] = "no_high"
            eps_low: float = 0.2
            dual_clip: float | None = None


def test_clamp_between_hand_computed():
    x = torch.tensor([[0.5, 1.5, 5.0]]).expand(3, 3)
    adv = torch.tensor([[1.0], [-1.0], [0.0]])
    clamped = clamp_between(x, adv, 0.8, 1.28, 3.0)
    expected = torch.tensor([
        [0.5, 1.28, 1.28],  # A > 0: min(x, 1.28), no lower bound
        [0.8, 1.5, 3.0],  # A < 0: clamp(x, 0.8, 3), the dual-clip
        [0.5, 1.28, 1.28],  # A = 0: as A > 0 (its weight -A is a zero)
    ])
    assert torch.equal(clamped, expected)
    # no cap: A < 0 is bounded below only
    assert torch.equal(clamp_between(x, adv, 0.8, 1.28)[1], torch.tensor([0.8, 1.5, 5.0]))


@pytest.mark.parametrize("per_response", [True, False])
def test_clip_counts_hand_computed(per_response):
    # rows: A = +1, -1, 0; ratios 0.5, 1.5, 5 (the third token of the last two rows is padding)
    adv = torch.tensor([1.0, -1.0, 0.0])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, False]])
    x = torch.tensor([[0.5, 1.5, 5.0]]).expand(3, 3).contiguous()
    batch = rlstab.TokenBatch(logprobs=x.log() - 2.0, old_logprobs=torch.full((3, 3), -2.0),
                              advantages=adv[:, None].expand(3, 3), response_mask=mask)
    t = Tokens.from_batch(batch, 20.0)
    t.set_advantages(adv if per_response else adv[:, None].expand(3, 3).contiguous())
    counts = clip_counts(t, x, clamp_between(x, t.advantage_rows, 0.8, 1.28, 1.4), dual=True)
    # A > 0 row: 1.5 and 5 above 1.28 -> 2 high.  A < 0 row (2 valid): 0.5 below 0.8 -> 1 low; 1.5 above the
    # dual-clip 1.4 -> 1 dual (5 is padding).  A = 0 row: counted nowhere.
    assert {k: v.item() for k, v in counts.items()} == {
        "clip/high_fraction": 2.0, "clip/low_fraction": 1.0, "clip/dual_fraction": 1.0,
    }
