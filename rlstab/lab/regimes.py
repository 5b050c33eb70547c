"""Stress regimes: named trainer settings (not objective settings) for ``rlstab compare``.

A regime says how the embedded trainer runs (learning rate, optimizer updates per rollout batch,
policy lag, task, ...); an objective says what loss it trains with. Regimes ship as YAML in
``rlstab/lab/regimes/`` and a user writes their own the same way: every field is optional and
defaults to the ``default`` regime's value (today's ``rlstab demo``). A regime file is read like an
objective file (YAML 1.2 data, the same size and nesting limits) and every problem is one
``ConfigError`` line naming the file, the field, the value and what is allowed.
"""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from rlstab.errors import ConfigError
from rlstab.loading.limits import LIMITS
from rlstab.loading.text import read_text
from rlstab.loading.wording import describe_validation_error
from rlstab.loading.yaml12 import parse_yaml
from rlstab.trainer.config import TrainConfig, TrainerSettings

_HERE = Path(__file__).parent / "regimes"


class Regime(TrainerSettings):
    """The embedded trainer's settings for one stress regime (``TrainerSettings``: defaults are ``rlstab demo``'s run),
    named, with the task it needs if any."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Folder-safe name: letters, digits, ``_``, ``.`` and ``-``."""
    description: str = ""
    task: str | None = None
    """A task the regime needs (``sparse`` fixes ``mul2``); None takes the run's ``--task``."""

    def train_config(self, *, steps: int, seed: int) -> TrainConfig:
        """The trainer's config of a run of ``steps`` steps from ``seed`` under this regime."""
        settings = self.model_dump(include=set(TrainerSettings.model_fields))
        return TrainConfig(**settings, steps=steps, seed=seed)


@cache
def regime_names() -> tuple[str, ...]:
    """Names of the shipped regimes, sorted."""
    return tuple(sorted(p.stem for p in _HERE.glob("*.yaml")))


def load_regime(source: str | Path | dict[str, Any] | Regime) -> Regime:
    """A :class:`Regime` from a shipped name, a YAML file, a mapping or a Regime; ConfigError otherwise."""
    if isinstance(source, Regime):
        return source
    if isinstance(source, dict):
        return _validate(dict(source), "<regime dict>")
    text = str(source)
    if isinstance(source, str) and text in regime_names():
        path, label = _HERE / f"{text}.yaml", f"regime {text}"
    elif text.endswith((".yaml", ".yml")):
        path, label = Path(text), text
    else:
        close = difflib.get_close_matches(text, regime_names(), n=3, cutoff=0.6)
        hint = ("did you mean " + " or ".join(map(repr, close)) + "?") if close else f"shipped: {', '.join(regime_names())}"
        raise ConfigError(text, [f"not a regime name or a .yaml file ({hint})"])
    data = parse_yaml(read_text(path, label, LIMITS.bytes, LIMITS.bytes)[0], label)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(label, [f"a regime file holds a mapping of trainer settings, not {type(data).__name__}"])
    data.setdefault("name", path.stem)
    return _validate(data, label)


def _validate(data: dict, label: str) -> Regime:
    try:
        return Regime.model_validate(data)
    except ValidationError as err:
        raise ConfigError(label, describe_validation_error(err, data, Regime)) from None
