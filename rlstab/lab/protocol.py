"""A comparison's protocol file: who is paired with whom, and how the report decides, written down before the runs.

A YAML mapping; every field is optional::

    baseline: dapo          # the objective the others are paired with (default: the first)
    pairs:                  # objectives paired with another baseline instead, e.g. the one they extend
      stapo: dapo
    gates:                  # per arm, a mask that must act in that arm's runs (rlstab.lab.gates)
      stapo: {mask: s2t, at_least: 1.0e-4, on_share_of_steps: 0.2}
      dapo-shadow: {mask: shadow/s2t, at_least: 1.0e-4, on_share_of_steps: 0.2}
    fallback: "if a gate fails: ..."      # printed with the outcome when any gate fails
    primary: [entropy_ratio]              # one Holm family; the other compared metrics form a second one
    trend:                                # one pre-registered dose-trend test (rlstab.lab.trend), a primary
      arms: [dapo, stapo-low, stapo, stapo-high]
      doses: [0, 0.002, 0.01, 0.05]
      metric: entropy_ratio

``gates.ARM``: in ARM's runs, the mask ``mask`` (an acting mask's label, ``s2t``, or a shadow mask's,
``shadow/s2t``, as the metrics rows name them) silences at least ``at_least`` of a step's valid tokens
on at least ``on_share_of_steps`` of the RL steps, pooled over the seeds. ``primary`` and
``trend.metric`` name summary metrics by their key (``rlstab.lab.paired.METRICS``, as ``results.json``
names them: ``entropy_ratio``) or by the report's name (``entropy ratio``, ``rlstab.lab.paired.NAMES``);
the loaded protocol holds the keys. A primary metric that is not among the report's paired metrics
joins them.

``rlstab compare --protocol FILE`` reads it; ``--baseline`` and ``--pair`` on the command line add to
it (a baseline given both ways must agree, and an objective is paired once). The file is read like
an objective file (YAML 1.2 data, the same size limits); every problem is one ``ConfigError`` line
naming the YAML path and the value. What needs the objectives (an arm that is not one of them, a mask
its objective does not have) is checked by ``plan``; what needs the runs (a mask no run reports, a
metric no run measured), when the report is made.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlstab.errors import ConfigError, short
from rlstab.lab.paired import METRICS, NAMES
from rlstab.lab.summary import TIMING
from rlstab.loading.limits import LIMITS
from rlstab.loading.text import read_text
from rlstab.loading.wording import describe_validation_error
from rlstab.loading.yaml12 import parse_yaml

COMPARABLE = tuple(m for m in METRICS if m not in TIMING)
"""The metrics ``primary`` and ``trend.metric`` may name: every summary metric of a report but the measured wall time."""
_BY_NAME = {name: key for key, name in NAMES.items()}


class ProtocolMismatch(ValueError):
    """A protocol that does not fit the runs it is applied to (one line naming the protocol field and the value)."""


class Gate(BaseModel):
    """A mask that must act in an arm's runs: ``mask`` silences at least ``at_least`` of a step's valid tokens
    on at least ``on_share_of_steps`` of the steps (pooled over seeds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mask: str = Field(min_length=1, max_length=200, pattern=r"^(shadow/)?[A-Za-z0-9][A-Za-z0-9_.-]*$")
    at_least: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)
    on_share_of_steps: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)


class Trend(BaseModel):
    """One dose-trend test over ``arms`` (at least 3, each given its ``dose``) of ``metric``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arms: list[str] = Field(min_length=3, max_length=100)
    doses: list[Annotated[float, Field(allow_inf_nan=False)]] = Field(min_length=3, max_length=100)
    metric: str = Field(min_length=1, max_length=200)


class Protocol(BaseModel):
    """A comparison's protocol: the pairing, the firing gates and the Holm families."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline: str | None = Field(default=None, min_length=1, max_length=200)
    pairs: dict[str, str] = Field(default_factory=dict)
    gates: dict[str, Gate] = Field(default_factory=dict)
    fallback: str | None = Field(default=None, min_length=1, max_length=10_000)
    primary: list[str] | None = Field(default=None, min_length=1, max_length=100)
    trend: Trend | None = None

    def pair_items(self) -> list[str]:
        """``pairs`` as ``OBJECTIVE=BASELINE`` items, as ``--pair`` gives them."""
        return [f"{objective}={baseline}" for objective, baseline in self.pairs.items()]

    @property
    def decides(self) -> bool:
        """Whether the protocol says more than the pairing (gates, fallback, families or a trend)."""
        return bool(self.gates or self.fallback or self.primary is not None or self.trend is not None)


