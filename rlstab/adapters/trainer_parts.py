"""What an objective needs from a trainer, and what each adapter says, at start-up, when its trainer cannot give it.

- **Parts only a trainer executes** ([`unexecutable`][rlstab.adapters.trainer_parts.unexecutable]).
  The loss (masks, reweighters, surrogate, aggregation, regularisers) runs wherever the compiled
  objective is called. The rest needs the trainer: the step's learning rate (``lr_scale``), each
  response's own gradient (``advantage: opob``), baselines over all of a prompt's rollouts
  (``advantage: opo``, ``grpo_passk``: veRL computes them itself), which prompts are drawn (``sampler:``), how
  rollouts are generated (``rollout:``), and branch rows in the batch (``dual_stream:``). rlstab's
  embedded trainer executes all of them; an adapter refuses each one its trainer cannot.
- **Tensors only a trainer supplies** ([`unsupplied`][rlstab.adapters.trainer_parts.unsupplied]):
  a component reading a ``TokenBatch`` field the trainer's loss call does not carry.
- **Regularisers the trainer adds itself** ([`added_by_trainer`][rlstab.adapters.trainer_parts.added_by_trainer]):
  the entropy bonus and the KL term, which veRL and OpenRLHF add outside the policy loss.

Every check reads the objective and its plan ([`Plan.of`][rlstab.compiler.plan.Plan.of]), never
its compiled loss, so that checking a config imports no torch. Which arguments each trainer's
adapter passes them is written once, in [`trainers`][rlstab.adapters.trainers], which the
adapters' start-up checks and ``rlstab validate --trainer`` both call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlstab.compiler.plan import Plan

VERL_SAMPLER = (
    "trainer.use_v1=False data.custom_cls.path=pkg://rlstab.adapters.verl.sampler "
    "data.custom_cls.name=GoldilocksDataset data.dataloader_num_workers=0"
)


# The optimal token baseline's kinds: they read the old policy's sum_v pi(v)^2, which only veRL computes.
TOKEN_BASELINES = ("optimal_token_baseline", "tir_optimal_token_baseline")
# Estimators whose baseline is built from all of a prompt's rollouts, which veRL computes in its driver over the
# training batch (``algorithm.adv_estimator``, same names); TRL and OpenRLHF compute only their own advantages.
ROLLOUT_GROUP_ESTIMATORS = ("opo", "grpo_passk")


def unexecutable(
    objective, trainer: str, *, sampler_hook: bool = False, token_baseline: bool = False, rollout_groups: bool = False
) -> list[str]:
    """One problem line per part of ``objective`` that the adapter of ``trainer`` cannot execute.

    ``token_baseline``: the trainer computes the optimal token baseline itself (veRL's
    ``algorithm.adv_estimator=optimal_token_baseline``, with its actor's ``sum_pi_squared``).
    ``rollout_groups``: the trainer computes ``ROLLOUT_GROUP_ESTIMATORS`` itself over whole rollout
    groups (veRL's ``algorithm.adv_estimator=opo`` / ``grpo_passk``).
    """
    problems = []
    if objective.lr_scale is not None:
        problems.append(
            f"lr_scale ({objective.lr_scale.kind}): the {trainer} adapter does not rescale the learning rate per step; "
            "remove lr_scale from the objective (rlstab's embedded trainer executes it)"
        )
    if objective.advantage.kind == "opob":
        problems.append(
            f"advantage (opob): needs each response's own gradient norm (TokenBatch.grad_sq_norms), which {trainer} "
            "does not compute (it backpropagates micro-batches, not single responses); use grpo here, or rlstab's "
            "embedded trainer"
        )
    if objective.advantage.kind in TOKEN_BASELINES and not token_baseline:
        problems.append(
            f"advantage ({objective.advantage.kind}): needs the old policy's sum_v pi(v)^2 per token "
            f"(TokenBatch.sum_pi_squared), which {trainer} neither computes nor passes (it computes its own advantages); "
            f"use grpo here, or veRL (algorithm.adv_estimator={objective.advantage.kind} "
            "actor_rollout_ref.actor.calculate_sum_pi_squared=True), or rlstab's embedded trainer"
        )
    if objective.advantage.kind == "maxrl":  # issue 31, H6: MaxRL is its advantage; no trainer computes it
        problems.append(
            f"advantage (maxrl): {trainer} computes the advantages before the loss and has no MaxRL estimator, so the "
            "run would train on its own advantages instead; compute MaxRL's in the trainer (rlstab.advantages.MaxRL "
            "fit/apply on the step's rewards and group ids) and set advantage: {kind: given}, or use rlstab's embedded trainer"
        )
    if objective.advantage.kind == "gtpo":  # issue 41: GTPO's entropy-penalised advantage; no trainer computes it
        problems.append(
            f"advantage (gtpo): {trainer} computes the advantages before the loss and has no GTPO estimator, so the "
            "run would train on its own advantages instead; use rlstab's embedded trainer"
        )
    if objective.advantage.kind in ROLLOUT_GROUP_ESTIMATORS and not rollout_groups:
        problems.append(
            f"advantage ({objective.advantage.kind}): its baseline needs all of a prompt's rollouts, and {trainer} computes "
            f"only its own advantages (group-normalised rewards), not {objective.advantage.kind}'s; use veRL "
            f"(algorithm.adv_estimator={objective.advantage.kind}) or rlstab's embedded trainer"
        )
    if objective.sampler is not None and not sampler_hook:
        problems.append(
            f"sampler ({objective.sampler.kind}): {trainer} has no per-step data hook rlstab can fill; choose the "
            f"prompts before the trainer sees them, or use rlstab's embedded trainer or veRL ({VERL_SAMPLER})"
        )
    if objective.rollout is not None:
        problems.append(
            f"rollout ({objective.rollout.kind}): the {trainer} adapter cannot branch rollouts from pivots; use rlstab's "
            "embedded trainer, or veRL with the authors' agent loop (github AgentCombo/DEEP-GRPO, recipe/deep_grpo) "
            "feeding rlstab's loss through the Python API (TokenBatch.is_branch)"
        )
    if objective.dual_stream is not None:
        problems.append(
            f"dual_stream ({objective.dual_stream.kind}): {trainer}'s batches carry no branch rows "
            "(TokenBatch.is_branch); call the compiled objective from an agent loop that makes them, or use rlstab's "
            "embedded trainer"
        )
    return problems


# Fields no adapter's trainer computes, refused by every adapter (``unsupplied`` adds them to its advice).
NO_ADAPTER_SUPPLIES = {
    "proxy_logprobs": "Lp-Reg's proxy (the old policy's min-p filtered, renormalised next-token distribution) needs the "
    "whole vocabulary in the old-log-prob pass, which this trainer does not compute; use rlstab's embedded trainer, or "
    "compute it there with rlstab.clipping.lp_reg.min_p_proxy_logprobs and call the compiled objective yourself",
    "token_ids": "the adapter does not pass the response token ids to the loss (GTPO's conflict tokens compare them "
    "across a prompt's responses); use rlstab's embedded trainer, or call the compiled objective yourself with "
    "TokenBatch.token_ids",
}


def unsupplied(
    objective, advice: Mapping[str, str], *, reported: Iterable[str] = (), every_adapter: bool = True
) -> list[str]:
    """One problem line per component that reads a ``TokenBatch`` field the trainer does not supply.

    ``advice``: field -> why the trainer lacks it and what to do instead (with ``every_adapter``,
    ``NO_ADAPTER_SUPPLIES`` is added: fields no adapter's trainer computes). ``reported``: component
    labels another check already refused (a regulariser the trainer adds itself), left out here.
    """
    plan, reported = Plan.of(objective), set(reported)
    advice = {**NO_ADAPTER_SUPPLIES, **advice} if every_adapter else dict(advice)
    return [
        f"{who} reads TokenBatch.{field}: {why}"
        for field, why in advice.items()
        for who in dict.fromkeys(plan.readers(field))
        if who not in reported
    ]


def added_by_trainer(objective, trainer: str, advice: Mapping[type, str]) -> dict[str, str]:
    """The objective's regularisers that ``trainer`` adds itself: label -> the problem line, with what to set instead.

    ``advice``: regulariser class (``EntropyBonus``, ``KLPenalty``) -> the trainer's setting for it.
    """
    problems = {}
    for i, reg in enumerate(objective.regularisers):
        for kind, setting in advice.items():
            if isinstance(reg, kind) and reg.added_by_trainers:
                label = f"regularisers[{i}] ({reg.kind})"
                problems[label] = f"{label}: not available in {trainer}; {setting}"
    return problems
