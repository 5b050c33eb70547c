"""The objective of a [`RlstabGRPOTrainer`][rlstab.adapters.trl.RlstabGRPOTrainer], checked against its ``GRPOConfig``.

TRL's ``GRPOTrainer`` builds its policy loss from flat ``GRPOConfig`` flags (``loss_type``,
``epsilon``, ``top_entropy_quantile``, ``beta``, ...). With rlstab the objective decides the loss,
so every flag that also shapes the loss needs a rule. Checked once, in ``__init__``, before the
model or the reference model is loaded, so a conflict costs seconds, not a rollout:

- **The objective wins for the policy term.** ``loss_type``, ``epsilon``, ``epsilon_high``,
  ``delta``, ``importance_sampling_level`` and the SAPO/VESPO parameters are not read. When one of
  them was changed from TRL's default to a value the objective contradicts, a warning names the
  flag and the objective's field to edit instead (``vespo_k_pos`` is the ``vespo`` surrogate's
  ``k_pos``, and so on).
- **Refused: what TRL would add to the loss itself.** The high-entropy token mask
  (``top_entropy_quantile < 1``), the off-policy sequence mask (``off_policy_mask_threshold``),
  the entropy bonus (``entropy_coef``, ``use_adaptive_entropy``), the KL term (``beta``), and
  TRL's vLLM importance-sampling correction when the objective corrects the trainer/inference
  mismatch itself (a component reads ``rollout_logprobs``). Each is either expressible in the
  objective (the error says how) or would silently vanish or apply twice, so the run stops instead.
- **Refused: what TRL cannot give the loss.** Components that read the rewards or the prompt
  groups (dynamic sampling, reward shaping: TRL hands the loss advantages), ``rollout_logprobs``
  without vLLM, and a per-step learning-rate scale (``lr_scale``).
- **KL.** TRL loads the reference model and computes its log-probabilities only when
  ``beta != 0``. An objective with a ``kl`` regulariser therefore needs ``beta`` equal to that
  regulariser's ``coef`` (one number, stated twice, so neither can drift), and
  ``use_bias_correction_kl=False`` (rlstab's term is the plain estimate, not TRL's ratio-weighted one).
- **Advantages come from TRL** (``scale_rewards``, ``multi_objective_aggregation``); the
  objective's ``advantage`` estimator is not used. A warning when they disagree (for example the
  ``dr_grpo`` preset, which does not divide by the group std, under ``scale_rewards='group'``).

The checks read the objective and its plan, never its compiled loss: checking compiles nothing.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from rlstab.adapters import trainers
from rlstab.adapters.step_parts import whole_step_problem
from rlstab.adapters.trainer_parts import unsupplied
from rlstab.advantages import GRPO, Given
from rlstab.compiler.plan import Plan
from rlstab.errors import ConfigError
from rlstab.loading import load
from rlstab.objective import Objective
from rlstab.regularisers import EntropyBonus, KLPenalty

LABEL = "RlstabGRPOTrainer"

# TRL's loss_type -> the aggregation kind whose normaliser it uses (see counts.py).
_LOSS_TYPE_AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "dapo": "token-mean",
    "cispo": "token-mean",
    "vespo": "token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "luspo": "seq-mean-token-sum",
}
# TRL's loss_type -> the surrogate kind it computes.
_LOSS_TYPE_SURROGATE = {
    "grpo": "ppo_clip",
    "dapo": "ppo_clip",
    "bnpo": "ppo_clip",
    "dr_grpo": "ppo_clip",
    "luspo": "ppo_clip",
    "cispo": "cispo",
    "sapo": "sapo",
    "vespo": "vespo",
}
# GRPOConfig policy flags -> the surrogate attribute that states the same number.
_FLAG_ATTRIBUTES = {
    "epsilon": "eps_low",
    "epsilon_high": "eps_high",
    "delta": "dual_clip",  # TRL's two-sided clip bound is rlstab's dual-clip constant
    "sapo_temperature_pos": "tau_pos",
    "sapo_temperature_neg": "tau_neg",
    "vespo_k_pos": "k_pos",
    "vespo_lambda_pos": "lambda_pos",
    "vespo_k_neg": "k_neg",
    "vespo_lambda_neg": "lambda_neg",
}


def build_objective(objective: Any, label: str = LABEL) -> Objective:
    """Load ``objective`` (preset name, YAML path or text, dict, or Objective); errors name the trainer argument.

    ``label``: the trainer class the errors name (``RlstabAsyncGRPOTrainer`` shares this loader).
    """
    if objective is None:
        raise ConfigError(
            f"{label}(objective=None)",
            [
                "objective: required; a preset name (rlstab presets), an objective YAML path, a dict or an rlstab.Objective"
            ],
        )
    label = f"{label}(objective={_short(objective)})"
    try:
        return load(objective)
    except ConfigError as err:
        source = label if err.source in ("<dict>", "<yaml text>") else f"{label} -> {err.source}"
        raise ConfigError(source, err.problems) from None
    except TypeError as err:
        raise ConfigError(label, [str(err)]) from None


def check_accumulated_state(objective: Objective, trainer: str, step_statistics: str, accumulation: int) -> None:
    """Refuse (``ValueError``, one line) a state that reads the whole step in ``data_parallel`` with accumulation."""
    if step_statistics != "data_parallel" or accumulation <= 1:
        return
    problem = whole_step_problem(
        objective,
        f"{trainer}(step_statistics='data_parallel') with gradient_accumulation_steps = {accumulation}",
        "step_statistics='optimizer_step' (one extra no-grad forward per optimizer step)",
    )
    if problem:
        raise ValueError(problem)


def check_config(objective: Objective, args) -> list[str]:
    """Refuse ``args`` (a ``GRPOConfig``) where TRL would add to the loss; return warnings for ignored flags.

    Raises [`ConfigError`][rlstab.ConfigError] with one line per conflict, each naming the
    ``GRPOConfig`` field, its value and what to set instead. The returned warnings are also
    issued with ``warnings.warn``.
    """
    name = objective.name or "custom"
    label = f"{LABEL}(objective={name!r}, args=GRPOConfig(...))"
    problems = _refusals(objective, args) + _unavailable_fields(objective, args)
    if problems:
        raise ConfigError(label, problems)
    notes = _ignored_policy_flags(objective, args) + _advantage_notes(objective, args)
    for note in notes:
        warnings.warn(f"{label}: {note}", UserWarning, stacklevel=3)
    return notes


def _refusals(objective: Objective, args) -> list[str]:
    problems = []
    if args.top_entropy_quantile < 1.0:
        rho = args.top_entropy_quantile
        problems.append(
            f"top_entropy_quantile = {rho!r}: TRL would add its own entropy mask; put it in the objective "
            f"(masks: [{{kind: entropy_quantile, rho: {rho}, side: top}}], as the 20-entropy preset does) "
            "and leave top_entropy_quantile=1.0"
        )
    if args.off_policy_mask_threshold is not None:
        problems.append(
            f"off_policy_mask_threshold = {args.off_policy_mask_threshold!r}: TRL would add its own off-policy sequence "
            f"mask; put it in the objective (masks: [{{kind: off_policy_sequence, threshold: {args.off_policy_mask_threshold}, "
            "behaviour: rollout}] with vLLM, behaviour: old without; the dsv32_mask preset) and set off_policy_mask_threshold=None"
        )
    bonuses = [i for i, r in enumerate(objective.regularisers) if isinstance(r, EntropyBonus)]
    if args.use_adaptive_entropy:
        problems.append(
            "use_adaptive_entropy = True: TRL would add its own adaptive entropy bonus; put it in the objective "
            f"(regularisers: [{{kind: adaptive_entropy, coef: {args.entropy_coef}, target_entropy: {args.entropy_target}, "
            f"delta: {args.entropy_coef_delta}, coef_min: {args.entropy_coef_min}, coef_max: {args.entropy_coef_max}, "
            "measure: entropy, boundary: at_or_below, first_step: 'off', average: micro_batch}], TRL's rule) and set "
            "use_adaptive_entropy=False"
        )
    elif args.entropy_coef != 0.0:
        advice = (
            f"the objective already has regularisers[{bonuses[0]}] (entropy_bonus); set entropy_coef=0.0"
            if bonuses
            else f"add regularisers: [{{kind: entropy_bonus, coef: {args.entropy_coef}, average: micro_batch}}] to the objective "
            "(TRL's mean per micro-batch) and set entropy_coef=0.0"
        )
        problems.append(
            f"entropy_coef = {args.entropy_coef!r}: TRL would add its own entropy bonus; {advice}"
        )
    problems += trainers.problems(objective, "trl")  # what `rlstab validate --trainer trl` reports too
    plan = Plan.of(objective)
    batched = plan.training_batch
    steps = args.steps_per_generation * args.num_iterations
    if batched and steps != args.gradient_accumulation_steps:
        problems.append(
            f"steps_per_generation = {args.steps_per_generation!r} with num_iterations = {args.num_iterations!r} and "
            f"gradient_accumulation_steps = {args.gradient_accumulation_steps!r}: a generation batch is not one optimizer "
            f"step, and {', '.join(batched)} moves once per training batch, which the TRL adapter does not mark (each "
            "optimizer step would be its own); set its cadence: optimizer_step, or train one optimizer step per "
            "generation batch (steps_per_generation = gradient_accumulation_steps, num_iterations = 1)"
        )
    rollout = plan.readers("rollout_logprobs")
    if rollout and args.use_vllm and args.vllm_importance_sampling_correction:
        problems.append(
            f"vllm_importance_sampling_correction = True: TRL would apply its own importance-sampling correction on top "
            f"of the objective's ({', '.join(rollout)} reads rollout_logprobs); set vllm_importance_sampling_correction=False"
        )
    kls = [(i, r) for i, r in enumerate(objective.regularisers) if isinstance(r, KLPenalty) and r.added_by_trainers]
    if args.beta != 0.0 and not kls:
        problems.append(
            f"beta = {args.beta!r}: TRL would add its own KL term; add regularisers: "
            f"[{{kind: kl, coef: {args.beta}, estimator: k3}}] to the objective (TRL's estimator), keeping beta = {args.beta} "
            "so that TRL computes the reference log-probabilities, or set beta=0.0"
        )
    for i, reg in kls:
        if args.beta != reg.coef:
            problems.append(
                f"beta = {args.beta!r}: regularisers[{i}] (kl) has coef {reg.coef}; set beta={reg.coef} (TRL loads the "
                "reference model and computes its log-probabilities only when beta != 0, and one coefficient must not "
                "be stated two ways)"
            )
        if args.use_bias_correction_kl:
            problems.append(
                "use_bias_correction_kl = True: TRL would weight the KL term by the importance ratio; regularisers"
                f"[{i}] (kl) is the plain {reg.estimator} estimate: set use_bias_correction_kl=False"
            )
    return problems


def _unavailable_fields(objective: Objective, args) -> list[str]:
    """Fields TRL's loss call carries only with a setting (``trainers.TRL.on_setting``) that ``args`` lacks."""
    available = {"rollout_logprobs": bool(args.use_vllm), "ref_logprobs": args.beta != 0.0}
    advice = {field: why for field, (_, why) in trainers.TRL.on_setting.items() if not available[field]}
    # A kl regulariser without reference log-probabilities: the beta rule says what to do.
    kls = [f"regularisers[{i}] ({r.kind})" for i, r in enumerate(objective.regularisers)
           if isinstance(r, KLPenalty) and r.added_by_trainers]
    return unsupplied(objective, advice, reported=kls, every_adapter=False)  # the rest: trainers.problems


