"""The objective of a ``RlstabAsyncGRPOTrainer``, checked against its ``AsyncGRPOConfig`` and ``old_logprobs``.

TRL's ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``) has a fixed loss: the PPO clip
(``epsilon``, ``epsilon_high``) of the ratio to the sampler's log-probabilities, summed over the
micro-batch's tokens and divided by their count, no KL, no entropy bonus, no token mask. So,
unlike ``GRPOConfig``, no flag adds a term rlstab would have to refuse. Checked once, in
``__init__``, before TRL loads the model:

- **Refused: what the async trainer cannot give the loss**, in one line each, the lines
  ``rlstab validate --trainer trl-async`` prints (``trainers.TRL_ASYNC``): reference
  log-probabilities (no reference model: a ``kl`` regulariser), rewards and prompt groups (its
  rollout worker hands the loss advantages), and the parts only a trainer executes (``lr_scale``,
  a sampler, ...).
- **Refused unless** ``old_logprobs='proximal'``: components that read ``rollout_logprobs``
  (TIS, IcePop, decoupled PPO, the rollout masks). The trainer keeps one log-probability per
  token, the sampler's; by default it is the ratio's old policy (as in TRL's own loss), and a
  train/inference ratio of it against itself would be 1 everywhere: the correction would
  silently do nothing.
- **Warned: flags the objective overrides.** ``epsilon`` and ``epsilon_high`` are not read; when
  one was changed from TRL's default to a value the objective contradicts, a warning names it.
- **Advantages come from TRL's rollout worker**, ``(R - mean) / (std + 1e-8)`` per group (the
  population std, ``AsyncRolloutWorker._score_group``); a warning when the objective names an
  estimator that is not a group normalisation.

The checks read the objective and its plan, never its compiled loss: checking compiles nothing.
"""

from __future__ import annotations

import warnings

from rlstab.adapters import trainers
from rlstab.adapters.trainer_parts import unsupplied
from rlstab.advantages import GRPO, Given
from rlstab.errors import ConfigError
from rlstab.objective import Objective

LABEL = "RlstabAsyncGRPOTrainer"
OLD_LOGPROBS = ("sampler", "proximal")
"""``RlstabAsyncGRPOTrainer(old_logprobs=...)``: what the ratio's old policy is (see ``async_inputs``)."""
_EPSILON_DEFAULT = 0.2  # AsyncGRPOConfig.epsilon; epsilon_high defaults to None (= epsilon)


def check_async_config(objective: Objective, args, old_logprobs: str = "sampler") -> list[str]:
    """Refuse what ``AsyncGRPOTrainer`` cannot supply; return warnings for the flags the objective overrides.

    Raises [`ConfigError`][rlstab.ConfigError] with one line per problem, each naming the
    component, the field and what to do instead. ``args``: the ``AsyncGRPOConfig`` (None: TRL's
    defaults). The returned warnings are also issued with ``warnings.warn``.
    """
    name = objective.name or "custom"
    label = f"{LABEL}(objective={name!r}, old_logprobs={old_logprobs!r})"
    if old_logprobs not in OLD_LOGPROBS:
        raise ConfigError(label, [f"old_logprobs = {old_logprobs!r}: must be one of {', '.join(map(repr, OLD_LOGPROBS))}"])
    problems = trainers.problems(objective, "trl-async")  # what `rlstab validate --trainer trl-async` reports too
    if old_logprobs != "proximal":
        advice = {field: why for field, (_, why) in trainers.TRL_ASYNC.on_setting.items()}
        problems += unsupplied(objective, advice, every_adapter=False)
    if problems:
        raise ConfigError(label, problems)
    notes = _ignored_flags(objective, args) + _advantage_notes(objective)
    for note in notes:
        warnings.warn(f"{label}: {note}", UserWarning, stacklevel=3)
    return notes


def _ignored_flags(objective: Objective, args) -> list[str]:
    """``epsilon`` / ``epsilon_high`` changed from TRL's default to a value the objective's surrogate contradicts."""
    if args is None:
        return []
    surrogate, notes = objective.surrogate, []
    for field, attribute in (("epsilon", "eps_low"), ("epsilon_high", "eps_high")):
        value = getattr(args, field)
        if value is None or value == _EPSILON_DEFAULT:
            continue
        if not hasattr(surrogate, attribute):
            notes.append(f"{field} = {value!r} is not used: the objective's surrogate ({surrogate.kind}) decides")
        elif value != getattr(surrogate, attribute):
            notes.append(
                f"{field} = {value!r} is not used: the objective has surrogate.{attribute} = "
                f"{getattr(surrogate, attribute)}; change it in the objective"
            )
    return notes


def _advantage_notes(objective: Objective) -> list[str]:
    est = objective.advantage
    if isinstance(est, Given) or (isinstance(est, GRPO) and est.normalize_std):
        return []
    return [
        f"the objective's advantage estimator ({est.kind}) is not used: TRL's rollout worker computes the advantages, "
        "(R - mean) / (std + 1e-8) per prompt group"
    ]
