"""A comparison's protocol file: who is paired with whom, written down before the runs.

A YAML mapping with two optional fields::

    baseline: grpo          # the objective the others are paired with (default: the first)
    pairs:                  # objectives paired with another baseline instead, e.g. the one they extend
      stapo: dapo
      20-entropy: dapo
      stare: dapo

``rlstab compare --protocol FILE`` reads it; ``--baseline`` and ``--pair`` on the command line add to
it (a baseline given both ways must agree, and an objective is paired once). The file is read like
an objective file (YAML 1.2 data, the same size limits); every problem is one ``ConfigError`` line.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlstab.errors import ConfigError
from rlstab.loading.limits import LIMITS
from rlstab.loading.text import read_text
from rlstab.loading.wording import describe_validation_error
from rlstab.loading.yaml12 import parse_yaml


class Protocol(BaseModel):
    """The pairing part of a comparison's protocol."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline: str | None = Field(default=None, min_length=1, max_length=200)
    pairs: dict[str, str] = Field(default_factory=dict)

    def pair_items(self) -> list[str]:
        """``pairs`` as ``OBJECTIVE=BASELINE`` items, as ``--pair`` gives them."""
        return [f"{objective}={baseline}" for objective, baseline in self.pairs.items()]


def load_protocol(path: str | Path) -> Protocol:
    """The protocol in the YAML file ``path``; ConfigError (one line per problem) otherwise."""
    label = str(path)
    data = parse_yaml(read_text(Path(path), label, LIMITS.bytes, LIMITS.bytes)[0], label)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(label, [f"a protocol file holds a mapping (baseline, pairs), not {type(data).__name__}"])
    try:
        return Protocol.model_validate(data, strict=True)
    except ValidationError as err:
        raise ConfigError(label, describe_validation_error(err, data, Protocol)) from None


def merged(protocol: Protocol | None, baseline: str | None, pair: list[str]) -> tuple[str | None, list[str]]:
    """The baseline and ``OBJECTIVE=BASELINE`` items of ``protocol`` and the command line together."""
    if protocol is None:
        return baseline, list(pair)
    if baseline is not None and protocol.baseline is not None and baseline != protocol.baseline:
        raise ConfigError("--baseline", [f"{baseline!r} differs from the protocol's baseline {protocol.baseline!r}"])
    return baseline if baseline is not None else protocol.baseline, protocol.pair_items() + list(pair)
