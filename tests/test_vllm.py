"""rlstab.vllm: vLLM outputs' per-token logprobs as TokenBatch.rollout_logprobs.

The outputs are built with vLLM's own classes (``vllm.outputs``, ``vllm.logprobs``) when vLLM is
installed; otherwise with stand-ins that have the fields of vLLM 0.32.0's classes (the same
attribute names and containers), so the core suite runs without vLLM.
"""

import math
from dataclasses import dataclass, field

import pytest
import torch

import rlstab
from rlstab.vllm import rollout_logprobs, sampled_logprobs

try:  # vLLM's real classes
    from vllm.logprobs import FlatLogprobs, Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    REAL_VLLM = True
except ImportError:  # stand-ins with vLLM 0.32.0's fields
    REAL_VLLM = False

    @dataclass
    class Logprob:
        logprob: float
        rank: int | None = None
        decoded_token: str | None = None

    @dataclass
    class FlatLogprobs:
        start_indices: list = field(default_factory=list)
        end_indices: list = field(default_factory=list)
        token_ids: list = field(default_factory=list)
        logprobs: list = field(default_factory=list)
        ranks: list = field(default_factory=list)
        decoded_tokens: list = field(default_factory=list)

        def append(self, position):
            self.start_indices.append(len(self.logprobs))
            for token, lp in position.items():
                self.token_ids.append(token)
                self.logprobs.append(lp.logprob)
                self.ranks.append(lp.rank)
                self.decoded_tokens.append(lp.decoded_token)
            self.end_indices.append(len(self.logprobs))

        def __len__(self):
            return len(self.start_indices)

    @dataclass
    class CompletionOutput:
        index: int
        text: str
        token_ids: list
        cumulative_logprob: float | None
        logprobs: object

    @dataclass
    class RequestOutput:
        request_id: str
        prompt: str | None
        prompt_token_ids: list | None
        prompt_logprobs: object
        outputs: list
        finished: bool


# Two prompts, two samples each: generated tokens and their log-probabilities; each position also lists the
# top-2 alternatives (SamplingParams(logprobs=2)), the sampled token first, as vLLM appends them.
SAMPLES = [
    ([7, 3, 9], [-0.5, -1.25, -0.125]),
    ([4], [-2.0]),
    ([5, 5], [-0.75, -0.25]),
    ([1, 2, 3, 8], [-0.1, -0.2, -0.3, -0.4]),
]


def position(token, lp, rank=3):
    """The sampled token with its rank, then two other tokens ranked 1 and 2."""
    return {token: Logprob(logprob=lp, rank=rank), 100: Logprob(logprob=-0.01, rank=1), 101: Logprob(-0.02, rank=2)}


def completion(i, tokens, lps, flat):
    positions = [position(t, lp) for t, lp in zip(tokens, lps)]
    if flat:
        container = FlatLogprobs()
        for p in positions:
            container.append(p)
    else:
        container = positions
    return CompletionOutput(index=i, text="", token_ids=tokens, cumulative_logprob=sum(lps), logprobs=container)


def request_outputs(flat):
    return [
        RequestOutput(request_id=str(r), prompt="p", prompt_token_ids=[0], prompt_logprobs=None, finished=True,
                      outputs=[completion(j, *SAMPLES[2 * r + j], flat) for j in range(2)])
        for r in range(2)
    ]


EXPECTED = torch.tensor([
    [-0.5, -1.25, -0.125, 0.0],
    [-2.0, 0.0, 0.0, 0.0],
    [-0.75, -0.25, 0.0, 0.0],
    [-0.1, -0.2, -0.3, -0.4],
])


@pytest.mark.parametrize("flat", [False, True], ids=["list-of-dicts", "FlatLogprobs"])
def test_request_outputs_become_rows(flat):
    values, mask = rollout_logprobs(request_outputs(flat))
    assert values.dtype == torch.float32 and values.shape == (4, 4)
    torch.testing.assert_close(values, EXPECTED)
    assert mask.sum(-1).tolist() == [3, 1, 2, 4]


@pytest.mark.parametrize("flat", [False, True], ids=["list-of-dicts", "FlatLogprobs"])
def test_completion_outputs_and_a_fixed_length(flat):
    completions = [c for r in request_outputs(flat) for c in r.outputs]
    values, mask = rollout_logprobs(completions, length=6, dtype=torch.float64)
    assert values.shape == (4, 6) and values.dtype == torch.float64
    assert values[:, 4:].abs().sum() == 0 and not mask[:, 4:].any()
    with pytest.raises(ValueError, match="a completion has 4 tokens, more than length=3"):
        rollout_logprobs(completions, length=3)


def test_the_sampled_token_is_read_even_when_it_is_also_a_top_token():
    # The sampled token 100 is also the rank-1 alternative: vLLM's dict keeps one entry, FlatLogprobs both.
    for flat in (False, True):
        c = completion(0, [100], [-0.01], flat)
        assert sampled_logprobs(c) == [-0.01]


def test_missing_logprobs_say_how_to_ask_for_them():
    c = CompletionOutput(index=0, text="", token_ids=[1, 2], cumulative_logprob=None, logprobs=None)
    with pytest.raises(ValueError, match=r"SamplingParams\(logprobs=0\)"):
        rollout_logprobs([c])


@pytest.mark.parametrize("flat", [False, True], ids=["list-of-dicts", "FlatLogprobs"])
def test_a_missing_sampled_token_is_an_error(flat):
    c = completion(0, [7, 3], [-0.5, -1.0], flat)
    c.token_ids = [7, 4]  # token 4 was never in the logprobs
    with pytest.raises(ValueError, match="position 1: the sampled token 4 is missing"):
        sampled_logprobs(c)


def test_positions_must_match_tokens():
    c = completion(0, [7, 3], [-0.5, -1.0], False)
    c.token_ids = [7, 3, 9]
    with pytest.raises(ValueError, match="has 3 tokens but logprobs for 2 positions"):
        sampled_logprobs(c)


def test_rows_feed_the_rollout_corrections():
    # Trainer log-probs: the sampler's - log 2 on every token (at most 0, as log-probs are): TIS token weights
    # min(1/2, 2) = 1/2 everywhere.
    values, mask = rollout_logprobs(request_outputs(False))
    old = values - math.log(2.0)
    b = rlstab.TokenBatch(logprobs=old.clone(), old_logprobs=old, rollout_logprobs=values, response_mask=mask,
                          advantages=torch.ones(4))
    out = rlstab.load("tis").compile()(b)
    assert out.metrics["reweight/tis/mean"] == pytest.approx(0.5)


def test_which_classes_ran():
    """Records whether vLLM's own classes were used (True in an environment with vLLM installed)."""
    assert REAL_VLLM == (CompletionOutput.__module__ == "vllm.outputs")
