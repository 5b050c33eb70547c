"""End to end: GRPO steps of the real TRL training loop on CPU with the stapo objective.

A tiny Llama, generation by transformers, a reward function in code; the objective's metrics must
reach ``trainer.state.log_history`` through TRL's logging, and the weights must move.
"""

import pytest
import torch

from trl_tiny import make_trainer, tiny_model

RLSTAB_KEYS = [
    "rlstab/mask/s2t/kept",
    "rlstab/mask/s2t/silenced",
    "rlstab/mask/s2t/entropy_threshold",
    "rlstab/tokens/kept_fraction",
    "rlstab/step/tokens_valid",
    "rlstab/clip/high_fraction",
    "rlstab/loss/policy",
]
TRL_KEYS = ["loss", "grad_norm", "entropy", "clip_ratio/high_mean", "clip_ratio/region_mean", "reward"]


def train(tmp_path, **config):
    model = tiny_model(sharpen=8.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = make_trainer(tmp_path, "stapo", model=model, **config)
    trainer.train()
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    steps = [h for h in trainer.state.log_history if "loss" in h]
    return trainer, moved, steps


@pytest.mark.parametrize(
    "config",
    [
        {"gradient_accumulation_steps": 1},
        {"gradient_accumulation_steps": 2},
        {"gradient_accumulation_steps": 2, "step_statistics": "optimizer_step"},
    ],
    ids=["ga1", "ga2", "ga2-optimizer-step"],
)
def test_grpo_steps_with_stapo_train_and_log_rlstab_metrics(tmp_path, config):
    trainer, moved, steps = train(tmp_path, max_steps=2, **config)
    assert len(steps) == 2
    assert moved, "no weight changed"
    ga = config["gradient_accumulation_steps"]
    for h in steps:
        for key in RLSTAB_KEYS + TRL_KEYS:
            assert key in h, key
        assert torch.isfinite(torch.tensor(h["loss"]))
        # The trained loss is the objective's: TRL logs the sum of the step's micro-batch losses,
        # rlstab/loss/policy their mean, so loss = GA * rlstab/loss/policy.
        assert h["loss"] == pytest.approx(ga * h["rlstab/loss/policy"], rel=1e-5, abs=1e-7)
        # kept + silenced = valid tokens, micro-batch by micro-batch, so also in the logged averages
        valid = h["rlstab/mask/s2t/kept"] + h["rlstab/mask/s2t/silenced"]
        assert valid == pytest.approx(h["rlstab/tokens/valid"])
        # The step's valid-token count is TRL's: 4 completions per micro-batch x GA micro-batches x mean length
        assert h["rlstab/step/tokens_valid"] == pytest.approx(4 * ga * h["completions/mean_length"])
        assert 0.0 <= h["rlstab/tokens/kept_fraction"] <= 1.0
    assert trainer.state.global_step == 2
