"""LossOutput.metrics (rlstab.metrics.Metrics) and the checks a frozen-step call leaves to their read (rlstab.deferred)."""

import math

import pytest
import torch

import rlstab
from rlstab import TokenBatch
from rlstab.compiler.loss_metrics import Reported
from rlstab.deferred import AllFinite, deferring, require
from rlstab.metrics import Element, Metrics, combine
from rlstab.testing.syncs import host_syncs


def batch(old_pad=0.0, old_valid=None, group_ids=(0, 0, 1, 1)):
    # 4 responses x 3 tokens; row 3 has one valid token, the rest of row 3 is padding.
    logprobs = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.2, -0.3], [-1.5, -0.5, -0.7], [-0.9, 0.0, 0.0]])
    old = logprobs.clone() - 0.05
    old[3, 1:] = old_pad
    if old_valid is not None:
        old[0, 1] = old_valid
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    return TokenBatch(
        logprobs=logprobs.requires_grad_(), old_logprobs=old, response_mask=mask,
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group_ids=torch.tensor(group_ids),
    )


def grpo(defer=True):
    loss_fn = rlstab.load("grpo").compile()
    loss_fn.defer_checks = defer
    return loss_fn


def test_values_are_read_once_all_together_and_rounded_to_float32():
    m = Metrics(["a", "b", "loss"], [torch.tensor(0.25), 0.1, torch.tensor(2.0, dtype=torch.float64)])
    assert repr(m) == "Metrics(<3 values not read yet>)"
    with host_syncs() as syncs:
        plain = dict(m)
        m["a"], len(m), list(m)  # later reads: no transfer
    assert len(syncs) == 1  # one stacked transfer for every tensor
    # 0.1 is not a float32: the number a float32 loss would report is 0.100000001490116...
    assert plain == {"a": 0.25, "b": 0.10000000149011612, "loss": 2.0}
    assert type(plain) is dict and list(m) == ["a", "b", "loss"]


def test_pickled_and_copied_as_the_plain_dict_it_reads_to():
    import copy
    import pickle

    m = Metrics(["a", "loss"], [torch.tensor(0.5), 1.0], [(torch.tensor(True), lambda: ValueError("unused"))])
    assert pickle.loads(pickle.dumps(m)) == copy.deepcopy(m) == {"a": 0.5, "loss": 1.0}
    assert type(copy.deepcopy(m)) is dict


def test_a_failed_requirement_raises_at_every_read():
    m = Metrics(["loss"], [torch.tensor(1.0)], [(torch.tensor(True), lambda: ValueError("no")),
                                                 (torch.tensor(False), lambda: ValueError("second failed"))])
    for _ in range(2):
        with pytest.raises(ValueError, match="second failed"):
            m["loss"]


def test_a_loss_that_is_not_finite_raises_at_the_read():
    m = Metrics(["x", "loss"], [torch.tensor(1.0), torch.tensor(float("nan"))])
    with pytest.raises(FloatingPointError, match="the loss is not finite although every input is"):
        dict(m)


def test_require_checks_at_once_outside_a_deferring_call():
    with pytest.raises(ValueError, match="at once"):
        require(torch.tensor(False), lambda: ValueError("at once"))
    with deferring() as pending:
        require(torch.tensor(False), lambda: ValueError("later"))
    assert len(pending) == 1


def test_nan_on_padding_changes_nothing_in_a_deferred_call():
    loss_fn = grpo()
    clean = batch()
    stats = loss_fn.gather([clean])
    expected = loss_fn(clean, step=stats)
    dirty = batch(old_pad=float("nan"))
    got = loss_fn(dirty, step=stats)
    assert torch.equal(got.loss, expected.loss)
    assert dict(got.metrics) == dict(expected.metrics)
    got.loss.backward()
    assert torch.isfinite(dirty.logprobs.grad).all() and (dirty.logprobs.grad[3, 1:] == 0).all()


