"""``rlstab.trainer.rows``: the rows of ``metrics.jsonl``, from a step's metrics, computed by hand."""

from __future__ import annotations

from rlstab.trainer.rows import start_row, step_row


def metrics(valid=10.0, kept=7.0, **extra):
    loss = {
        "tokens/valid": valid, "tokens/kept": kept, "tokens/kept_fraction": kept / valid if valid else 0.0,
        "clip/high_fraction": 0.25, "mask/s2t/kept_fraction": 0.8, "mask/s2t/silenced": 2.0, "loss/pg": -0.5,
    }
    return {"loss_metrics": loss, "reward": 0.5, "entropy": 1.25, "response_length": 6.0, "grad_norm": 0.75,
            "zero_variance_groups": 1, "layers": {}, **extra}


def test_a_steps_row_counts_what_the_masks_silenced():
    row = step_row("stapo", 3, metrics(), accuracy=0.4, mask_labels=["s2t"])
    assert list(row)[:4] == ["objective", "step", "reward", "accuracy"]  # fixed fields first
    assert row["silenced"] == 3.0  # 10 valid - 7 kept
    assert row["silenced_fraction"] == 0.3  # 3 / 10
    assert row["kept_fraction"] == 0.7
    # A clip metric the loss does not report is 0, not missing: every objective's rows have the same fields.
    assert (row["clip_high_fraction"], row["clip_low_fraction"], row["clip_dual_fraction"]) == (0.25, 0.0, 0.0)
    assert row["masks"] == {"s2t": {"kept_fraction": 0.8, "silenced": 2.0}}
    assert row["loss"] == {"tokens/valid": 10.0, "tokens/kept": 7.0, "tokens/kept_fraction": 0.7,
                           "clip/high_fraction": 0.25, "loss/pg": -0.5}  # the mask/ keys are under "masks"
    assert (row["objective"], row["step"], row["accuracy"], row["zero_variance_groups"]) == ("stapo", 3, 0.4, 1)
    assert "layers" not in row and "mechanism" not in row


def test_a_step_without_valid_tokens_has_nothing_silenced():
    row = step_row("grpo", 1, metrics(valid=0.0, kept=0.0), accuracy=None, mask_labels=[])
    assert (row["silenced"], row["silenced_fraction"], row["masks"]) == (0.0, 0.0, {})


def test_layers_and_instruments_are_kept_when_there_are_some():
    row = step_row("goldilocks", 2, metrics(layers={"sampler/mean_rate": 0.5}, mechanism={"ess": 0.9}),
                   accuracy=None, mask_labels=[])
    assert row["layers"] == {"sampler/mean_rate": 0.5} and row["mechanism"] == {"ess": 0.9}


def test_the_start_row_has_only_the_accuracy():
    assert start_row("grpo", 0.25) == {"objective": "grpo", "step": 0, "accuracy": 0.25}
