"""The buffered micro-batches of one optimizer step (``step_statistics="optimizer_step"``), from the real trainer's buffer."""

import pytest

from rlstab.adapters.trl.step_scope import window_inputs

from trl_tiny import make_trainer


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    # 4 micro-batches per generation batch, 2 per optimizer step
    trainer = make_trainer(tmp_path_factory.mktemp("trl_step_scope"), "grpo", step_statistics="optimizer_step",
                           gradient_accumulation_steps=2, steps_per_generation=4)
    trainer._buffered_inputs = [{"micro_batch": i} for i in range(4)]
    return trainer


@pytest.mark.parametrize("step, expected", [(0, [0, 1]), (2, [2, 3]), (4, [0, 1]), (6, [2, 3])])
def test_the_window_is_the_next_accumulation_micro_batches_of_the_buffer(trainer, step, expected):
    # micro-batch k of the run is buffer slot k mod steps_per_generation (4)
    trainer._step = step
    assert [inputs["micro_batch"] for inputs in window_inputs(trainer, 2)] == expected


def test_a_window_across_two_generation_batches_is_refused(trainer):
    trainer._step = 3  # micro-batches 3 and 4: 4 starts the next generation batch (4 mod 4 = 0)
    with pytest.raises(RuntimeError, match=r"from two generation batches \(micro-batch 4 starts a new one\); make "
                                           r"steps_per_generation \(4\) a multiple of gradient_accumulation_steps \(2\)"):
        window_inputs(trainer, 2)


def test_one_micro_batch_per_step_is_always_one_generation_batch(trainer):
    trainer._step = 3
    assert [inputs["micro_batch"] for inputs in window_inputs(trainer, 1)] == [3]
