"""Run a function right after a module is imported (a post-import hook).

An adapter must patch trainer modules that a process may or may not import, and must not import
them itself:

- OpenRLHF: Ray's ``worker_process_setup_hook`` runs in *every* worker process at start-up (the
  policy actors, but also the vLLM engines, the reference and reward models), and OpenRLHF keeps
  deepspeed and its model code out of the vLLM processes on purpose (``openrlhf/__init__.py``).
  The patch runs when, and only if, the process imports the trainer module.
- veRL: the adapter is loaded by ``import verl`` in every process; importing verl's worker
  module from there would add over a second to every ``import verl``.

A finder at the front of ``sys.meta_path`` lets the other finders locate the module as usual
and wraps its loader's ``exec_module``: the module runs unchanged, then the callbacks run on it.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from types import ModuleType

_lock = threading.Lock()
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` is imported: now if it already is, else right after its import."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _pending.setdefault(name, []).append(callback)
            if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportFinder())
            return
    callback(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            with _lock:
                callbacks = _pending.pop(fullname, [])
            for callback in callbacks:
                callback(module)

        loader.exec_module = exec_then_patch  # this spec's own loader instance
        return spec
