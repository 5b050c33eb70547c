"""How veRL aggregates the terms it adds beside an rlstab policy loss, and what to set so they match the objective.

Under ``loss_mode=rlstab`` the objective's ``aggregation`` decides the policy term, and veRL's
``actor_rollout_ref.actor.loss_agg_mode`` is not read for it. veRL 0.9.1 still aggregates its own
terms with that mode: the entropy bonus (``entropy_coeff``) and the KL loss (``use_kl_loss``) in
``verl.workers.utils.losses.ppo_loss``, and the ``actor/entropy`` metric in the driver
(``ray_trainer.py``), each through ``core_algos.agg_loss``, which divides
``seq-mean-token-sum-norm`` by ``loss_scale_factor`` (None: the padded response length). Its own
loss modes aggregate the policy term with it too, so a run migrated from them keeps the mode veRL
ran with. Its default is ``token-mean`` (``verl.workers.config.ActorConfig``).

OpenRLHF 0.11.2 aggregates its entropy bonus and KL loss as a token mean whatever
``--actor.loss_agg_mode`` says (``aggregate_loss`` with its default), and TRL's own terms are refused
in favour of the objective's regularisers: neither has a setting to match.

Torch-free and veRL-free: [`verl_overrides`][rlstab.adapters.trainer_aggregation.verl_overrides]
is what ``rlstab validate --trainer verl`` prints (against veRL's defaults) and what the adapter's
start-up check warns about (against the run's config).
"""

from __future__ import annotations

from typing import Any

VERL_ACTOR = "actor_rollout_ref.actor"
VERL_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""veRL 0.9.1's ``loss_agg_mode`` values (``ActorConfig.__post_init__``), the same names as rlstab's aggregation kinds."""
VERL_DEFAULT_MODE = "token-mean"
"""veRL 0.9.1's default ``loss_agg_mode`` (``ActorConfig``; a test in the veRL environment checks it)."""
VERL_OWN_TERMS = "its entropy bonus (entropy_coeff), its KL loss (use_kl_loss) and its actor/entropy metric"
NORMALISED = "seq-mean-token-sum-norm"


def verl_overrides(aggregation: Any, loss_agg_mode: str = VERL_DEFAULT_MODE,
                   loss_scale_factor: int | None = None) -> list[str] | None:
    """The Hydra overrides that make veRL aggregate like ``aggregation`` (an objective's), from the given settings.

    ``[]`` when ``loss_agg_mode`` (and, for ``seq-mean-token-sum-norm``, ``loss_scale_factor``)
    already aggregate as the objective does; None when no ``loss_agg_mode`` does (an aggregation
    kind of a plugin). ``norm: max_length`` is veRL's ``loss_scale_factor=null``, an integer norm
    that integer. Only the kind and the norm are compared: veRL's terms always count every valid
    token, an objective's ``count: kept`` has no veRL counterpart.
    """
    kind = aggregation.kind
    if kind not in VERL_MODES:
        return None
    out = [] if loss_agg_mode == kind else [f"{VERL_ACTOR}.loss_agg_mode={kind}"]
    if kind == NORMALISED:
        norm = None if aggregation.norm == "max_length" else aggregation.norm
        if loss_scale_factor != norm:
            out.append(f"{VERL_ACTOR}.loss_scale_factor={'null' if norm is None else norm}")
    return out


def verl_need(aggregation: Any) -> str:
    """Why the objective needs :func:`verl_overrides` against veRL's defaults (the line ``validate`` prints)."""
    return f"aggregation ({aggregation.kind}): veRL aggregates {VERL_OWN_TERMS} with loss_agg_mode, {VERL_DEFAULT_MODE} by default"


def verl_warning(aggregation: Any, loss_agg_mode: str, loss_scale_factor: int | None,
                 defaults: tuple[str, int | None] = (VERL_DEFAULT_MODE, None)) -> str | None:
    """The start-up warning when veRL's settings aggregate unlike ``aggregation``; None when they agree.

    ``defaults``: veRL's own ``(loss_agg_mode, loss_scale_factor)``, so the line says when a value is one.
    """
    wanted = verl_overrides(aggregation, loss_agg_mode, loss_scale_factor)
    if wanted == []:
        return None
    current = f"{VERL_ACTOR}.loss_agg_mode={loss_agg_mode}"
    if loss_agg_mode == NORMALISED:
        current += f" with loss_scale_factor={'null' if loss_scale_factor is None else loss_scale_factor}"
    if loss_agg_mode == defaults[0] and (loss_agg_mode != NORMALISED or loss_scale_factor == defaults[1]):
        current += " (veRL's default)"
    fix = (f"set {' '.join(wanted)} to aggregate them as the policy loss, or change aggregation in the objective"
           if wanted else "no loss_agg_mode aggregates as it does")
    return f"the objective aggregates the policy loss with {_named(aggregation)}, but veRL aggregates {VERL_OWN_TERMS} with {current}; {fix}"


def _named(aggregation: Any) -> str:
    norm = getattr(aggregation, "norm", None)
    return aggregation.kind if norm is None or aggregation.kind != NORMALISED else f"{aggregation.kind} (norm {norm})"