def load_protocol(path: str | Path) -> Protocol:
    """The protocol in the YAML file ``path``; ConfigError (one line per problem) otherwise."""
    label = str(path)
    data = parse_yaml(read_text(Path(path), label, LIMITS.bytes, LIMITS.bytes)[0], label)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(label, [f"a protocol file holds a mapping (baseline, pairs, gates, ...), not {type(data).__name__}"])
    return validate_protocol(data, label)


def validate_protocol(data: dict, label: str = "<protocol>") -> Protocol:
    """``data`` as a Protocol; ConfigError (one line per problem, naming the YAML path and the value) otherwise."""
    try:
        protocol = Protocol.model_validate(data, strict=True)
    except ValidationError as err:
        raise ConfigError(label, describe_validation_error(err, data, Protocol)) from None
    problems = _problems(protocol)
    if problems:
        raise ConfigError(label, problems)
    update = {}
    if protocol.primary is not None:
        update["primary"] = [_BY_NAME.get(name, name) for name in protocol.primary]
    if protocol.trend is not None:
        update["trend"] = protocol.trend.model_copy(update={"metric": _BY_NAME.get(protocol.trend.metric, protocol.trend.metric)})
    return protocol.model_copy(update=update)


def _metric_problem(path: str, name: str) -> str | None:
    if name in COMPARABLE or name in _BY_NAME:
        return None
    close = difflib.get_close_matches(name.replace(" ", "_"), COMPARABLE, n=2, cutoff=0.6)
    guess = f"; did you mean {' or '.join(map(repr, close))}?" if close else f"; one of {', '.join(COMPARABLE)}"
    return f"{path} = {short(name)}: not a summary metric the report compares{guess}"


def _problems(p: Protocol) -> list[str]:
    """What pydantic's types and bounds do not say: repeated names, doses and arms that do not match, unknown metrics."""
    problems = []
    for i, name in enumerate(p.primary or []):
        problem = _metric_problem(f"primary[{i}]", name)
        keys = [_BY_NAME.get(n, n) for n in p.primary]
        if problem:
            problems.append(problem)
        elif keys.index(keys[i]) < i:
            problems.append(f"primary[{i}] = {short(name)}: given twice")
    if p.trend is not None:
        t = p.trend
        if len(t.doses) != len(t.arms):
            problems.append(f"trend.doses = {short(t.doses)}: one dose per arm ({len(t.arms)} arms, {len(t.doses)} doses)")
        for i, arm in enumerate(t.arms):
            if t.arms.index(arm) < i:
                problems.append(f"trend.arms[{i}] = {short(arm)}: given twice")
        for i, dose in enumerate(t.doses):
            if t.doses.index(dose) < i:
                problems.append(f"trend.doses[{i}] = {dose!r}: given twice; the doses are ranked, so each arm needs its own")
        problem = _metric_problem("trend.metric", t.metric)
        if problem:
            problems.append(problem)
    return problems


def check_arms(protocol: Protocol, labels: list[str], mask_labels: dict[str, list[str]] | None = None) -> list[str]:
    """The protocol's problems against a grid's objectives ``labels``: arms of ``gates`` and ``trend`` that are not
    among them, and (given ``mask_labels``, each objective's masks and shadow masks) a gate's mask its arm lacks."""
    problems = []
    for arm, gate in protocol.gates.items():
        if arm not in labels:
            problems.append(f"protocol gates.{arm}: {arm!r} is not one of the objectives ({', '.join(labels)})")
        elif mask_labels is not None and gate.mask not in mask_labels[arm]:
            has = ", ".join(mask_labels[arm]) or "none"
            problems.append(f"protocol gates.{arm}.mask = {gate.mask!r}: {arm} has no such mask (its masks: {has})")
    if protocol.trend is not None:
        for i, arm in enumerate(protocol.trend.arms):
            if arm not in labels:
                problems.append(f"protocol trend.arms[{i}] = {arm!r}: not one of the objectives ({', '.join(labels)})")
    return problems


def merged(protocol: Protocol | None, baseline: str | None, pair: list[str]) -> tuple[str | None, list[str]]:
    """The baseline and ``OBJECTIVE=BASELINE`` items of ``protocol`` and the command line together."""
    if protocol is None:
        return baseline, list(pair)
    if baseline is not None and protocol.baseline is not None and baseline != protocol.baseline:
        raise ConfigError("--baseline", [f"{baseline!r} differs from the protocol's baseline {protocol.baseline!r}"])
    return baseline if baseline is not None else protocol.baseline, protocol.pair_items() + list(pair)
