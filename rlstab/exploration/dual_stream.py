"""DEEP-GRPO's dual-stream loss: the main rollouts' loss plus lambda times the local branches' loss."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.exploration.base import StreamWeighting


class DualStream(StreamWeighting):
    r"""DEEP-GRPO's dual-stream objective (``dual_stream:``): each stream aggregated on its own.

    $$L = \mathrm{Agg}_{main}\bigl[\,l\,\bigr] + \lambda\,\mathrm{Agg}_{branch}\bigl[\,l\,\bigr]$$

    "Deep Dense Exploration for LLM Reinforcement Learning via Pivot-Driven Resampling" (DEEP-GRPO,
    arXiv 2602.14169): the main stream is the G rollouts sampled from each prompt (the global GRPO
    term); the branch stream is the K continuations resampled from each pivot of a failed rollout
    (the local corrective term), with advantages local to each pivot's branch group (their own
    ``group_ids``). The rows of the branch stream are marked by ``TokenBatch.is_branch``. The shared
    prefix is gradient-masked by construction: a branch row's prompt is the original prompt plus
    the prefix, and its response (``response_mask``) is the suffix alone, as in the authors' agent
    loop.

    Each stream has its own denominators (tokens, responses) over the whole step, with the
    objective's aggregation: with ``token-mean`` this is the authors' ``separate_stream_mean``
    (``dp_actor._mini_batch_step``: sum over main tokens / main tokens + lambda * sum over branch
    tokens / branch tokens). Regularisers are split the same way (the authors' KL term is). The
    paper writes the per-trajectory form (1/G sum L_main + lambda / |T_fail| sum 1/K sum L_aux):
    that is this component with ``seq-mean-token-mean``. lambda = 1 is the authors' default
    (``branch_chain_loss_lambda``; their ablations 0.1, 0.5, 2); lambda = 0 leaves the main stream's
    loss alone, exactly (the branch rows then change nothing).
    """

    kind: Literal["dual-stream"] = "dual-stream"
    branch_weight: float = Field(1.0, ge=0.0, le=100.0)
    """lambda: the weight of the branch stream's aggregated loss (DEEP-GRPO's default 1)."""

    reads: ClassVar[frozenset[str]] = frozenset({"is_branch"})

    def describe(self) -> str:
        return (
            f"dual-stream (DEEP-GRPO): L = Agg over main rows + {self.branch_weight:g} * Agg over branch rows "
            "(TokenBatch.is_branch), each with its own step denominators"
        )
