"""``rlstab.compiler.step_phase``: the step's statistics gathered once over every micro-batch, worked out by hand.

Two micro-batches, with advantages (nothing to estimate), and one mask that silences the tokens whose
entropy is above the step's median:

    mb 1: response_mask [[1, 1, 0], [1, 0, 0]], valid entropies 0.1, 0.5 | 0.3   (3 tokens, 2 rows)
    mb 2: response_mask [[1, 1, 0], [0, 0, 0]], valid entropies 0.6, 0.7        (2 tokens, 1 row; row 1 is padding)

The step's median (linear, position 0.5 * (5 - 1) = 2 of 0.1, 0.3, 0.5, 0.6, 0.7) is 0.5; mb 1 alone
would give 0.3. Silenced: 0.6 and 0.7 (> 0.5); kept: mb 1's three tokens.
"""

import math

import pytest
import torch

import rlstab
from rlstab.batch import TokenBatch
from rlstab.comm import Comm
from rlstab.compiler.inputs import Inputs
from rlstab.compiler.offending_inputs import OffendingInputs
from rlstab.compiler.plan import Plan
from rlstab.compiler.states import ComponentStates
from rlstab.compiler.step_phase import Gathered, StepPhase
from rlstab.compiler.step_stats import StepStats

LOCAL = Comm(distributed=False)
OBJECTIVE = rlstab.load({"extends": "grpo", "name": "median-cut",
                         "masks": [{"kind": "expression", "silence": "entropy > quantile(entropy, 0.5)"}]})
PAD = 9.0  # on padding: would move the median if it were counted


def batch(mask, entropy):
    mask = torch.tensor(mask, dtype=torch.bool)
    return TokenBatch(logprobs=torch.full(mask.shape, -1.0), response_mask=mask, advantages=torch.ones(mask.shape[0]),
                      entropy=torch.tensor(entropy))


FIRST = ([[1, 1, 0], [1, 0, 0]], [[0.1, 0.5, PAD], [0.3, PAD, PAD]])
SECOND = ([[1, 1, 0], [0, 0, 0]], [[0.6, 0.7, PAD], [PAD, PAD, PAD]])


def phase(objective=OBJECTIVE):
    plan = Plan.of(objective)
    inputs = Inputs(objective, plan)
    return StepPhase(objective, inputs, ComponentStates(objective, plan.stateful), "fp"), inputs


def gather(batches, objective=OBJECTIVE, **kwargs):
    step, inputs = phase(objective)
    return step.gather([inputs.tokens(b) for b in batches], LOCAL, **kwargs)


def test_the_denominators_span_the_step():
    gathered = gather([batch(*FIRST), batch(*SECOND)])
    assert isinstance(gathered, Gathered) and isinstance(gathered.stats, StepStats)
    counts = gathered.stats.counts
    # valid tokens 3 + 2; kept 3 + 0; rows with a valid token 2 + 1; rows with a kept token 2 + 0
    assert (counts.tokens_valid, counts.tokens_kept, counts.sequences_valid, counts.sequences_kept) == (5, 3, 3, 2)
    assert (counts.max_length, counts.world_size) == (3, 1)


def test_the_mask_threshold_is_the_steps_quantile():
    # One mask; an expression mask's threshold is a tuple, one per quantile() it holds.
    ((threshold,),) = gather([batch(*FIRST), batch(*SECOND)]).stats.thresholds
    assert threshold.item() == pytest.approx(0.5)
    ((alone,),) = gather([batch(*FIRST)]).stats.thresholds  # mb 1 alone: median of 0.1, 0.3, 0.5
    assert alone.item() == pytest.approx(0.3)


def test_each_micro_batchs_kept_tokens_come_back():
    masked = gather([batch(*FIRST), batch(*SECOND)]).masked
    assert [kept.tolist() for _, kept in masked] == [[[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]] * 2]


def test_the_stats_name_their_objective_and_carry_no_estimator_state_for_given_advantages():
    stats = gather([batch(*FIRST)]).stats
    assert (stats.fingerprint, stats.objective_name, stats.advantage, stats.lr_scale) == ("fp", "median-cut", None, 1.0)
    assert stats.branch_counts is None and stats.hooks == (None,)  # grpo: one stateless surrogate


def test_with_check_an_offending_input_anywhere_raises():
    mask, entropy = SECOND
    dirty = TokenBatch(logprobs=torch.tensor([[-1.0, -1.0, math.nan], [-1.0, -1.0, -1.0]]),  # NaN on padding
                       response_mask=torch.tensor(mask, dtype=torch.bool), advantages=torch.ones(2),
                       entropy=torch.tensor(entropy))
    with pytest.raises(OffendingInputs):
        gather([batch(*FIRST), dirty], check=True)
    assert gather([batch(*FIRST), dirty]).stats.counts.tokens_valid == 5  # without the check: not looked at


def test_dual_stream_counts_the_branch_rows_apart():
    objective = rlstab.load({"extends": "grpo", "dual_stream": {"kind": "dual-stream", "branch_weight": 0.5}})
    mask, entropy = FIRST
    b = TokenBatch(logprobs=torch.full((2, 3), -1.0), response_mask=torch.tensor(mask, dtype=torch.bool),
                   advantages=torch.ones(2), is_branch=torch.tensor([False, True]))
    branch = gather([b], objective).stats.branch_counts
    # the branch row is row 1: 1 valid token, kept (no mask), 1 row
    assert (branch.tokens_valid, branch.tokens_kept, branch.sequences_valid, branch.sequences_kept) == (1, 1, 1, 1)
