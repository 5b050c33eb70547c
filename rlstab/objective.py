"""An objective: one point in the space of stability methods, as a validated pydantic model.

    L = Agg_{i,t}[ M_{i,t} * W_{i,t} * l(r_{i,t}, A_{i,t}) ] + sum_k c_k * Agg(R_k)

A is the advantage (estimator), M the AND of the token masks, W the product of the
reweighters' factors, l the surrogate, Agg the aggregation, R the regularisers. Presets and user YAML files are instances of this model.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlstab.advantages import GRPO
from rlstab.clipping import PPOClip
from rlstab.components import python_numbers
from rlstab.mask_slots import match_problems
from rlstab.registry.families import FAMILIES, with_instance_problems
from rlstab.registry.store import rebuild_on_change
from rlstab.yaml_core_schema import dump_yaml

COMPILER = "rlstab.compiled"
"""The module of the compiler's facade, which ``Objective.compile()`` imports by name when it is called."""

# Each field's type is its family: a tagged union over the kinds registered when the schema is built.
AnyAdvantage = FAMILIES["advantage"].annotation
AnyMask = FAMILIES["masks"].annotation
AnyReweighter = FAMILIES["reweighters"].annotation
AnySurrogate = FAMILIES["surrogate"].annotation
AnyAggregation = FAMILIES["aggregation"].annotation
AnyRegulariser = FAMILIES["regularisers"].annotation
AnyRewardShaping = FAMILIES["reward_shaping"].annotation
AnyGroupFilter = FAMILIES["group_filter"].annotation
AnyLearningRateScale = FAMILIES["lr_scale"].annotation
AnyStreamWeighting = FAMILIES["dual_stream"].annotation
AnySampler = FAMILIES["sampler"].annotation
AnyRollout = FAMILIES["rollout"].annotation


