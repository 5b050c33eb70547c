"""The names an expression may use: per-token features and functions. Nothing else resolves.

Every feature is a float32 tensor computed from the micro-batch's [`Tokens`][rlstab.tokens.Tokens]
(``[B, T]``, or ``[B, 1]`` for per-response features, or ``[1, T]`` for ``position``), never a
Python object an expression could reach into.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlstab.lazy import torch
from rlstab.tokens import Tokens


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    description: str
    compute: Callable[[Tokens], torch.Tensor]
    reads: frozenset[str] = frozenset()
    log_space: str | None = None
    """For a probability: the log-probability feature it is the exp of (comparisons with a positive
    constant run in log space, exactly as the S2T component compares log p with log tau_p)."""


def _position(t: Tokens) -> torch.Tensor:
    return torch.arange(t.valid.shape[-1], device=t.valid.device, dtype=torch.float32).unsqueeze(0)


def _field(name: str) -> Callable[[Tokens], torch.Tensor]:
    return lambda t: getattr(t, name)


_SPECS = (
    FeatureSpec("probability", "pi(y_t): the current policy's probability of the token", lambda t: t.logprobs.exp(),
                log_space="logprob"),
    FeatureSpec("logprob", "log pi(y_t) under the current policy", _field("logprobs")),
    FeatureSpec("surprisal", "-log pi(y_t), the token's surprisal under the current policy", lambda t: -t.logprobs),
    FeatureSpec("entropy", "H_t, the entropy of the policy's next-token distribution", _field("entropy"),
                reads=frozenset({"entropy"})),
    FeatureSpec("advantage", "A_t: the response's advantage (or the token's, for per-token advantages)",
                _field("advantage_rows")),
    FeatureSpec("ratio", "r_t = exp(clamp(logprob - old_logprob)), the importance ratio", _field("ratio")),
    FeatureSpec("old_probability", "pi_old(y_t): the sampling policy's probability (current when on-policy)",
                lambda t: t.old_logprobs.exp(), log_space="old_logprob"),
    FeatureSpec("old_logprob", "log pi_old(y_t)", _field("old_logprobs")),
    FeatureSpec("rollout_probability", "the inference engine's probability of the token (vLLM, SGLang)",
                lambda t: t.rollout_logprobs.exp(), reads=frozenset({"rollout_logprobs"}),
                log_space="rollout_logprob"),
    FeatureSpec("rollout_logprob", "the inference engine's log-probability of the token",
                _field("rollout_logprobs"), reads=frozenset({"rollout_logprobs"})),
    FeatureSpec("ref_logprob", "log pi_ref(y_t) under the reference policy", _field("ref_logprobs"),
                reads=frozenset({"ref_logprobs"})),
    FeatureSpec("position", "0-based index of the token in its response (its column)", _position),
    FeatureSpec("length", "the response's number of valid tokens", lambda t: t.valid.sum(-1, keepdim=True)),
)

FEATURES: dict[str, FeatureSpec] = {s.name: s for s in _SPECS}
"""Feature name -> its definition."""

FUNCTIONS: dict[str, tuple[int, int | None, str]] = {
    "abs": (1, 1, "abs(x): absolute value"),
    "log": (1, 1, "log(x): natural logarithm (log of a negative number is nan: comparisons with it are false)"),
    "exp": (1, 1, "exp(x)"),
    "min": (2, None, "min(a, b, ...): smallest argument, per token"),
    "max": (2, None, "max(a, b, ...): largest argument, per token"),
    "quantile": (2, 3, "quantile(x, q[, where]): the q-quantile of x over the step's valid tokens [where the condition holds]"),
}
"""Function name -> (least arguments, most arguments or None, description)."""

KEYWORDS = ("and", "or", "not")
