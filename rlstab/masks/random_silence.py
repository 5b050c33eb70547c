"""A control: silence positive-advantage tokens chosen at random, as many as a fraction or as another mask."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rlstab.lazy import torch
from rlstab.masks.base import Mask, positive
from rlstab.tokens import Tokens

_M32 = 0xFFFFFFFF
_FIRST_NORMAL = 0x00800000  # float32 bits of the smallest positive normal number
_NORMALS = 0x7F800000 - _FIRST_NORMAL  # bit patterns of the positive normal float32 numbers, in order


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for int64 ``x`` in [0, 2**32), in 16-bit halves of ``c`` so no product overflows int64."""
    low = x * (c & 0xFFFF)  # < 2**48
    high = ((x * (c >> 16)) & 0xFFFF) << 16  # < 2**32
    return (low + high) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply, constants 0x7feb352d and 0x846ca68b), int64 in [0, 2**32)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def random_keys(t: Tokens, seed: int) -> torch.Tensor:
    """``[B, T]`` float32 keys, one per token, from (seed, the response's content, the token's rank in it).

    With ``bits`` the float32 bits of ``old_logprobs`` and ``r`` the token's rank among its row's
    valid tokens (0, 1, ...):

        c_i  = mix32( sum_{valid t} mix32(bits_{i,t} ^ mix32(r_{i,t})) mod 2**32 )   (the response's key)
        k    = mix32( c_i ^ mix32(seed ^ mix32(r_{i,t})) )
        key  = float32 with bits 2**23 + (k mod (0x7F800000 - 2**23))              (a positive normal number)

    Order-preserving: a smaller ``k mod ...`` is a smaller key, so the keys order tokens as
    independent uniform draws would. Padding gets a key too (any finite value; never a candidate).
    """
    valid = t.valid_bool
    rank = (torch.cumsum(valid.to(torch.int64), dim=-1) - 1).clamp_(min=0)
    old = torch.where(valid, t.old_logprobs, 0.0).contiguous()
    bits = old.view(torch.int32).to(torch.int64) & _M32
    at_rank = mix32(rank)
    row = (mix32(bits ^ at_rank) * valid).sum(-1, keepdim=True)
    k = mix32(mix32(row) ^ mix32(at_rank ^ (seed & _M32)))
    return ((k % _NORMALS) + _FIRST_NORMAL).to(torch.int32).view(torch.float32)


