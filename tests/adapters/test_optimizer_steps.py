"""``rlstab.adapters.optimizer_steps``: optimizer steps counted by torch's global hook, one ``True`` per step."""

from __future__ import annotations

import torch

from rlstab.adapters.optimizer_steps import StepTracker, steps_taken


def sgd() -> torch.optim.Optimizer:
    weight = torch.nn.Parameter(torch.ones(1))
    weight.grad = torch.ones(1)
    return torch.optim.SGD([weight], lr=0.1)


def test_every_optimizer_step_in_the_process_is_counted_once():
    before = steps_taken()  # installs the hook; other tests may have stepped before
    first, second = sgd(), sgd()
    first.step()
    second.step()  # another optimizer: the hook is global
    first.step()
    assert steps_taken() - before == 3
    assert steps_taken() - before == 3  # reading the count takes no step


def test_the_tracker_is_true_on_the_first_call_after_each_step_only():
    optimizer = sgd()
    tracker = StepTracker()
    # micro-batch calls:  1st  2nd   | step |  3rd  4th  | step | step |  5th
    seen = [tracker.first_call_of_step(), tracker.first_call_of_step()]
    optimizer.step()
    seen += [tracker.first_call_of_step(), tracker.first_call_of_step()]
    optimizer.step()
    optimizer.step()  # two steps without a loss call between them: still one new step for the loss
    seen.append(tracker.first_call_of_step())
    assert seen == [True, False, True, False, True]


def test_trackers_keep_their_own_place():
    """Two losses in one process (an actor and a critic, say) each see the step begin once."""
    optimizer = sgd()
    actor, critic = StepTracker(), StepTracker()
    assert actor.first_call_of_step() and not actor.first_call_of_step()
    assert critic.first_call_of_step()  # the critic's first call, although the actor has seen this step
    optimizer.step()
    assert [actor.first_call_of_step(), critic.first_call_of_step(), actor.first_call_of_step()] == [True, True, False]
