"""Stateful components under gradient accumulation, through TRL's own training loop (``train()``).

TRL 1.16's ``use_adaptive_entropy`` (``GRPOTrainer._compute_loss``) applies, on every micro-batch of
an optimizer step, the coefficient and gate of the previous step's measure; it sums each
micro-batch's entropy and token count over the accumulation window and, at the step's end, all
ranks, and moves the coefficient once. Its bonus is each micro-batch's mean entropy divided by
``gradient_accumulation_steps``. rlstab's ``adaptive_entropy`` with TRL's rule and
``average: micro_batch`` does the same in the adapter's default mode (``data_parallel``), where
the loss sees one micro-batch at a time: each micro-batch is one part of the step
(``gather(..., part_of_step=True)``).

The model is made to end completions early (the end-of-sequence row of the LM head scaled up), so
completions differ in length and micro-batches in token count: a controller measuring only the
step's first micro-batch, or a bonus averaged over the step's tokens instead of per micro-batch,
would differ from TRL's.
"""

import copy

import pytest
import torch
from transformers import TrainerCallback

from trl_tiny import make_trainer, tiny_model, tokenizer

LABEL = "regularisers[0] (adaptive_entropy)"
CONTROLLER = {"coef": 0.05, "delta": 0.02, "coef_min": 0.0, "coef_max": 0.09}
TRL_RULE = {"measure": "entropy", "boundary": "at_or_below", "first_step": "off", "average": "micro_batch"}
TARGET = 100.0  # above any entropy of a 280-token vocabulary (ln 280 = 5.6): the coefficient rises every step
CONFIG = dict(loss_type="dapo", epsilon_high=0.28, gradient_accumulation_steps=2, max_steps=2)


class Record(TrainerCallback):
    """What ``read(trainer)`` gives after each optimizer step."""

    def __init__(self, trainer, read):
        self.trainer, self.read, self.steps = trainer, read, []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(self.read(self.trainer))


def early_ending_model():
    model = tiny_model(sharpen=8.0)
    with torch.no_grad():
        model.lm_head.weight[tokenizer().eos_token_id].mul_(40.0)
    return model


def run(tmp_path, objective, read, **config):
    trainer = make_trainer(tmp_path, objective, model=early_ending_model(), **CONFIG, **config)
    tokens = []
    if objective is not None:  # the token count of every micro-batch the loss sees
        compute_loss = trainer._compute_loss

        def counting(model, inputs):
            tokens.append(int(inputs["completion_mask"].sum()))
            return compute_loss(model, inputs)

        trainer._compute_loss = counting
    record = Record(trainer, read)
    trainer.add_callback(record)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, record.steps, losses, tokens


def test_adaptive_entropy_under_accumulation_equals_trls_controller(tmp_path):
    theirs, their_states, their_losses, _ = run(
        tmp_path / "trl", None, lambda t: (t.entropy_coef, t._last_world_entropy),
        use_adaptive_entropy=True, entropy_coef=CONTROLLER["coef"], entropy_coef_delta=CONTROLLER["delta"],
        entropy_coef_min=CONTROLLER["coef_min"], entropy_coef_max=CONTROLLER["coef_max"], entropy_target=TARGET,
    )
    objective = {"extends": "dapo", "regularisers": [
        {"kind": "adaptive_entropy", **CONTROLLER, "target_entropy": TARGET, **TRL_RULE}
    ]}
    ours, our_states, our_losses, tokens = run(
        tmp_path / "rlstab", objective, lambda t: copy.deepcopy(t.rlstab_compiled.state_dict()[LABEL]),
        save_strategy="steps", save_steps=1,
    )
    assert ours.rlstab_step_statistics == "data_parallel"  # the default mode
    assert len(tokens) == 4 and (tokens[0] != tokens[1] or tokens[2] != tokens[3])  # micro-batches differ
    assert len(their_states) == len(our_states) == 2
    for (coef, entropy), state in zip(their_states, our_states):
        assert state["coef"] == pytest.approx(coef, abs=1e-12)
        assert state["entropy"] == pytest.approx(entropy, rel=1e-6)  # the whole window's mean entropy
    assert [s["coef"] for s in our_states] == pytest.approx([0.07, 0.09])  # 0.05 + 0.02, then + 0.02 (max 0.09)
    # step 1: gate closed (no measure yet), step 2: 0.07 times each micro-batch's mean entropy / 2
    assert our_losses == pytest.approx(their_losses, rel=1e-5, abs=1e-7)
    for step, state in enumerate(our_states, start=1):  # each checkpoint holds its step's measure and move
        saved = torch.load(tmp_path / "rlstab" / f"checkpoint-{step}" / "rlstab_state.pt", weights_only=True)
        assert saved[LABEL] == state


@pytest.mark.parametrize("preset, label", [("bapo", "surrogate (bapo)"), ("stare", "reweighters[0] (stare)")])
def test_a_state_that_reads_the_whole_step_is_refused_under_accumulation(tmp_path, preset, label):
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path, preset, **CONFIG)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"RlstabGRPOTrainer(step_statistics='data_parallel') with gradient_accumulation_steps = 2: {label} needs the "
        "whole optimizer step before its first micro-batch, but this mode sees one micro-batch at a time"
    )
    assert message.endswith("use step_statistics='optimizer_step' (one extra no-grad forward per optimizer step)")
    make_trainer(tmp_path / "optimizer_step", preset, step_statistics="optimizer_step", **CONFIG)
    make_trainer(tmp_path / "ga1", preset, **{**CONFIG, "gradient_accumulation_steps": 1})