class RandomSilence(Mask):
    r"""A control: silence tokens chosen uniformly at random, as many as a fraction of them or as another mask.

    Among the *candidates* (valid tokens, with $A > 0$ under ``positive_only``; $n$ of them in the
    step, over every micro-batch and rank), silence the $m$ with the smallest random keys:

    $$1 - \text{keep}_t = \text{candidate}_t \cdot \Big([\text{key}_t < \kappa]
      + \frac{m - b}{c}\,[\text{key}_t = \kappa]\Big), \qquad \kappa = \text{key}_{(m)}$$

    ($\text{key}_{(j)}$ the j-th smallest candidate key, $b$ the candidates with a key below
    $\kappa$ and $c \ge 1$ those with a key equal to it; nothing is silenced when $m = 0$), where

    - ``fraction: f``: $m = \lfloor f n + 1/2 \rfloor$, the nearest count to $f n$;
    - ``match: <mask>``: $m$ = the candidates that mask silences in the same step (a mask of
      ``masks`` by index or label, or of ``shadow_masks`` by ``shadow/<label>``).

    What it tests: S2T silences about 1e-4 of tokens, all with $A > 0$. Whether its gain comes
    from *which* tokens it silences, or from silencing some positive-advantage tokens at all (less
    push on positive samples, a smaller kept denominator), is answered by an arm that silences as
    many $A > 0$ tokens at random: ``masks: [{kind: random_silence, match: shadow/s2t}]`` with
    ``shadow_masks: [{kind: s2t}]`` (S2T measured, not acting) silences, step by step, exactly as
    many tokens as S2T would have.

    Design decisions:

    - **The draw** is a counter-based hash, not a generator: each token's key is a hash of
      (``seed``, its response's content, its rank among the response's tokens); see
      [`random_keys`][rlstab.masks.random_silence.random_keys]. The response's content is the
      float32 bits of its ``old_logprobs`` (the sampling policy's, the same in gather and loss; a
      batch without them uses ``logprobs``, then the draw is reproducible as far as the forward
      pass is). So a token's key does not depend on the micro-batch split, the rank, the row's
      place in the batch or the padding layout, and the cut $\kappa$ is an exact order statistic
      over the step's candidates (gathered as the entropy quantiles, always in the exact mode,
      whatever ``quantile_mode``). Hence the silenced tokens, and their number $m$, are the same
      whatever the micro-batch split and the number of ranks. A ``torch.Generator`` over each
      micro-batch would not be.
    - **Ties, and exactness.** Identical responses (the same old log-probabilities: in practice
      the same prompt and the same tokens) draw identical keys, and they are common where answers
      are short. Nothing in the batch tells such copies apart but their place in it, which the
      split and the ranks change, so ties at the cut are resolved by sharing: the $c$ candidates
      whose key equals $\kappa$ are each silenced by $(m - b)/c$ of a token. The silenced mass is
      exactly $m$ in every step (up to float32 rounding of the share), whatever the ties, the
      split and the ranks. Copies at the cut are the same token in the same context with the same
      advantage, so under token-sum and token-mean aggregations (DAPO's, STAPO's) the update is
      the one silencing $m - b$ of them wholly would give; under a per-sequence mean it differs
      only in those rows' kept-token denominators (by less than one token each). With distinct
      keys (about $2^{31}$ values) $c = 1$ and every token is kept or silenced whole. The
      previous rule (silence iff $\text{key} < \text{key}_{(m+1)}$) silenced none of a tied
      pair at the cut: with one-token targets and duplicated answers it under-dosed the control.
      The same on CPU and GPU (integer keys; checked on an H100).
    - **positive_only** (default true): candidates are the valid tokens with $A > 0$, the
      population S2T silences from, so the control differs from S2T only in which tokens.
    - **match** counts the matched mask's silenced tokens among these candidates (for S2T all it
      silences). It may not name itself, another ``random_silence``, or a rollout rejection
      (whose rejected tokens are padding, not candidates). Matching costs one more host read per
      step (the count).
    - **seed** (default 0) fixes the draw; the same response gets the same keys at every step
      it is seen (change the seed per run to vary them).

    Reports ``mask/<label>/target`` ($m$) and ``/candidates`` ($n$) (step).
    """

    kind: Literal["random_silence"] = "random_silence"
    fraction: float | None = Field(None, ge=0.0, le=1.0)
    """Silence this fraction of the step's candidates (rounded to the nearest count); or give ``match``."""
    match: int | str | None = None
    """Silence as many candidates as this mask silences in the step: an index into ``masks``, a mask's label
    (``s2t``), or a shadow mask's (``shadow/s2t``); or give ``fraction``."""
    positive_only: bool = True
    """Candidates are the valid tokens with A > 0 (S2T's); false: every valid token."""
    seed: int = Field(0, ge=0, lt=2**32)
    """Seed of the per-token hash."""

    counted: ClassVar[bool] = True
    threshold_names: ClassVar[tuple[str | None, ...]] = ("target", "candidates", None, None)
    """The step's ``(m, n, cut, share)``: m and n reported, the cut (a key) and the tied candidates' share not."""

    @model_validator(mode="after")
    def _one_mode(self):
        if (self.fraction is None) == (self.match is None):
            raise ValueError("give exactly one of fraction (a share of the candidates) or match (another mask)")
        return self

    def candidates(self, t: Tokens) -> torch.Tensor:
        """``[B, T]`` float 0/1: the valid tokens it may silence (with A > 0 under ``positive_only``)."""
        if not self.positive_only:
            return t.valid.clone()
        return positive(t.advantage_rows).expand_as(t.valid) * t.valid

    def keys(self, t: Tokens) -> torch.Tensor:
        return random_keys(t, self.seed)

    def target(self, candidates: int, matched: int | None) -> int:
        """m: the number of candidates to silence, of ``candidates`` in the step (``matched``: the matched mask's)."""
        if self.match is not None:
            return min(matched, candidates)
        return min(int(self.fraction * candidates + 0.5), candidates)

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        if threshold is None:  # no candidate in the step
            return torch.ones_like(t.logprobs)
        _, _, cut, share = threshold
        keys = self.keys(t)
        silenced = torch.lt(keys, cut, out=torch.empty_like(t.logprobs))
        silenced.add_(torch.eq(keys, cut).to(silenced.dtype).mul_(share)).mul_(self.candidates(t))
        return silenced.neg_().add_(1.0)

    def describe(self) -> str:
        who = "valid tokens with A > 0" if self.positive_only else "valid tokens"
        if self.match is not None:
            many = f"as many as {self.match!r} silences in the step"
        else:
            many = f"a fraction {self.fraction:g} of them"
        return f"random_silence (a control): silence {many}, uniformly at random among the step's {who} (seed {self.seed})"
