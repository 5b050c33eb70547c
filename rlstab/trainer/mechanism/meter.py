"""The mechanism instruments over the micro-batches of an optimizer step, for the trainer and the audit.

The full loss. ``g_full`` and the coefficients ``c_t`` (``rlstab.trainer.mechanism.share``) are
those of :func:`mask_free`'s objective: the same objective without its masks (acting and shadow)
and without its regularisers, compiled once per meter. Its own ``gather`` runs over the same
micro-batches as the acting objective's, from the acting objective's component state before that
gather, so advantages, dynamic sampling, the reweighters' and the surrogate's step values are the
step's; only what masks change differs: every valid token is kept, and an aggregation counting kept
tokens counts them all. The regularisers go because they act on every valid token whatever the
masks: what a mask silences is policy-gradient term, and g_full is that term's gradient.

Each coefficient is ``d L_full / d logp_t`` read by autograd from a fresh leaf tensor of
log-probabilities (the compiled loss gives it in closed form), then backpropagated through the
policy (``GradientShares``). Nothing touches the acting objective's state, the parameters' ``.grad``
or torch's random stream, so a step trains exactly as without the instruments.

Cost per micro-batch: one forward of the policy (with grad), the full loss on a leaf, one backward
for g_full and one per mask with silenced tokens that carry a coefficient; plus one ``gather`` of
the full objective per optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rlstab.lazy import torch
from rlstab.trainer.mechanism.logit_grad import TokenGradients, distribution_stats
from rlstab.trainer.mechanism.share import GradientShares

if TYPE_CHECKING:
    from rlstab.batch import TokenBatch
    from rlstab.compiled import CompiledObjective, StepStats
    from rlstab.objective import Objective
    from rlstab.trainer.policy import Policy, Rollout

SPACE = "parameters"
"""Where the gradient share is measured: the policy's trainable parameters."""

BatchOf = Callable[[list[int], torch.Tensor, torch.Tensor], "TokenBatch"]
"""``(rows, logprobs, entropy) -> TokenBatch``: a micro-batch of the step's rollout with the given log-probabilities."""


def mask_free(objective: Objective) -> Objective:
    """``objective`` without masks (acting or shadow) and regularisers: the full loss of the instruments."""
    update: dict = {"masks": [], "regularisers": []}
    if "shadow_masks" in type(objective).model_fields:
        update["shadow_masks"] = []
    return objective.model_copy(update=update)


def full_coefficients(full: CompiledObjective, batch_of: BatchOf, rows: list[int], logprobs: torch.Tensor,
                      entropy: torch.Tensor, stats: StepStats) -> torch.Tensor:
    """``c_t = d L / d logp_t`` of ``full``'s loss on the micro-batch ``rows`` (``[B, T]``, 0 where it has no gradient)."""
    leaf = logprobs.detach().clone().requires_grad_(True)
    out = full(batch_of(rows, leaf, entropy.detach()), step=stats)
    (grad,) = torch.autograd.grad(out.loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf) if grad is None else grad.detach()


class StepMeter:
    """The instruments of one step of ``loss_fn``: :meth:`measure` each optimizer update, then :meth:`result`.

    Attributes:
        shares: the gradient sums of every update measured so far.
        tokens: the per-token logit-gradient norms of every update measured so far.
    """

    def __init__(self, loss_fn: CompiledObjective):
        self.loss_fn = loss_fn
        self.full = mask_free(loss_fn.objective).compile()
        self.shares = GradientShares()
        self.tokens = TokenGradients()

    def measure(
        self, policy: Policy, rollout: Rollout, parts: Sequence[list[int]], batch_of: BatchOf,
        current: tuple[torch.Tensor, torch.Tensor], stats: StepStats, state_before: dict,
    ) -> None:
        """Measure one optimizer update at the current parameters.

        ``parts``: the micro-batches' rows of ``rollout``; ``batch_of`` builds a micro-batch;
        ``current``: the ``(logprobs, entropy)`` (``[N, T]``, no grad) the acting objective's
        ``gather`` was given the micro-batches with, ``stats`` its result, ``state_before`` its
        ``state_dict()`` from before that gather.
        """
        current_logprobs, current_entropy = current
        with torch.random.fork_rng(devices=[]):
            self.full.load_state_dict(state_before)
            gathered = [batch_of(rows, current_logprobs[rows], current_entropy[rows]) for rows in parts]
            full_stats = self.full.gather(gathered, distributed=False)
            params = policy.trainable_parameters()
            for rows in parts:
                logprobs, entropy, sum_squares = distribution_stats(policy, rollout.rows(rows))
                entropy = entropy.detach()
                silences = self.loss_fn.mask_silences(batch_of(rows, logprobs.detach(), entropy), stats)
                c = full_coefficients(self.full, batch_of, rows, logprobs, entropy, full_stats)
                self.shares.add(logprobs, params, c, silences)
                self.tokens.add(logprobs, entropy, sum_squares, c, rollout.response_mask[rows])

    def result(self) -> dict:
        """The step's ``mechanism`` row field (``docs/audit.md``, "Mechanism instruments")."""
        return {
            "space": SPACE,
            "full_grad_norm": self.shares.full_norm,
            "masks": self.shares.result(),
            "logit_grad": self.tokens.result(),
        }
