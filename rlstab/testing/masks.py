"""Tokens a mask silences get exactly zero gradient; tokens it keeps train.

A mask's contract is binary: ``keep`` is 1.0 (the token trains) or 0.0 (silenced) on every valid
token. A "soft" 0.01 is not silence: the token still pushes the policy, and the metrics that
count silenced tokens lie. The check hosts the mask alone under ``surrogate: none`` (l = -A r,
whose gradient -A r is never zero) with per-token advantages drawn from a normal distribution,
and without regularisers (they act on every valid token by design), then compares the gradient
of the compiled loss with the mask's own ``keep`` (with the step's threshold):

- ``keep`` is exactly 0 or 1 on valid tokens;
- every valid token with keep 0 has gradient exactly 0; every valid token with keep 1 has a non-zero one;
- ``mask/<label>/silenced`` counts the silenced tokens;
- the mask silences at least one valid token and keeps at least one on the kit's batch: a
  configuration that silences nothing (or everything) proves nothing, so the check refuses it.
"""

from __future__ import annotations

from rlstab.testing.batches import make_batch
from rlstab.testing.hosting import family_name, host_objective
from rlstab.testing.report import checking
from rlstab.testing.running import loss_and_grad
from rlstab.tokens import Tokens


def check_silenced_tokens_get_zero_gradient(component, *, host=None, seed: int = 0) -> None:
    """The gradient of the compiled loss is zero exactly on the tokens ``keep`` silences (masks only)."""
    with checking(component, "check_silenced_tokens_get_zero_gradient"):
        assert family_name(component) == "masks", "applies to masks only"
        objective = host_objective(component, host, masks=[], regularisers=[], surrogate={"kind": "none"})
        loss_fn = objective.compile()
        batch = make_batch(loss_fn, seed=seed, advantages="token")
        stats = objective.compile().gather([batch])
        out, grads = loss_and_grad(loss_fn, batch, step=stats)
        grad = grads["logprobs"]

        t = Tokens.from_batch(batch, objective.log_ratio_clamp)
        t.set_advantages(batch.advantages)
        keep = component.keep(t, stats.thresholds[0]).detach()
        keep = keep.expand(batch.response_mask.shape)
        valid = batch.response_mask
        on_valid = keep[valid]
        binary = (on_valid == 0) | (on_valid == 1)
        assert bool(binary.all()), (
            f"keep must be exactly 0 or 1 on valid tokens, got {on_valid[~binary][0].item()!r} "
            "(a fractional weight belongs in a reweighter)"
        )
        silenced, kept = valid & (keep == 0), valid & (keep == 1)
        n_silenced, n_kept = int(silenced.sum()), int(kept.sum())
        assert n_silenced > 0, "silences no valid token of the kit's batch: the check would prove nothing (configure it to fire)"
        assert n_kept > 0, "silences every valid token of the kit's batch: the check would prove nothing"
        leaking = grad[silenced]
        assert bool((leaking == 0).all()), (
            f"{int((leaking != 0).sum())} of {n_silenced} silenced tokens get gradient (e.g. {leaking[leaking != 0][0].item()!r})"
        )
        assert bool((grad[kept] != 0).all()), f"{int((grad[kept] == 0).sum())} kept tokens get no gradient"
        reported = out.metrics[f"mask/{component.kind}/silenced"]
        assert reported == n_silenced, f"mask/{component.kind}/silenced reports {reported}, but keep silences {n_silenced}"
