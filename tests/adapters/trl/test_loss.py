"""``RlstabGRPOTrainer`` around the loss: refusals before TRL loads anything, TRL's count, the step's first micro-batch.

The loss's values against TRL's are in test_conformance.py and test_catalogue*.py.
"""

import pytest
import torch
from trl import GRPOConfig

import rlstab
from rlstab.adapters.trl import RlstabGRPOTrainer
from rlstab.adapters.trl.loss import _check_step_statistics

from trl_tiny import crafted_inputs, grpo_config, make_trainer


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return make_trainer(tmp_path_factory.mktemp("trl_loss"), "grpo")


def test_an_unknown_step_statistics_is_refused_before_trl_loads_the_model():
    # no model, no reward function: the check runs first, so the error is ours and not TRL's
    with pytest.raises(ValueError, match=r"RlstabGRPOTrainer\(step_statistics='per_token'\): must be 'data_parallel' or "
                                         r"'optimizer_step'"):
        RlstabGRPOTrainer(objective="grpo", step_statistics="per_token")


def test_optimizer_step_needs_generation_batches_of_whole_optimizer_steps(tmp_path):
    dapo = rlstab.load("dapo")
    _check_step_statistics("optimizer_step", grpo_config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=4), dapo)
    _check_step_statistics("data_parallel", grpo_config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=3), dapo)
    config = grpo_config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=3)
    with pytest.raises(ValueError, match=r"GRPOConfig.steps_per_generation = 3 is not a multiple of "
                                         r"gradient_accumulation_steps = 2"):
        _check_step_statistics("optimizer_step", config, dapo)
    assert isinstance(config, GRPOConfig)


def test_a_micro_batch_without_trls_count_is_refused_by_name(trainer):
    inputs = crafted_inputs(trainer, 0)
    del inputs["num_items_in_batch"]
    with pytest.raises(KeyError, match="no 'num_items_in_batch'"):
        trainer._compute_loss(trainer.model, inputs)


def test_the_first_micro_batch_of_each_optimizer_step_and_never_one_in_eval(trainer):
    trainer._rlstab_state_step = None
    trainer.state.global_step = 4
    assert [trainer._rlstab_first_of_step("train") for _ in range(3)] == [True, False, False]
    assert trainer._rlstab_first_of_step("eval") is False
    trainer.state.global_step = 5  # TRL's loop stepped the optimizer
    assert trainer._rlstab_first_of_step("train") is True


def test_the_scale_takes_trls_count_and_accumulates_only_in_training(trainer):
    inputs = crafted_inputs(trainer, 0, B=4, T=5, lengths=[1, 2, 3, 4], num_items_in_batch=40.0)
    batch = trainer._rlstab_batch(inputs, torch.zeros(4, 5), torch.zeros(4, 5))
    trainer.current_gradient_accumulation_steps = 2
    train = trainer._rlstab_scale(inputs, batch, "train")
    evaluation = trainer._rlstab_scale(inputs, batch, "eval")
    # steps_per_generation 1 (unset: TRL takes gradient_accumulation_steps, 1 in grpo_config): training spreads TRL's
    # count of the generation batch over the window, 40 * GA 2 / 1 = 80, and counts B * GA * P = 4 * 2 * 1 = 8
    # completions; evaluation takes the count as it is (40) and B = 4. max_length: max_completion_length 8.
    assert trainer.args.steps_per_generation == 1
    assert (train.tokens, train.sequences, train.accumulation, train.max_length) == (80.0, 8.0, 2, 8)
    assert (evaluation.tokens, evaluation.sequences, evaluation.accumulation) == (40.0, 4.0, 1)
