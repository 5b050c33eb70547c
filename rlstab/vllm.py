"""vLLM's per-token log-probabilities as ``TokenBatch.rollout_logprobs``.

vLLM returns, for every generated token, the log-probability of the sampled token (and of the
top-k alternatives) when sampling asks for them: ``SamplingParams(logprobs=0)``. This module turns
those outputs into the ``[B, T]`` tensor that the rollout-mismatch corrections read (TIS, IcePop,
rejection sampling, the veto, VCPO's ESS). It imports nothing from vLLM: it reads the documented
structure (checked against vLLM 0.32.0's ``vllm.outputs`` and ``vllm.logprobs``):

- a ``RequestOutput`` has ``outputs``: its completions (``n`` per prompt), in order;
- a ``CompletionOutput`` has ``token_ids`` (the generated tokens) and ``logprobs``: one entry per
  generated token, either a list of ``{token_id: Logprob}`` dicts or a ``FlatLogprobs`` (flat lists
  ``token_ids``/``logprobs`` with ``start_indices``/``end_indices`` per position, the sampled token
  first); ``Logprob.logprob`` is the float. ``None`` when logprobs were not requested.

Which distribution the numbers come from is vLLM's ``logprobs_mode``: ``raw_logprobs`` (the
default) is the model's distribution before temperature, top-k/top-p and penalties;
``processed_logprobs`` is the one the token was sampled from. For a correction of the sampler
against the trainer, the two must describe the same distribution: use ``processed_logprobs`` when
sampling with a temperature and have the trainer apply the same temperature (as veRL does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlstab.lazy import torch


def _completions(outputs: Iterable[Any]) -> list[Any]:
    """Completions in order: a ``RequestOutput`` contributes each of its ``outputs``."""
    flat = []
    for out in outputs:
        if hasattr(out, "outputs"):
            flat.extend(out.outputs)
        else:
            flat.append(out)
    return flat


def _value(entry: Any) -> float:
    return float(entry.logprob if hasattr(entry, "logprob") else entry)


def sampled_logprobs(completion: Any) -> list[float]:
    """The log-probability of each generated token of one ``CompletionOutput``."""
    token_ids = list(completion.token_ids)
    lp = completion.logprobs
    if lp is None:
        raise ValueError(
            "a vLLM completion carries no logprobs: sample with SamplingParams(logprobs=0) "
            "(0 returns the sampled token's log-probability only)"
        )
    if len(lp) != len(token_ids):
        raise ValueError(f"a vLLM completion has {len(token_ids)} tokens but logprobs for {len(lp)} positions")
    if hasattr(lp, "start_indices"):  # FlatLogprobs: the sampled token is each position's first entry
        values = []
        for t, token in enumerate(token_ids):
            span = range(lp.start_indices[t], lp.end_indices[t])
            i = next((i for i in span if lp.token_ids[i] == token), None)
            if i is None:
                raise ValueError(f"position {t}: the sampled token {token} is missing from vLLM's logprobs")
            values.append(float(lp.logprobs[i]))
        return values
    values = []
    for t, (token, position) in enumerate(zip(token_ids, lp)):
        if not isinstance(position, Mapping) or token not in position:
            raise ValueError(f"position {t}: the sampled token {token} is missing from vLLM's logprobs")
        values.append(_value(position[token]))
    return values


def rollout_logprobs(
    outputs: Iterable[Any] | Sequence[Any],
    *,
    length: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rollout_logprobs, response_mask)``, both ``[B, T]``, from vLLM outputs.

    ``outputs``: ``RequestOutput`` objects (each contributes its completions, in order) or
    ``CompletionOutput`` objects, one row each. Rows are right-padded with 0.0 (mask False) to
    ``length`` (the trainer's padded response length; default the longest completion), so they line
    up with the trainer's ``response_mask`` when responses are right-padded from the first generated
    token. Raises ValueError when a completion has no logprobs, when a sampled token is missing from
    its position's logprobs, or when a completion is longer than ``length``.
    """
    rows = [sampled_logprobs(c) for c in _completions(outputs)]
    longest = max((len(r) for r in rows), default=0)
    T = longest if length is None else length
    if longest > T:
        raise ValueError(f"a completion has {longest} tokens, more than length={T}")
    values = torch.zeros(len(rows), T, dtype=torch.float64)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[i, : len(row)] = True
    return values.to(dtype=dtype, device=device), mask.to(device)
