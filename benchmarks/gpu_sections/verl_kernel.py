"""veRL's fused LM-head kernel, ``linear_cross_entropy``, with the rest of veRL or without it.

``import verl`` runs ``verl/__init__.py``, which imports ray, tensordict, transformers and more (its
``DataProto``); a bare CUDA machine has none of them. The kernel does not need them:
``verl/utils/kernel/linear_cross_entropy.py`` imports torch alone, and the kernels it calls
(``verl/utils/kernel/kernels.py``) import torch, Triton and ``verl.utils.device``, which imports
``packaging`` and ``verl.plugin.platform`` (torch again). So ``load_linear_cross_entropy`` tries
``import verl`` first and, when that fails, loads the kernel files alone: it finds veRL's folder
with ``importlib.util.find_spec("verl")`` (which runs none of veRL's code), puts stand-ins for the
packages ``verl`` and ``verl.utils`` in ``sys.modules`` (empty modules whose ``__path__`` is the
real folder, marked with ``STANDIN``), and imports ``verl.utils.kernel.linear_cross_entropy`` and
``verl.utils.kernel.kernels`` for real: ``verl/__init__.py`` and ``verl/utils/__init__.py`` never
run. The stand-ins stay (the kernel imports ``kernels`` at its first call, relative to its
package); a later ``import verl`` in the process gets the stand-in, without veRL's attributes.

veRL's ``entropy_from_logits`` and ``logprobs_from_logits`` cannot be loaded this way:
``verl/utils/torch_functional.py`` imports tensordict and transformers at its top.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KERNEL = "verl.utils.kernel.linear_cross_entropy"
KERNELS = "verl.utils.kernel.kernels"  # what the kernel calls; imported here so that a missing dependency shows now
STANDIN = "__verl_init_not_run__"  # True on the stand-in packages
BY_IMPORT, BY_FILES = "import verl", "kernel files alone"


@dataclass(frozen=True)
class VerlKernel:
    """veRL's ``linear_cross_entropy`` and how it was loaded, or why it was not.

    ``status``: ``ok``; ``unavailable (...)`` when veRL is not installed (not a failure); ``failed: ...``
    when veRL is there and its kernel did not load.
    """

    linear_cross_entropy: Callable | None
    loaded_by: str | None  # BY_IMPORT or BY_FILES
    version: str | None
    status: str
    import_error: str | None = None  # why ``import verl`` failed, when it did


def load_linear_cross_entropy() -> VerlKernel:
    """veRL's ``linear_cross_entropy``: by ``import verl``, else from the kernel files alone."""
    loaded = sys.modules.get("verl")
    if loaded is None or not getattr(loaded, STANDIN, False):
        try:
            verl = importlib.import_module("verl")
        except Exception as exc:  # noqa: BLE001 - ray, tensordict, ... missing: try the kernel files
            import_error = _reason(exc)
        else:
            try:
                function = _import_kernel()
            except Exception as exc:  # noqa: BLE001 - veRL imports but its kernel does not
                return VerlKernel(None, BY_IMPORT, getattr(verl, "__version__", None), f"failed: {_reason(exc)}")
            return VerlKernel(function, BY_IMPORT, getattr(verl, "__version__", None), "ok")
    else:
        import_error = "the kernel files were loaded alone before"
    return _from_kernel_files(import_error)


def _from_kernel_files(import_error: str) -> VerlKernel:
    folder = _verl_folder()
    if folder is None:
        return VerlKernel(None, None, None, f"unavailable (veRL is not installed: {import_error})", import_error)
    version = _version(folder)
    added = _add_standins(folder)
    before = set(sys.modules)
    try:
        function = _import_kernel()
    except Exception as exc:  # noqa: BLE001 - leave sys.modules as it was: no half-loaded veRL
        for name in [*added, *(set(sys.modules) - before)]:
            if name == "verl" or name.startswith("verl."):
                sys.modules.pop(name, None)
        return VerlKernel(None, BY_FILES, version, f"failed: {_reason(exc)}", import_error)
    return VerlKernel(function, BY_FILES, version, "ok", import_error)


def _import_kernel() -> Callable:
    function = importlib.import_module(KERNEL).linear_cross_entropy
    importlib.import_module(KERNELS)
    return function


def _verl_folder() -> Path | None:
    """The folder of the ``verl`` package that ``import verl`` would run, found without running it."""
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _version(folder: Path) -> str | None:
    """veRL's version as ``verl/__init__.py`` reads it (``verl/version/version``), else its distribution's."""
    try:
        return (folder / "version" / "version").read_text().strip()
    except OSError:
        pass
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def _add_standins(folder: Path) -> list[str]:
    """Stand-ins for ``verl`` and ``verl.utils`` where ``sys.modules`` has neither; the names added."""
    added = []
    for name, path in (("verl", folder), ("verl.utils", folder / "utils")):
        if name not in sys.modules:
            sys.modules[name] = _standin(name, path)
            added.append(name)
    if "verl.utils" in added:
        sys.modules["verl"].utils = sys.modules["verl.utils"]
    return added


def _standin(name: str, folder: Path) -> types.ModuleType:
    """An empty package ``name`` whose submodules are found in ``folder``; its ``__init__.py`` is not run."""
    module = types.ModuleType(name, f"A stand-in for {name}: its __init__.py was not run ({__name__}).")
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    module.__spec__, module.__path__, module.__package__ = spec, [str(folder)], name
    setattr(module, STANDIN, True)
    return module


def _reason(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    return f"{type(exc).__name__}: {first}"
