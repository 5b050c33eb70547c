"""torch, imported at its first use: ``from rlstab.lazy import torch`` (and ``distributed``).

Validating, explaining and listing objectives (``rlstab validate`` in a pre-commit hook or an
editor) needs pydantic, not tensors, and importing torch takes longer than all the rest. So the
modules of rlstab hold a stand-in that imports torch at its first attribute access, with torch's
"Failed to initialize NumPy" warning filtered (rlstab never uses NumPy), and then puts the real
modules in its place: in the globals of every loaded module that holds a stand-in, and here, for
later importers. A loss thus calls torch itself on every micro-batch, never through the stand-in.
Code that uses torch when its module is imported (a ``torch.autograd.Function`` subclass, a
``@torch.no_grad()`` decorator) loads torch then, and must stay off the validation path.

Plugins use it too: the registry imports every installed plugin's module to validate an objective,
so a plugin that imports torch at its top makes every validation pay for torch.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING


@contextmanager
def no_numpy_warning() -> Iterator[None]:
    """Around what may import torch (here, and a plugin loaded by the registry): torch warns at import when
    NumPy is absent; rlstab never uses NumPy, so the commands' output stays clean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        yield


def load() -> types.ModuleType:
    """Import torch (NumPy's warning filtered) and replace every stand-in by its module; returns torch."""
    with no_numpy_warning():
        real = importlib.import_module("torch")
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        try:  # past a module's own __getattribute__ (importlib's lazy modules would load themselves)
            namespace = object.__getattribute__(module, "__dict__")
        except AttributeError:
            continue
        for name, value in list(namespace.items()):
            if type(value) is _StandIn:
                namespace[name] = importlib.import_module(object.__getattribute__(value, "__name__"))
    return real


class _StandIn(types.ModuleType):
    """A torch module not imported yet; any attribute it does not have loads torch (see ``load``)."""

    def __getattr__(self, name: str):
        load()
        return getattr(importlib.import_module(self.__name__), name)

    def __repr__(self) -> str:
        return f"<module {self.__name__!r}, imported at its first use by rlstab>"


if TYPE_CHECKING:  # type checkers see the modules themselves
    import torch
    import torch.distributed as distributed
elif "torch" in sys.modules:  # imported already (by the user, or another library): nothing to defer
    import torch
    import torch.distributed as distributed
else:
    torch = _StandIn("torch")
    distributed = _StandIn("torch.distributed")