@rebuild_on_change
class Objective(BaseModel):
    """A complete RL policy objective. Build it with [`rlstab.load`][rlstab.load]; run it with ``compile()``.

    Data only: what the objective's loss reads and keeps is its [`Plan`][rlstab.compiler.plan.Plan]
    (``Plan.of(objective)``), its readable formula [`rlstab.explain.explain`][rlstab.explain.explain],
    its loss [`rlstab.compile`][rlstab.compile] (``compile()`` is an alias).

    ``dropped``: the components of a parent's list that a list of the ``extends:`` chain replaced
    without keeping, one [`Dropped`][rlstab.loading.lists.Dropped] per such list (what ``rlstab
    validate`` and ``rlstab explain`` print as notes); empty unless [`rlstab.load`][rlstab.load] found
    one. Not a field: it says how the objective was written, not what it computes, so equality,
    ``fingerprint()`` and ``to_yaml()`` leave it out.
    """

    # defer_build: the schema (and so the registry's entry points) is built at the first validation, not at import.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True, defer_build=True)

    name: str | None = None
    """A short name (presets set it)."""
    description: str | None = None
    """What the objective is and where it comes from."""
    advantage: AnyAdvantage = Field(default_factory=GRPO)
    """How advantages are computed when the trainer does not supply them."""
    masks: list[AnyMask] = Field(default_factory=list)
    """Token masks, AND-ed: a token trains only if every mask keeps it."""
    shadow_masks: list[AnyMask] = Field(default_factory=list)
    """Masks measured while they do not act: each step's ``shadow/<label>/kept`` and ``/silenced`` say what
    they would have silenced (with their own step thresholds); the loss and gradients are those without them."""
    reweighters: list[AnyReweighter] = Field(default_factory=list)
    """Positive factors on each token's loss (advantage reweighting, importance corrections); they multiply."""
    surrogate: AnySurrogate = Field(default_factory=PPOClip)
    """The per-token loss l(r, A)."""
    aggregation: AnyAggregation
    """How per-token losses become one number; its denominator is part of the method."""
    regularisers: list[AnyRegulariser] = Field(default_factory=list)
    """Terms added to the policy loss."""
    reward_shaping: list[AnyRewardShaping] = Field(default_factory=list)
    """Terms added to each response's reward before the advantage estimator (DAPO's overlong penalty)."""
    group_filter: AnyGroupFilter | None = None
    """Drop prompt groups over the whole step (DAPO's dynamic sampling): their responses become padding."""
    lr_scale: AnyLearningRateScale | None = None
    """A factor for the step's learning rate, returned by gather as ``StepStats.lr_scale`` (VCPO)."""
    dual_stream: AnyStreamWeighting | None = None
    """Aggregate DEEP-GRPO's branch rows (``TokenBatch.is_branch``) apart and add them with weight lambda."""
    sampler: AnySampler | None = None
    """Which prompts to train on (sample layer: Goldilocks); executed by the trainer, not the loss."""
    rollout: AnyRollout | None = None
    """How rollouts are generated (exploration layer: DEEP-GRPO's pivot branching); executed by the trainer."""
    log_ratio_clamp: float = Field(20.0, gt=0.0, le=80.0)
    """log r is clamped to [-c, c] before exp (veRL uses 20), so a stale token cannot overflow."""
    quantile_mode: Literal["exact", "histogram"] = "exact"
    """How the masks' step quantiles (entropy thresholds) are found over all micro-batches and ranks:
    ``exact`` (default), or ``histogram``: within ``max(|x| / 128, 2**-133)`` of the exact value, one
    histogram pass and one 512 KiB all-reduce fewer per quantile, for very large steps (see
    [`rlstab.quantile`][rlstab.quantile]). Steps of at most 8,192 tokens are exact either way."""

    dropped: ClassVar[tuple[Any, ...]] = ()  # Dropped records, set on an instance by rlstab.load; see the class docstring

    @model_validator(mode="wrap")
    @classmethod
    def _explain_component_objects(cls, data: Any, handler: Any) -> Objective:
        try:
            objective = handler(data)
        except ValidationError as err:  # a component object of another family, or of a kind nobody registered
            raise with_instance_problems(err, data) if isinstance(data, dict) else err from None
        problems = match_problems(objective)  # a shadow rejection; a match that names no matchable mask
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, [
                {"type": PydanticCustomError("mask_match", "{message}", {"message": message}), "loc": loc, "input": value}
                for loc, message, value in problems
            ])
        return objective

    @field_validator("*", mode="before")
    @classmethod
    def _python_numbers(cls, value: Any) -> Any:  # a tensor for log_ratio_clamp: refused, as in every component
        return python_numbers(value)

    def compile(self):
        """The loss callable, ``loss_fn(batch) -> LossOutput``: a [`CompiledObjective`][rlstab.CompiledObjective].

        An alias of [`rlstab.compile(objective)`][rlstab.compile], late-bound so that the data model imports
        nothing of the compiler: the compiler's module (``COMPILER``) is found by name when this is called,
        and importing ``rlstab.objective`` imports neither it nor torch. The one method of the objective
        that reaches the compiler, kept because ``rlstab.load(...).compile()`` is how the README and most
        code call it. It is a real edge back (objective -> compiled -> objective): ``tests/test_import_cycles.py``
        counts it and allows it alone, by name; a picture drawn from ``import`` statements only does not show it."""
        return importlib.import_module(COMPILER).CompiledObjective(self)

    def fingerprint(self) -> str:
        """A digest of what the objective computes: sha256 of its canonical JSON, name and description left out.

        [`StepStats`][rlstab.StepStats] carry the fingerprint of the objective that gathered them,
        and a compiled loss refuses statistics with another one: another objective's thresholds,
        estimator state and hooks would be read wrongly (or silently dropped). Objectives that
        differ only in their name or description compute the same thing and share statistics.
        """
        data = self.model_dump(exclude={"name", "description"})  # python mode: an infinite bound stays Infinity
        for layer in _LATER_FIELDS:  # absent, as before they existed: an objective without them keeps its digest
            if data[layer] in (None, []):
                del data[layer]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_yaml(self) -> str:
        """YAML that [`rlstab.load`][rlstab.load] turns back into an equal objective."""
        data = _without_default_nulls(self, self.model_dump(mode="json"))
        if not data["shadow_masks"]:  # a later field: left out while empty, as before it existed
            del data["shadow_masks"]
        return dump_yaml(_kind_first(data))


# Fields added after fingerprints were first published; left out of the digest while unset.
_LATER_FIELDS = ("dual_stream", "sampler", "rollout", "shadow_masks")


def _without_default_nulls(model, data):
    """``data`` (``model``'s dump) without the nulls that are their field's default.

    A null set where the default is a value (``decoupled_ppo``'s ``cap: null``) stays, so that
    the YAML loads back to the same objective.
    """
    if isinstance(model, BaseModel) and isinstance(data, dict):
        fields = type(model).model_fields
        return {
            name: _without_default_nulls(getattr(model, name, None), value)
            for name, value in data.items()
            if not (value is None and name in fields and fields[name].default is None)
        }
    if isinstance(model, (list, tuple)) and isinstance(data, list):
        return [_without_default_nulls(m, v) for m, v in zip(model, data)]
    return data


def _kind_first(data):
    """Put each component's ``kind`` first, where a reader looks for it."""
    if isinstance(data, dict):
        ordered = {"kind": data["kind"]} if "kind" in data else {}
        ordered.update({k: _kind_first(v) for k, v in data.items() if k != "kind"})
        return ordered
    if isinstance(data, list):
        return [_kind_first(v) for v in data]
    return data
