"""What each trainer's adapter supplies and executes: the one description every check reads.

``rlstab validate --trainer T``, ``rlstab explain --trainer T`` and the adapters' own start-up
checks (veRL's ``RlstabPolicyLossConfig``, TRL's ``RlstabGRPOTrainer`` and ``RlstabAsyncGRPOTrainer``,
OpenRLHF's launcher and ``RlstabPolicyLoss``) all call [`problems`][rlstab.adapters.trainers.problems] with the same
[`Trainer`][rlstab.adapters.trainers.Trainer] entry, so the command line and the cluster cannot
disagree about an objective.

Two kinds of answer:

- **problems**: what the adapter refuses whatever the trainer's settings (a part it cannot execute,
  a ``TokenBatch`` field its loss call never carries, a regulariser the trainer adds itself);
- **settings**: what the trainer must be told for the objective to run as written (a field its
  loss call carries only with a flag; an advantage it computes itself; veRL's ``loss_agg_mode``
  for its own terms; OpenRLHF's own importance-sampling coefficient, which would correct a second
  time). The adapter checks each one against the trainer's own config at start-up (or warns where
  it cannot see it). Each comes with the overrides to paste into the trainer's own configuration
  ([`paste_block`][rlstab.adapters.trainers.paste_block]).

Torch-free and trainer-import-free: it reads the objective and its plan, never a compiled loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rlstab.adapters.trainer_aggregation import VERL_ACTOR, verl_need, verl_overrides
from rlstab.adapters.trainer_parts import (
    ROLLOUT_GROUP_ESTIMATORS,
    TOKEN_BASELINES,
    VERL_SAMPLER,
    added_by_trainer,
    unexecutable,
    unsupplied,
)
from rlstab.aggregation import TokenSum
from rlstab.compiler.plan import Plan
from rlstab.regularisers import AdaptiveEntropy, EntropyBonus, KLPenalty

OPENRLHF_CORRECTION = "--algo.advantage.is_correction_level"
OPENRLHF_NEUTRAL = ("--algo.advantage.is_correction_mode clip", "--algo.advantage.is_correction_threshold 1 1")
"""OpenRLHF flags that make its importance-sampling coefficient 1: ``clip`` clamps the token ratio into [1, 1]."""
CORRECTORS = ("masks[", "reweighters[", "surrogate")
"""Labels of the parts that correct for the rollout when they read its log-probabilities (not ``lr_scale``, which measures)."""


@dataclass(frozen=True)
class Trainer:
    """What one trainer's adapter can give an objective.

    Attributes:
        key: the ``--trainer`` value (``verl``, ``trl``, ``trl-async``, ``openrlhf``).
        name: as the messages write it (``veRL``).
        folder: the adapter's package, ``rlstab/adapters/<folder>/`` (TRL's two trainers share ``trl``).
        step_statistics: the adapter's step scopes, its default first.
        unavailable: ``TokenBatch`` field -> why the trainer's loss call never carries it, and what
            to do instead.
        on_setting: ``TokenBatch`` field -> ``(setting, why)``: the trainer setting with which its loss
            call carries the field, and why it lacks it otherwise.
        adds: regulariser class -> the trainer's own setting for it (the trainer adds that term
            itself, outside the policy loss; a more specific class after its base class).
        sampler_hook, token_baseline, rollout_groups: see
            [`unexecutable`][rlstab.adapters.trainer_parts.unexecutable].
        token_sum: why ``aggregation: token-sum`` cannot run, or None where it can.
        pastes: ``TokenBatch`` field of ``on_setting`` -> its setting as paste-ready overrides, one each.
        paste: how the overrides are pasted: ``(where, line)``, ``line`` formatting one override.
    """

    key: str
    name: str
    folder: str
    step_statistics: tuple[str, ...]
    unavailable: Mapping[str, str]
    on_setting: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    adds: Mapping[type, str] = field(default_factory=dict)
    sampler_hook: bool = False
    token_baseline: bool = False
    rollout_groups: bool = False
    token_sum: str | None = None
    pastes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    paste: tuple[str, str] = ("", "{}")


@dataclass(frozen=True)
class Setting:
    """One setting a trainer needs for an objective.

    Attributes:
        what: the setting as the line names it (``use_vllm=True and vllm_importance_sampling_correction=False``).
        why: which part needs it, and why.
        overrides: the same, paste-ready, one override each, in the trainer's own syntax; empty where
            no single value can be given (``steps_per_generation x num_iterations = ...``).
    """

    what: str
    why: str
    overrides: tuple[str, ...] = ()

    def line(self) -> str:
        return f"{self.what} ({self.why})"


VERL = Trainer(
    key="verl",
    name="veRL",
    folder="verl",
    step_statistics=("optimizer_step", "local", "data_parallel"),
    unavailable={
        "rollout_logprobs": "veRL applies its rollout correction in the driver (algorithm.rollout_correction) and "
        "passes the resulting rollout_is_weights, which rlstab applies",
        "ref_logprobs": "veRL's ppo_loss does not pass reference log-probabilities to a policy loss",
        "rewards": "veRL computes rewards and advantages in the driver (DAPO's dynamic sampling is "
        "algorithm.filter_groups.enable=True; apply overlong shaping, rlstab.step.overlong_penalty, in the reward function)",
        "group_ids": "veRL's ppo_loss does not pass prompt groups to a policy loss",
    },
    on_setting={"entropy": (
        f"{VERL_ACTOR}.calculate_entropy=True",
        "veRL computes the per-token entropy only with calculate_entropy=True or an entropy bonus (entropy_coeff != 0)",
    )},
    adds={
        EntropyBonus: f"veRL adds the entropy bonus itself, with gradient: set {VERL_ACTOR}.entropy_coeff",
        AdaptiveEntropy: (
            f"veRL adds the entropy bonus itself, with a fixed {VERL_ACTOR}.entropy_coeff and no adaptive "
            "controller (Skywork-OR1's own veRL fork has one); use a fixed entropy_coeff, or run adaptive_entropy in the "
            "embedded trainer or TRL"
        ),
        KLPenalty: (
            f"veRL adds the KL loss itself: set {VERL_ACTOR}.use_kl_loss=True, "
            f"{VERL_ACTOR}.kl_loss_coef and {VERL_ACTOR}.kl_loss_type"
        ),
    },
    sampler_hook=True,
    token_baseline=True,
    rollout_groups=True,
    pastes={"entropy": (f"{VERL_ACTOR}.calculate_entropy=True",)},
    paste=("veRL overrides (Hydra command line)", "{} \\"),
)

TRL = Trainer(
    key="trl",
    name="TRL",
    folder="trl",
    step_statistics=("data_parallel", "optimizer_step"),
    unavailable={
        "rewards": "TRL hands the loss its advantages, not the rewards",
        "group_ids": "TRL hands the loss its advantages, not the prompt groups",
    },
    on_setting={
        "rollout_logprobs": (
            "use_vllm=True and vllm_importance_sampling_correction=False",
            "TRL has inference-engine log-probabilities only with use_vllm=True (sampling_per_token_logps)",
        ),
        "ref_logprobs": (
            "beta = the kl regulariser's coef and use_bias_correction_kl=False",
            "TRL computes reference log-probabilities only with beta != 0",
        ),
    },
    pastes={"rollout_logprobs": ("use_vllm=True", "vllm_importance_sampling_correction=False")},
    paste=("GRPOConfig arguments", "{},"),
)

OPENRLHF = Trainer(
    key="openrlhf",
    name="OpenRLHF",
    folder="openrlhf",
    step_statistics=("optimizer_step", "local"),
    unavailable={
        "ref_logprobs": "OpenRLHF's PolicyLoss is not given reference log-probabilities (its KL loss is separate)",
        "rewards": "OpenRLHF computes rewards and advantages before the loss (use its dynamic filtering and reward "
        "options, or rlstab.step in your reward function)",
        "group_ids": "OpenRLHF's PolicyLoss is not given prompt groups",
    },
    on_setting={"rollout_logprobs": (
        f"{OPENRLHF_CORRECTION} token|seq",
        f"OpenRLHF records vLLM's log-probabilities only with {OPENRLHF_CORRECTION} token|seq "
        "(its correction then applies too)",
    )},
    adds={
        EntropyBonus: "OpenRLHF adds the entropy bonus itself, with gradient: use --actor.entropy_coef",
        AdaptiveEntropy: (
            "OpenRLHF adds the entropy bonus itself, with a fixed --actor.entropy_coef and no adaptive controller; use a "
            "fixed --actor.entropy_coef, or run adaptive_entropy in the embedded trainer or TRL"
        ),
        KLPenalty: "OpenRLHF adds the KL loss itself: use --algo.kl.use_loss with --algo.kl.init_coef and --algo.kl.estimator",
    },
    token_sum="DeepSpeed divides every micro-batch loss by the gradient-accumulation steps, which the loss cannot see. "
    "Use token-mean or a seq-mean-* aggregation",
    pastes={"rollout_logprobs": (f"{OPENRLHF_CORRECTION} token",)},
    paste=("OpenRLHF flags (after python -m rlstab.adapters.openrlhf --objective ...)", "{} \\"),
)

ASYNC_PROXIMAL = "old_logprobs='proximal'"
"""The ``RlstabAsyncGRPOTrainer`` argument with which its loss call carries ``rollout_logprobs``."""

TRL_ASYNC = Trainer(
    key="trl-async",
    name="TRL AsyncGRPO",
    folder="trl",
    step_statistics=("data_parallel", "optimizer_step"),
    unavailable={
        "ref_logprobs": "TRL's AsyncGRPOTrainer has no reference model (and no KL term); use TRL's GRPOTrainer "
        "(--trainer trl, beta = the kl coef) or rlstab's embedded trainer",
        "rewards": "TRL's AsyncGRPOTrainer hands the loss the advantages its rollout worker computed, not the rewards",
        "group_ids": "TRL's AsyncGRPOTrainer packs the samples without their prompt groups",
    },
    on_setting={"rollout_logprobs": (
        f"RlstabAsyncGRPOTrainer({ASYNC_PROXIMAL})",
        "TRL's AsyncGRPOTrainer keeps one log-probability per token, the sampler's, and takes its ratio against it "
        "(old_logprobs); with old_logprobs='proximal' the ratio is taken against the policy being trained and the "
        "sampler's become rollout_logprobs",
    )},
    pastes={"rollout_logprobs": ('old_logprobs="proximal"',)},
    paste=("RlstabAsyncGRPOTrainer arguments", "{},"),
)

TRAINERS: dict[str, Trainer] = {t.key: t for t in (VERL, OPENRLHF, TRL, TRL_ASYNC)}
"""Every adapter, by its ``--trainer`` value."""


def trainer(key: str) -> Trainer:
    """The entry for ``key`` (``verl``, ``trl``, ``trl-async``, ``openrlhf``; any case, so ``veRL`` too)."""
    found = TRAINERS.get(str(key).lower())
    if found is None:
        raise ValueError(f"trainer {key!r}: allowed {', '.join(TRAINERS)}")
    return found


def refusals(objective, key: str) -> list[tuple[str, str]]:
    """``(part, problem line)`` for each part of ``objective`` the adapter of ``key`` refuses whatever its settings.

    ``part`` is the component's label (``reweighters[0] (tis)``, ``lr_scale (ess)``,
    ``aggregation (token-sum)``), as ``rlstab explain`` names the parts.
    """
    t = trainer(key)
    added = added_by_trainer(objective, t.name, t.adds)
    out = list(added.items())
    if t.token_sum is not None and isinstance(objective.aggregation, TokenSum):
        out.append(("aggregation (token-sum)", f"aggregation.kind = 'token-sum': not available in {t.name}; {t.token_sum}"))
    for line in unexecutable(objective, t.name, sampler_hook=t.sampler_hook, token_baseline=t.token_baseline,
                             rollout_groups=t.rollout_groups):
        out.append((line.split(": ", 1)[0], line))
    for line in unsupplied(objective, t.unavailable, reported=added):
        out.append((line.split(" reads TokenBatch.", 1)[0], line))
    return out


def problems(objective, key: str) -> list[str]:
    """One line per part of ``objective`` that the adapter of ``key`` refuses at start-up, whatever its settings."""
    return [line for _, line in refusals(objective, key)]


def settings(objective, key: str) -> list[str]:
    """One line per setting the trainer ``key`` needs for ``objective``: what to set, and which part needs it.

    The adapter checks these against the trainer's config at start-up where it sees them; an
    objective with problems has settings too, but cannot run until its problems are gone.
    """
    return [setting.line() for setting in needed(objective, key)]


def needed(objective, key: str) -> list[Setting]:
    """The [`Setting`][rlstab.adapters.trainers.Setting]s behind [`settings`][rlstab.adapters.trainers.settings]."""
    t, plan, out = trainer(key), Plan.of(objective), []
    for field_name, (setting, _) in t.on_setting.items():
        readers = list(dict.fromkeys(plan.readers(field_name)))
        if readers:
            pastes = t.pastes.get(field_name, ())
            if t.key == "trl" and field_name == "ref_logprobs":
                pastes = _trl_reference(objective)
            out.append(Setting(setting, f"{', '.join(readers)} {_reads(readers)} TokenBatch.{field_name}", pastes))
            correctors = [who for who in readers if who.startswith(CORRECTORS)]
            if t.key == "openrlhf" and field_name == "rollout_logprobs" and correctors:
                out.append(Setting(" ".join(OPENRLHF_NEUTRAL), openrlhf_double_correction(correctors), OPENRLHF_NEUTRAL))
    advantage = objective.advantage.kind
    if t.key == "verl":
        if advantage in TOKEN_BASELINES:
            pastes = (f"algorithm.adv_estimator={advantage}", f"{VERL_ACTOR}.calculate_sum_pi_squared=True")
            out.append(Setting(" and ".join(pastes), f"veRL computes advantage ({advantage}) in its driver", pastes))
        elif advantage in ROLLOUT_GROUP_ESTIMATORS:
            paste = f"algorithm.adv_estimator={advantage}"
            out.append(Setting(paste, f"veRL computes advantage ({advantage}) in its driver", (paste,)))
        if objective.sampler is not None:
            out.append(Setting(VERL_SAMPLER, f"runs sampler ({objective.sampler.kind}); without it veRL draws the "
                               "prompts as usual", tuple(VERL_SAMPLER.split())))
        aggregation = verl_overrides(objective.aggregation)
        if aggregation:
            out.append(Setting(" and ".join(aggregation), verl_need(objective.aggregation), tuple(aggregation)))
    if t.key == "trl" and plan.training_batch:
        out.append(Setting("steps_per_generation x num_iterations = gradient_accumulation_steps",
                           f"{', '.join(plan.training_batch)} moves once per training batch"))
    return out


def overrides(objective, key: str) -> list[str]:
    """Every paste-ready override of ``needed(objective, key)``, once each, in order."""
    return list(dict.fromkeys(o for setting in needed(objective, key) for o in setting.overrides))


def paste_block(objective, key: str) -> list[str]:
    """The overrides as a block to paste into the trainer's configuration: a heading, then one line each; [] when none.

    veRL's are Hydra command-line overrides, OpenRLHF's its command-line flags (each line ending in
    a shell continuation), TRL's ``GRPOConfig`` keyword arguments. ``rlstab validate --trainer`` and
    ``rlstab explain --trainer`` print this block.
    """
    lines = overrides(objective, key)
    if not lines:
        return []
    where, line = trainer(key).paste
    return [f"{where}, to paste:", *(f"    {line.format(o)}" for o in lines)]


def openrlhf_double_correction(readers: list[str]) -> str:
    """Why an objective that reads the rollout's log-probabilities needs OpenRLHF's coefficient made 1.

    OpenRLHF 0.11.2 records vLLM's log-probabilities only with ``--algo.advantage.is_correction_level``
    ``token`` or ``seq``, and its ``PolicyLoss`` then multiplies each token's loss by its own
    coefficient (``mask``, the default: the token's ratio where it is inside [0.5, 5], 0 outside);
    the adapter applies it as OpenRLHF does (``rlstab.adapters.openrlhf.is_correction``). Clip mode
    clamps the token's ratio into [low, high], so threshold ``1 1`` makes the coefficient 1.
    """
    return (f"{', '.join(readers)} {'corrects' if len(readers) == 1 else 'correct'} for the rollout itself, and "
            "OpenRLHF, once it records the rollout's log-probabilities, multiplies each token's loss by its own "
            "importance-sampling coefficient too: the rollout would be corrected twice; clip mode with threshold 1 1 "
            "makes OpenRLHF's coefficient 1")


def _trl_reference(objective) -> tuple[str, ...]:
    """``beta=<coef>`` of the objective's one kl regulariser coefficient, with ``use_bias_correction_kl=False``."""
    coefs = list(dict.fromkeys(r.coef for r in objective.regularisers if isinstance(r, KLPenalty) and r.added_by_trainers))
    return (f"beta={coefs[0]}", "use_bias_correction_kl=False") if len(coefs) == 1 else ()


def _reads(readers: list[str]) -> str:
    return "reads" if len(readers) == 1 else "read"


def runners(objective, parts: list[str]) -> tuple[list[str], dict[str, str]]:
    """Which trainers run all of ``parts`` (labels as in ``refusals``), and the first refusal line of each other trainer."""
    ok, refused = [], {}
    for t in TRAINERS.values():
        lines = [line for part, line in refusals(objective, t.key) if part in parts]
        if lines:
            refused[t.name] = lines[0]
        else:
            ok.append(t.name)
    return ok, refused
