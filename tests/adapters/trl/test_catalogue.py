"""Every preset of the catalogue either runs inside TRL's loss or is refused when the trainer is built.

A preset is refused only for what TRL cannot hand a loss on this machine (inference-engine
log-probabilities without vLLM, rewards or prompt groups; Lp-Reg's proxy, which no adapter's trainer
computes; GTPO's token ids, which no adapter passes), or for a part only a trainer can run
that TRL's does not (rlstab.adapters.trainer_parts: the learning-rate scale, VCPO's baseline, a
sampler, a rollout, branch rows); any other refusal or failure means the adapter has to learn about
a new component. A preset whose state reads the whole optimizer step (BAPO, STARE) is refused at
``gradient_accumulation_steps = 2`` in the default mode, which sees one micro-batch at a time, with
the mode to use, and runs at 1.
"""

import warnings

import pytest
import torch

import rlstab
from rlstab import ConfigError
from rlstab.adapters.trainer_parts import unexecutable

from trl_tiny import crafted_inputs, last_metrics, loss_and_grads, make_trainer, tiny_model

UNAVAILABLE_ON_CPU = (
    "reads TokenBatch.rollout_logprobs",
    "reads TokenBatch.rewards",
    "reads TokenBatch.group_ids",
    "reads TokenBatch.proxy_logprobs",  # Lp-Reg's min-p proxy: no adapter's trainer computes it (trainer_parts)
    "reads TokenBatch.token_ids",  # GTPO's conflict tokens: no adapter passes the response's token ids (trainer_parts)
)


@pytest.mark.parametrize("preset", rlstab.preset_names())
def test_preset_runs_in_trl_or_is_refused_for_a_missing_input(tmp_path, preset):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # scale_rewards notes for presets without std scaling
        try:
            trainer = make_trainer(
                tmp_path, preset, model=tiny_model(sharpen=8.0), gradient_accumulation_steps=2
            )
        except ConfigError as err:
            problems = err.problems
            trainer_only = unexecutable(rlstab.load(preset), "TRL")
            assert problems and all(p in trainer_only or any(why in p for why in UNAVAILABLE_ON_CPU) for p in problems), str(err)
            assert all(p in problems for p in trainer_only), str(err)  # every trainer-only part is named
            return
        except ValueError as err:  # a state that reads the whole step, in the mode that sees one micro-batch at a time
            assert rlstab.compile(rlstab.load(preset)).states_needing_whole_step(), str(err)
            assert str(err).endswith("use step_statistics='optimizer_step' (one extra no-grad forward per optimizer step)")
            trainer = make_trainer(tmp_path / "ga1", preset, model=tiny_model(sharpen=8.0), gradient_accumulation_steps=1)
    accumulation = trainer.args.gradient_accumulation_steps
    inputs = crafted_inputs(trainer, 0, num_items_in_batch=60.0)
    loss, grads = loss_and_grads(trainer, inputs, accumulation)
    assert torch.isfinite(loss)
    assert grads and all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())
    assert "rlstab/loss/policy" in last_metrics(trainer)


def test_stateful_components_advance_once_per_optimizer_step_and_survive_a_checkpoint(tmp_path):
    """BAPO's bounds are chosen once per optimizer step (over its micro-batches), saved and restored."""
    trainer = make_trainer(
        tmp_path,
        "bapo",
        model=tiny_model(sharpen=8.0),
        step_statistics="optimizer_step",
        gradient_accumulation_steps=2,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
    )
    loss_and_grads(trainer, crafted_inputs(trainer, 0), training=False)  # evaluation never advances a state
    assert trainer.rlstab_compiled.state_dict()["surrogate (bapo)"]["steps"] == 0
    trainer.train()
    state = trainer.rlstab_compiled.state_dict()
    assert (
        state["surrogate (bapo)"]["steps"] == 2
    )  # 2 optimizer steps of 2 micro-batches: advanced twice, not 4 times
    saved = torch.load(tmp_path / "checkpoint-2" / "rlstab_state.pt", weights_only=True)
    assert saved == state
    assert (
        torch.load(tmp_path / "checkpoint-1" / "rlstab_state.pt", weights_only=True)["surrogate (bapo)"][
            "steps"
        ]
        == 1
    )

    resumed = make_trainer(
        tmp_path / "resumed",
        "bapo",
        model=tiny_model(sharpen=8.0),
        step_statistics="optimizer_step",
        gradient_accumulation_steps=2,
        max_steps=2,
    )
    assert resumed.rlstab_compiled.state_dict()["surrogate (bapo)"]["steps"] == 0
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    # Resumed at step 2 with the saved state, then transformers runs its remaining step(s): the
    # counter continues from the checkpoint's 2 (a fresh state would restart at 0).
    assert resumed.state.global_step > 2
    assert resumed.rlstab_compiled.state_dict()["surrogate (bapo)"]["steps"] == resumed.state.global_step