def test_nan_on_a_valid_token_raises_at_the_metrics_read():
    loss_fn = grpo()
    stats = loss_fn.gather([batch()])
    out = loss_fn(batch(old_valid=float("nan")), step=stats)  # no read: no error yet
    message = r"TokenBatch.old_logprobs has 1 value\(s\) on valid tokens that are not finite in float32 \(first at index \[0, 1\]: nan\)"
    for _ in range(2):
        with pytest.raises(FloatingPointError, match=message):
            out.metrics["loss"]
    # The checked path (the CPU's default) raises the same error in the call itself.
    with pytest.raises(FloatingPointError, match=message):
        grpo(defer=False)(batch(old_valid=float("nan")), step=stats)


def test_a_group_the_step_lacks_raises_at_the_metrics_read():
    loss_fn = grpo()
    stats = loss_fn.gather([batch()])
    out = loss_fn(batch(group_ids=(0, 0, 7, 7)), step=stats)
    with pytest.raises(ValueError, match=r"group_ids \[7\] were not in the step"):
        dict(out.metrics)
    with pytest.raises(ValueError, match=r"group_ids \[7\] were not in the step"):
        grpo(defer=False)(batch(group_ids=(0, 0, 7, 7)), step=stats)


def test_hand_computed_loss_through_the_deferred_path():
    # grpo: advantages by group, rewards (1, 0) in each group: mean 0.5, std (unbiased) sqrt(0.5) = 0.7071
    # -> A = +-0.5 / (0.7071 + 1e-6) = +-0.70710 (rows 0, 2 positive; 1, 3 negative).
    # On-policy ratios are exp(0.05) = 1.05127 (old = current - 0.05), inside [0.8, 1.28]: l = -A r.
    # token-mean over the 9 valid tokens: (3 * -A+ r + 2 * -A- r + 3 * -A+ r + 1 * -A- r) / 9 = -(3 * 0.70710 r) / 9
    loss_fn = grpo()
    clean = batch()
    out = loss_fn(clean, step=loss_fn.gather([clean]))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = -(3 * a * math.exp(0.05)) / 9
    assert out.metrics["loss"] == pytest.approx(expected, rel=1e-6)
    assert out.metrics["tokens/valid"] == 9.0


def test_combine_adds_counts_keeps_step_values_and_weights_fractions():
    kinds = {"tokens/valid": "sum", "tokens/kept": "sum", "tokens/kept_fraction": "token_mean",
             "mask/s2t/silenced": "sum", "mask/s2t/kept": "sum", "mask/s2t/entropy_threshold": "step",
             "clip/high_fraction": "token_mean", "loss": "sum", "loss/policy": "sum", "step/tokens_valid": "step"}
    a = {"tokens/valid": 10.0, "tokens/kept": 8.0, "tokens/kept_fraction": 0.8, "mask/s2t/silenced": 2.0,
         "mask/s2t/kept": 8.0, "mask/s2t/entropy_threshold": 0.5, "clip/high_fraction": 0.1, "loss": 1.0,
         "loss/policy": 1.0, "step/tokens_valid": 40.0}
    b = {"tokens/valid": 30.0, "tokens/kept": 30.0, "tokens/kept_fraction": 1.0, "mask/s2t/silenced": 0.0,
         "mask/s2t/kept": 30.0, "mask/s2t/entropy_threshold": 0.5, "clip/high_fraction": 0.0, "loss": 2.0,
         "loss/policy": 2.0, "step/tokens_valid": 40.0}
    out = combine([Metrics(list(m), list(m.values()), kinds=[kinds[n] for n in m]) for m in (a, b)])
    assert out["tokens/valid"] == 40 and out["tokens/kept"] == 38 and out["mask/s2t/silenced"] == 2
    assert out["tokens/kept_fraction"] == pytest.approx(38 / 40)  # (0.8 * 10 + 1.0 * 30) / 40
    assert out["clip/high_fraction"] == pytest.approx(1 / 40)  # (0.1 * 10 + 0 * 30) / 40
    assert out["loss"] == 3.0 and out["loss/policy"] == 3.0
    assert out["mask/s2t/entropy_threshold"] == 0.5 and out["step/tokens_valid"] == 40


