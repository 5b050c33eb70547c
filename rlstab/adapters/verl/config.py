"""The objective chosen in verl's Hydra config, and the start-up checks of verl's config around it.

- ``RlstabPolicyLossConfig``: verl rejects unknown keys under ``actor_rollout_ref.actor.policy_loss``
  unless ``policy_loss._target_`` names a subclass of ``verl.workers.config.PolicyLossConfig`` that
  declares them. This is that subclass. It is instantiated when verl builds its ``ActorConfig``
  (in the driver's ``validate_config``, before any worker starts, and again in each worker), and
  it loads and validates the objective right there
  ([`build_objective`][rlstab.adapters.verl.config.build_objective]), so a misspelt field fails
  the run at start-up instead of at the first update.
- [`check_actor`][rlstab.adapters.verl.config.check_actor], run after ``ActorConfig.__post_init__``:
  the policy-loss config cannot see the actor section around it, and whether the engine computes
  entropy is an actor setting. verl builds its ``ActorConfig`` in the driver before any worker or
  rollout starts, so the check fails the run in seconds with the flag to set.

Both read the objective and its plan, never its compiled loss: checking a config compiles nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl.workers.config import PolicyLossConfig

from rlstab.adapters import trainers
from rlstab.adapters.optimizer_steps import StepTracker
from rlstab.adapters.patching import patch_once
from rlstab.adapters.step_parts import whole_step_problem
from rlstab.adapters.trainer_aggregation import verl_warning
from rlstab.adapters.trainer_parts import TOKEN_BASELINES, VERL_SAMPLER
from rlstab.compiler.plan import Plan
from rlstab.errors import ConfigError
from rlstab.loading import load
from rlstab.objective import Objective
from rlstab.presets import closest_presets, preset_names

if TYPE_CHECKING:
    from rlstab.compiled import CompiledObjective

CONFIG_PATH = "actor_rollout_ref.actor.policy_loss"
ACTOR_PATH = "actor_rollout_ref.actor"
_log = logging.getLogger(__name__)
STEP_STATISTICS = trainers.VERL.step_statistics
ENTROPY_FUNCTIONS = ("rlstab", "verl")

@dataclass
class RlstabPolicyLossConfig(PolicyLossConfig):
    """verl's ``policy_loss`` section for ``loss_mode=rlstab``.

    Args:
        loss_mode: must be ``rlstab``.
        objective: a preset name (``rlstab presets``) or the path of an objective YAML file. A
            path must be readable on every node, because each Ray worker builds its own config.
        overrides: fields merged over the objective, as an ``extends:`` file would
            (``{surrogate: {eps_high: 0.3}}``). With ``objective`` null, the whole objective.
        step_statistics: where the step's statistics are computed (mask thresholds, kept-token
            counts, and the step of stateful components: STARE's gate and controller, BAPO's
            bounds). ``optimizer_step`` (default): over the whole optimizer step (every
            micro-batch of the mini-batch, every data-parallel rank), before its first
            micro-batch, identical on every rank; components whose state moves once per training
            batch (STARE's, by default) move once per ``update_actor`` call, from the whole batch
            ([`step_scope`][rlstab.adapters.verl.step_scope]; costs one no-grad forward per
            optimizer step after the first of each training batch). ``local``: on each
            micro-batch of each rank, no communication (a stateful component is then refused
            with more than one data-parallel rank: each rank's state would drift).
            ``data_parallel``: on the micro-batches of the same index on every data-parallel rank
            together (all-reduces per micro-batch; relies on verl giving every rank the same
            number of micro-batches, which its fsdp engine does). In both, a stateful
            component whose value comes from its state alone (``value_from_state``) measures every
            micro-batch of the optimizer step and moves once; BAPO, STARE and any component moving
            once per training batch are refused
            ([`step_parts`][rlstab.adapters.step_parts]).
        entropy_function: what computes the per-token entropy in the actor's FSDP engine.
            ``rlstab`` (default): ``rlstab.stats``, one pass over the logits (Triton kernels on
            CUDA; verl's own function on a GPU without Triton, where it is faster), without
            the ``[tokens, V]`` softmax autograd would keep
            ([`entropy`][rlstab.adapters.verl.entropy]). ``verl``: verl's own
            ``entropy_from_logits``.
    """

    loss_mode: str = "rlstab"
    objective: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    step_statistics: str = "optimizer_step"
    entropy_function: str = "rlstab"

    def __post_init__(self):
        if self.loss_mode != "rlstab":
            raise ValueError(
                f"{CONFIG_PATH}.loss_mode = {self.loss_mode!r}, but {CONFIG_PATH}._target_ selects rlstab's "
                f"config: set {CONFIG_PATH}.loss_mode=rlstab"
            )
        if self.step_statistics not in STEP_STATISTICS:
            raise ValueError(
                f"{CONFIG_PATH}.step_statistics = {self.step_statistics!r}: allowed {', '.join(STEP_STATISTICS)}"
            )
        if self.entropy_function not in ENTROPY_FUNCTIONS:
            raise ValueError(
                f"{CONFIG_PATH}.entropy_function = {self.entropy_function!r}: allowed {', '.join(ENTROPY_FUNCTIONS)}"
            )
        self._rlstab_objective = build_objective(self.objective, self.overrides)
        if self.step_statistics != "optimizer_step":
            problem = whole_step_problem(
                self._rlstab_objective,
                f"{CONFIG_PATH}.step_statistics = {self.step_statistics!r}",
                f"{CONFIG_PATH}.step_statistics=optimizer_step (the default)",
                training_batch=True,
            )
            if problem:
                raise ValueError(problem)
        self._rlstab_compiled = None
        self.rlstab_step_tracker = StepTracker()

    @property
    def rlstab_objective(self) -> Objective:
        """The validated objective."""
        return self._rlstab_objective

    @property
    def rlstab_compiled(self) -> CompiledObjective:
        """The compiled loss, built once per process."""
        if self._rlstab_compiled is None:
            object.__setattr__(self, "_rlstab_compiled", self._rlstab_objective.compile())
        return self._rlstab_compiled


def worker_policy_loss(worker) -> RlstabPolicyLossConfig | None:
    """A ``TrainingWorker``'s rlstab policy-loss config (``loss_fn = partial(ppo_loss, config=actor_config)``), or None."""
    config = getattr(getattr(worker, "loss_fn", None), "keywords", {}).get("config")
    policy_loss = getattr(config, "policy_loss", None)
    return policy_loss if isinstance(policy_loss, RlstabPolicyLossConfig) else None


def build_objective(objective: str | None, overrides: Any) -> Objective:
    """Load ``objective`` with ``overrides`` merged over it; errors name the verl config path."""
    overrides = _plain(overrides) or {}
    if not isinstance(overrides, dict):
        raise ConfigError(CONFIG_PATH, [f"overrides = {overrides!r}: must be a mapping of objective fields"])
    if objective is None and not overrides:
        raise ConfigError(
            CONFIG_PATH, ["objective: required (a preset name or an objective YAML path); or give the whole objective as overrides"]
        )
    label = f"{CONFIG_PATH} (objective={objective!r}" + (", with overrides)" if overrides else ")")
    if objective is not None and objective not in preset_names() and not objective.endswith((".yaml", ".yml")):
        raise ConfigError(label, [f"objective = {objective!r}: neither a preset ({closest_presets(objective)}) nor a .yaml file"])
    if not overrides:
        source = objective  # loaded as itself, so a preset keeps its name
    else:
        source = dict(overrides) if objective is None else {"extends": objective, **overrides}
    try:
        loaded = load(source)
    except ConfigError as err:
        source = label if err.source == "<dict>" else f"{label} -> {err.source}"
        raise ConfigError(source, err.problems) from None
    problems = trainers.problems(loaded, "verl")  # what `rlstab validate --trainer verl` reports too
    if loaded.sampler is not None:  # the data section is out of this config's sight: say what runs it
        _log.warning(
            "rlstab: the objective's sampler (%s) runs only with %s; without it veRL draws the prompts as usual",
            loaded.sampler.kind, VERL_SAMPLER,
        )
    if problems:
        raise ConfigError(label, problems)
    return loaded


def _plain(value: Any) -> Any:
    """Hydra may hand over OmegaConf containers; the objective loader takes plain data."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl depends on omegaconf
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def add_actor_check(actor_config_class: type) -> None:
    """Run [`check_actor`][rlstab.adapters.verl.config.check_actor] after ``ActorConfig.__post_init__`` (idempotent)."""
    patch_once(actor_config_class, "__post_init__", _checking_actor, key=__name__)


def _checking_actor(original):
    @functools.wraps(original)
    def __post_init__(self):
        original(self)
        check_actor(self)

    return __post_init__


def check_actor(actor) -> None:
    """Refuse an actor config on which the rlstab loss would fail or silently differ."""
    policy_loss = actor.policy_loss
    ours = isinstance(policy_loss, RlstabPolicyLossConfig)
    if policy_loss.get("loss_mode") == "rlstab" and not ours:
        raise ValueError(
            f"{CONFIG_PATH}.loss_mode=rlstab needs {CONFIG_PATH}._target_=rlstab.adapters.verl.RlstabPolicyLossConfig "
            f"and {CONFIG_PATH}.objective=<preset or YAML path>"
        )
    if not ours:
        return
    objective = policy_loss.rlstab_objective
    readers = Plan.of(objective).readers("entropy")
    # verl computes entropy when calculate_entropy is set or the entropy bonus is on (ray_trainer._update_actor).
    if readers and not (actor.calculate_entropy or actor.entropy_coeff != 0):
        raise ValueError(
            f"{CONFIG_PATH}.objective {objective.name or policy_loss.objective!r}: {', '.join(readers)} "
            f"reads the per-token entropy; set {ACTOR_PATH}.calculate_entropy=True"
        )
    advantage = objective.advantage.kind
    # veRL computes these advantages in its driver, from the actor's sum_pi_squared (ray_trainer.compute_advantage).
    if advantage in TOKEN_BASELINES and not getattr(actor, "calculate_sum_pi_squared", False):
        raise ValueError(
            f"{CONFIG_PATH}.objective {objective.name or policy_loss.objective!r}: advantage ({advantage}) is computed by "
            f"veRL from the actor's sum_pi_squared; set {ACTOR_PATH}.calculate_sum_pi_squared=True and "
            f"algorithm.adv_estimator={advantage}"
        )
    defaults = _defaults(type(actor))
    # veRL aggregates its own terms (entropy bonus, KL loss, actor/entropy) with loss_agg_mode, its default included.
    note = verl_warning(objective.aggregation, actor.loss_agg_mode, getattr(actor, "loss_scale_factor", None),
                        (defaults.get("loss_agg_mode"), defaults.get("loss_scale_factor")))
    if note is not None:
        _log.warning("rlstab: %s", note)
    for note in overridden_flags(actor, objective):
        _log.warning("rlstab: %s", note)


# veRL's policy-loss flags that loss_mode=rlstab does not read -> the surrogate attribute that states the same number
# (None: no attribute of any rlstab surrogate; the flag is then reported whenever it differs from veRL's default).
_ACTOR_FLAGS = {
    "clip_ratio": None,
    "clip_ratio_low": "eps_low",
    "clip_ratio_high": "eps_high",
    "clip_ratio_c": "dual_clip",
    "tau_pos": "tau_pos",
    "tau_neg": "tau_neg",
    "loss_scale_factor": None,
}
_POLICY_LOSS_FLAGS = {
    "clip_cov_ratio": "fraction",
    "clip_cov_lb": "cov_low",
    "clip_cov_ub": "cov_high",
    "kl_cov_ratio": "fraction",
    "ppo_kl_coef": None,
    "dro_beta": "beta",
}


def overridden_flags(actor, objective: Objective) -> list[str]:
    """One line per veRL policy-loss flag that ``loss_mode=rlstab`` does not read, changed from veRL's default.

    A flag is reported when its value differs from veRL's default and, where the objective's
    surrogate has the same parameter, from the objective's value too (veRL's default
    ``clip_ratio_high=0.2`` beside a DAPO objective's ``eps_high: 0.28`` is no user's choice).
    ``loss_agg_mode`` is read by veRL's own terms: [`check_actor`][rlstab.adapters.verl.config.check_actor]
    warns about it whenever it aggregates unlike the objective, its default included.
    """
    surrogate, notes = objective.surrogate, []
    sections = [(ACTOR_PATH, actor, _ACTOR_FLAGS), (CONFIG_PATH, actor.policy_loss, _POLICY_LOSS_FLAGS)]
    for path, config, flags in sections:
        defaults = _defaults(type(config))
        for flag, attribute in flags.items():
            if flag not in defaults or not hasattr(config, flag):
                continue
            value = getattr(config, flag)
            if value == defaults[flag]:
                continue
            if attribute is not None and hasattr(surrogate, attribute):
                ours = getattr(surrogate, attribute)
                if value == ours:
                    continue
                where = f"the objective has surrogate.{attribute} = {ours}; change it in the objective"
            else:
                where = f"the objective's surrogate ({surrogate.kind}) decides the policy loss"
            notes.append(f"{path}.{flag} = {value!r} is not used under loss_mode=rlstab: {where}")
    return notes


def _defaults(config_class: type) -> dict[str, Any]:
    """The dataclass defaults of a veRL config class (field -> default), factories left out."""
    if not dataclasses.is_dataclass(config_class):
        return {}
    return {f.name: f.default for f in dataclasses.fields(config_class) if f.default is not dataclasses.MISSING}