def _ignored_policy_flags(objective: Objective, args) -> list[str]:
    """Policy-term flags changed from TRL's default to a value the objective contradicts."""
    defaults = _defaults(type(args))
    surrogate = objective.surrogate
    agg = objective.aggregation.kind
    notes = []

    def changed(field: str) -> bool:
        return field in defaults and getattr(args, field) != defaults[field]

    if changed("loss_type"):
        lt = args.loss_type
        trl_surrogate = _LOSS_TYPE_SURROGATE.get(lt)
        if trl_surrogate == "ppo_clip" and args.importance_sampling_level == "sequence":
            trl_surrogate = "gspo"
        if _LOSS_TYPE_AGGREGATION.get(lt) != agg or trl_surrogate != surrogate.kind:
            notes.append(
                f"loss_type = {lt!r} is not used: the objective's surrogate ({surrogate.kind}) and aggregation "
                f"({agg}) decide the policy loss"
            )
    for field, attribute in _surrogate_fields(surrogate.kind):
        if not changed(field):
            continue
        value = getattr(args, field)
        if not hasattr(surrogate, attribute):
            notes.append(
                f"{field} = {value!r} is not used: the objective's surrogate ({surrogate.kind}) decides"
            )
        elif value != getattr(surrogate, attribute):
            notes.append(
                f"{field} = {value!r} is not used: the objective has surrogate.{attribute} = "
                f"{getattr(surrogate, attribute)}; change it in the objective"
                + (" (TRL's delta is rlstab's dual-clip)" if field == "delta" else "")
            )
    if changed("importance_sampling_level") and surrogate.kind != "gspo":
        notes.append(
            f"importance_sampling_level = {args.importance_sampling_level!r} is not used: the objective's surrogate "
            f"({surrogate.kind}) decides the ratio (surrogate kind gspo is the sequence-level one)"
        )
    return notes


def _surrogate_fields(kind: str) -> list[tuple[str, str]]:
    """(GRPOConfig field, surrogate attribute) pairs that state the same number for this surrogate kind."""
    fields = dict(_FLAG_ATTRIBUTES)
    if kind == "cispo":  # TRL's cispo reads epsilon_high as the absolute cap on the ratio
        fields["epsilon_high"] = "max_weight"
    return list(fields.items())


def _advantage_notes(objective: Objective, args) -> list[str]:
    est = objective.advantage
    if isinstance(est, Given):
        return []
    if isinstance(est, GRPO):
        wanted = "group" if est.normalize_std else "none"
        if args.scale_rewards == wanted:
            return []
        return [
            f"scale_rewards = {args.scale_rewards!r}: TRL computes the advantages, and the objective's advantage "
            f"(grpo, normalize_std: {str(est.normalize_std).lower()}) corresponds to scale_rewards={wanted!r}"
        ]
    return [
        f"the objective's advantage estimator ({est.kind}) is not used: TRL computes the advantages "
        f"(scale_rewards={args.scale_rewards!r})"
    ]


def _defaults(config_class) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
    return out


def _short(value: Any) -> str:
    text = f"Objective({value.name!r})" if isinstance(value, Objective) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