def test_entries_of_one_tensor_are_read_with_the_others_in_one_transfer():
    block = torch.tensor([0.25, 0.1, 3.0])
    m = Metrics(["a", "b", "c", "d"], [Element(block, 2), torch.tensor(0.5), Element(block, 0), 7.0],
                [(torch.tensor(True), lambda: ValueError("unused"))])
    assert torch.equal(m.unread("a"), block[2]) and m.unread("d") == 7.0  # nothing read yet
    with host_syncs() as syncs:
        assert dict(m) == {"a": 3.0, "b": 0.5, "c": 0.25, "d": 7.0}
    assert len(syncs) == 1


def test_an_all_finite_requirement_is_judged_on_the_values_read():
    fine = Metrics(["loss"], [torch.tensor(1.0)], [(AllFinite((torch.tensor(-3.0), torch.tensor(2.0))), lambda: ValueError("no"))])
    assert dict(fine) == {"loss": 1.0}
    for bad in (math.inf, -math.inf, math.nan, 1e300):  # 1e300 (float64) is not finite in float32
        m = Metrics(["loss"], [torch.tensor(1.0)],
                    [(AllFinite((torch.tensor(0.0), torch.tensor(bad, dtype=torch.float64))), lambda: ValueError("not finite"))])
        with pytest.raises(ValueError, match="not finite"):
            dict(m)


def test_ratios_over_one_denominator_are_divided_at_once_to_the_same_floats():
    g = torch.Generator().manual_seed(0)
    numerators = [torch.randn((), generator=g) * 10.0 ** float(e) for e in range(-6, 7)]
    denominator = torch.tensor(7.0) * torch.rand((), generator=g)
    out = Reported()
    for i, x in enumerate(numerators):
        out.ratio(f"r{i}", x, denominator, "token_mean")
    out.add("n", torch.tensor(3.0), "sum")
    read = dict(Metrics(out.finish().names, out.values, kinds=out.kinds))
    assert [read[f"r{i}"] for i in range(len(numerators))] == [(x / denominator).item() for x in numerators]
    assert read["n"] == 3.0


def test_step_counts_have_a_public_home_and_are_what_the_loss_reports_as_the_step():
    # rlstab.metrics.STEP_COUNTS: the step's denominators, "step" metrics a trainer adds up over its updates
    # (rlstab.trainer.loop.combine_updates imports them from here, not from a compiler module).
    from rlstab.metrics import STEP_COUNTS

    out = grpo(defer=False)(batch())
    assert STEP_COUNTS[:2] == ("step/tokens_valid", "step/tokens_kept")
    # rows of 3, 2, 3 and 1 valid tokens: 9; GRPO has no mask, so every valid token is kept
    assert [out.metrics[name] for name in STEP_COUNTS[:2]] == [9.0, 9.0]
    assert [out.metrics.combines(name) for name in STEP_COUNTS[:2]] == ["step", "step"]


def test_combine_takes_the_extremes_of_min_and_max_metrics():
    # micro-batch ratios within [0.5, 2], [0.25, 1.5] and none (its placeholder 3, left out)
    def parts(*rows):
        return [Metrics(["tokens/valid", "mismatch/ratio_min", "mismatch/ratio_max"], [n, lo, hi], kinds=["sum", "min", "max"])
                for n, lo, hi in rows]

    out = combine(parts((4.0, 0.5, 2.0), (0.0, 3.0, 3.0), (6.0, 0.25, 1.5)))
    assert (out["mismatch/ratio_min"], out["mismatch/ratio_max"]) == (0.25, 2.0)
    out = combine(parts((0.0, 1.0, 1.0), (0.0, 1.0, 1.0)))  # no valid token anywhere: the placeholder
    assert (out["mismatch/ratio_min"], out["mismatch/ratio_max"]) == (1.0, 1.0)
    with pytest.raises(ValueError, match="unknown metric kinds"):
        Metrics(["x"], [1.0], kinds=["median"])
