"""The share of an optimizer step's policy gradient carried by the tokens a mask silences.

Definitions. Let ``theta`` be the policy's trainable parameters (``Policy.trainable_parameters()``:
every weight of the tiny model, the top layers and final norm of SmolLM2) and, for each valid
response token t of the step, ``c_t = dL / d logp_t`` the per-token coefficient of the *full* loss
L (the objective with its masks and regularisers removed; see ``rlstab.trainer.mechanism.meter``),
aggregation weights, importance ratios, clipping and advantages included. Then

    g_full = sum_t c_t * d logp_t / d theta           (the full loss's policy gradient)
    g_S    = sum_{t in S} c_t * d logp_t / d theta     (the summed contribution of the tokens in S)

for the tokens S a mask silences (``CompiledObjective.mask_silences``), and

    share  = ||g_S|| / ||g_full||
    cosine = <g_S, g_full> / (||g_S|| ||g_full||)

over the concatenation of every trainable parameter, in float64, with the gradients summed over
every micro-batch of the step (and, in the trainer, over the step's optimizer updates).

- A mask that silences nothing has g_S = 0: share 0, cosine undefined (None).
- A mask that silences every token with a coefficient has g_S = g_full: share 1, cosine 1.
- ``share`` is not bounded by 1: contributions of different tokens and responses cancel in
  g_full, so a few tokens can carry a gradient larger than the whole step's (and point against it,
  cosine < 0). This cancellation is what a logit-space bound on single tokens cannot see, which
  is why the share is measured in parameter space.
- With ``||g_full|| = 0`` (every advantage zero) share and cosine are None.

Cost: one backward pass through the policy per micro-batch for g_full and one more per mask whose
silenced tokens have a non-zero coefficient there (``torch.autograd.grad``; nothing is written to
the parameters' ``.grad``). A mask that silences no such token costs nothing, and one whose silenced
tokens are exactly the tokens with a coefficient reuses g_full's pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlstab.lazy import torch


def _flat(grads, params) -> torch.Tensor:
    """The gradients of ``params`` as one float64 vector (zeros for a parameter the output does not reach)."""
    return torch.cat([
        (torch.zeros(p.numel(), dtype=torch.float64, device=p.device) if g is None else g.detach().reshape(-1).double())
        for g, p in zip(grads, params)
    ])


def parameter_gradient(logprobs: torch.Tensor, params, weights: torch.Tensor) -> torch.Tensor:
    """``sum_t weights_t * d logprobs_t / d theta`` as one float64 vector over ``params`` (one backward, graph kept)."""
    grads = torch.autograd.grad(logprobs, params, grad_outputs=weights.to(logprobs.dtype), retain_graph=True,
                                allow_unused=True)
    return _flat(grads, params)


def parameter_gradients(logprobs: torch.Tensor, params, weights: torch.Tensor, *, batched: bool = False) -> torch.Tensor:
    """``[K, P]``: row k is ``sum_t weights[k, t] * d logprobs_t / d theta`` (float64), for ``weights`` ``[K, *logprobs.shape]``.

    ``batched``: one vectorised backward (``torch.autograd.grad(..., is_grads_batched=True)``, vmap over the K weight
    tensors) instead of K backward passes; the same numbers (a test checks them equal), but on the tiny model on one
    CPU thread it took about twice the loop's time, so the loop is the default. The graph is kept.
    """
    if weights.shape[0] == 0:
        return torch.zeros(0, sum(p.numel() for p in params), dtype=torch.float64)
    if not batched:
        return torch.stack([parameter_gradient(logprobs, params, w) for w in weights])
    grads = torch.autograd.grad(logprobs, params, grad_outputs=weights.to(logprobs.dtype), retain_graph=True,
                                allow_unused=True, is_grads_batched=True)
    k = weights.shape[0]
    return torch.cat([
        (torch.zeros(k, p.numel(), dtype=torch.float64, device=p.device) if g is None else g.detach().reshape(k, -1).double())
        for g, p in zip(grads, params)
    ], dim=1)


@dataclass
class GradientShares:
    """g_full and each label's g_S, summed over the micro-batches :meth:`add` is given.

    Attributes:
        full: g_full so far (float64 vector), None before the first ``add``.
        silenced_grads: label -> its g_S so far (None while zero).
        silenced: label -> how many valid tokens it silenced.
        backward_passes: the backward passes taken (the instrument's cost).
    """

    full: torch.Tensor | None = None
    silenced_grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    silenced: dict[str, int] = field(default_factory=dict)
    backward_passes: int = 0

    def add(self, logprobs: torch.Tensor, params, coefficients: torch.Tensor, silences: dict[str, torch.Tensor]) -> None:
        """One micro-batch: ``logprobs`` ``[B, T]`` with its graph to ``params``, the full loss's ``coefficients``
        ``[B, T]`` (0 off the valid tokens), and ``silences``: label -> ``[B, T]`` 1.0 on the tokens it silences."""
        c = coefficients.detach()
        full = parameter_gradient(logprobs, params, c)
        self.backward_passes += 1
        self.full = full if self.full is None else self.full + full
        for label, silenced in silences.items():
            weights = c * silenced.to(c.dtype)
            self.silenced[label] = self.silenced.get(label, 0) + int(silenced.sum())
            if not bool((weights != 0).any()):
                part = None  # g_S of this micro-batch is exactly 0
            elif torch.equal(weights, c):
                part = full  # S holds every token with a coefficient: g_S = g_full exactly
            else:
                part = parameter_gradient(logprobs, params, weights)
                self.backward_passes += 1
            before = self.silenced_grads.get(label)
            self.silenced_grads[label] = part if before is None else (before if part is None else before + part)

    @property
    def full_norm(self) -> float:
        return 0.0 if self.full is None else float(self.full.norm())

    def result(self) -> dict[str, dict]:
        """label -> ``{"share", "cosine", "silenced"}`` (share and cosine None where undefined, see the module)."""
        full_norm = self.full_norm
        out = {}
        for label, count in self.silenced.items():
            g = self.silenced_grads.get(label)
            norm = 0.0 if g is None else float(g.norm())
            share = norm / full_norm if full_norm > 0 else None
            cosine = None
            if norm > 0 and full_norm > 0:  # clamped: rounding may carry an exact 1 past it
                cosine = min(1.0, max(-1.0, float(g @ self.full) / (norm * full_norm)))
            out[label] = {"share": share, "cosine": cosine, "silenced": count}
        return out
