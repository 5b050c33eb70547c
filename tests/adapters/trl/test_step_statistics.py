"""Which statistics are exact over the optimizer step, in both ``step_statistics`` modes.

An optimizer step of two micro-batches (gradient_accumulation_steps=2, buffered as TRL buffers
them) against the same completions as one micro-batch (gradient_accumulation_steps=1): with
``step_statistics="optimizer_step"`` the summed loss and gradients are the same; with the default
``"data_parallel"`` the denominators are still exact but each micro-batch has its own threshold.
"""

import pytest
import torch

from trl_tiny import crafted_inputs, last_metrics, make_trainer, tiny_model

OBJECTIVES = ["stapo", "20-entropy"]


def micro_batches(trainer, n: int = 2, first: int = 0) -> list[dict]:
    """``n`` micro-batches of 6 completions x 7 tokens (27 valid each); num_items_in_batch counts all of them (TRL's generation batch)."""
    lengths = [7, 5, 3, 6, 2, 4]
    batches = [crafted_inputs(trainer, 10 + first + i, lengths=lengths[i:] + lengths[:i]) for i in range(n)]
    total = sum(float(b["completion_mask"].sum()) for b in batches)
    for b in batches:
        b["num_items_in_batch"] = torch.tensor(total)
    return batches


def concatenated(batches: list[dict]) -> dict:
    whole = {k: torch.cat([b[k] for b in batches]) for k in batches[0] if k != "num_items_in_batch"}
    whole["num_items_in_batch"] = batches[0]["num_items_in_batch"]
    return whole


def run_step(trainer, batches: list[dict]):
    """One optimizer step as TRL's loop runs it: buffered micro-batches, ``_step``, then ``global_step += 1``."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer._buffered_inputs = batches
    trainer.current_gradient_accumulation_steps = len(batches)
    total = torch.zeros(())
    metrics = []
    for j, inputs in enumerate(batches):
        trainer._step = j
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        total += loss.detach()
        metrics.append(last_metrics(trainer))
    trainer.state.global_step += 1  # the optimizer step (not taken here: the gradients are compared)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return total, grads, metrics


def trainers(tmp_path, objective, mode):
    model = tiny_model(sharpen=8.0)
    whole = make_trainer(tmp_path / "whole", objective, model=model, gradient_accumulation_steps=1)
    split = make_trainer(
        tmp_path / "split",
        objective,
        model=tiny_model(sharpen=8.0),
        step_statistics=mode,
        gradient_accumulation_steps=2,
    )
    return whole, split


def close(a, b) -> bool:
    return all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-6) for k in a)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_optimizer_step_statistics_equal_one_micro_batch_of_the_whole_step(tmp_path, objective):
    whole, split = trainers(tmp_path, objective, "optimizer_step")
    label = "s2t" if objective == "stapo" else "entropy_quantile"
    thresholds = []
    for first in (0, 2):  # two optimizer steps: the second must not reuse the first one's statistics
        batches = micro_batches(split, first=first)
        loss, grads, metrics = run_step(whole, [concatenated(batches)])
        split_loss, split_grads, split_metrics = run_step(split, batches)
        torch.testing.assert_close(split_loss, loss, rtol=1e-6, atol=1e-6)
        assert close(split_grads, grads)
        threshold = metrics[0][f"rlstab/mask/{label}/entropy_threshold"]
        assert [m[f"rlstab/mask/{label}/entropy_threshold"] for m in split_metrics] == [threshold, threshold]
        assert [m["rlstab/step/tokens_kept"] for m in split_metrics] == [
            metrics[0]["rlstab/step/tokens_kept"]
        ] * 2
        assert metrics[0][f"rlstab/mask/{label}/silenced"] > 0  # the mask did something
        thresholds.append(threshold)
    assert thresholds[0] != thresholds[1]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_data_parallel_statistics_have_a_threshold_per_micro_batch(tmp_path, objective):
    """The default: exact denominators, per-micro-batch thresholds and kept shares (so the gradients differ)."""
    whole, split = trainers(tmp_path, objective, "data_parallel")
    batches = micro_batches(split)
    _, grads, _ = run_step(whole, [concatenated(batches)])
    _, split_grads, split_metrics = run_step(split, batches)
    assert not close(split_grads, grads)
    label = "s2t" if objective == "stapo" else "entropy_quantile"
    first, second = (m[f"rlstab/mask/{label}/entropy_threshold"] for m in split_metrics)
    assert first != second
    for m in split_metrics:
        # 27 valid tokens in the step (7+5+3+6+2+4 = 27 per micro-batch, x 2 = 54): exact.
        assert m["rlstab/step/tokens_valid"] == 54.0
        # count: kept -> 54 * (kept / valid of this micro-batch), 27 valid tokens each.
        assert m["rlstab/step/tokens_kept"] == pytest.approx(54.0 * m["rlstab/tokens/kept"] / 27.0)


def test_an_optimizer_step_across_two_generations_is_refused(tmp_path):
    """With steps_per_generation=2 and an epoch remainder, a step could start in one generation batch and end in the next."""
    trainer = make_trainer(tmp_path, "stapo", step_statistics="optimizer_step", gradient_accumulation_steps=2)
    batches = micro_batches(trainer)
    trainer._buffered_inputs = batches
    trainer.current_gradient_accumulation_steps = 2
    trainer._step = 1  # a step starting at the buffer's last micro-batch: the next one is regenerated
    trainer.model.train()
    with pytest.raises(RuntimeError, match="micro-batches come from two generation batches"):
        trainer._compute_loss(trainer.model, batches[1])
