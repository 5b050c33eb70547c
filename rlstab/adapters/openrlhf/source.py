"""OpenRLHF's own ``openrlhf/models/loss.py``, loaded without ``openrlhf/models/__init__.py``.

Why not ``import openrlhf.models.loss``: importing a submodule runs its package's ``__init__``
first, and ``openrlhf/models/__init__.py`` imports ``Actor``, whose module imports
``flash_attn`` (through ``ring_attn_utils``), ``peft`` and ``transformers``. flash-attn only
builds against CUDA, so on a CPU machine (CI, a laptop validating a config) the import fails,
and where it works it costs seconds. The loss module itself needs only torch and
``openrlhf/models/utils.py`` (torch and deepspeed).

So, when ``openrlhf.models`` has not been imported, the files are loaded from the installed
package's directory under a private parent package (``_rlstab_openrlhf_models``) whose
``__path__`` is ``openrlhf/models``: ``loss.py`` runs unchanged, its relative import
``from .utils import masked_mean`` resolves to the real ``utils.py``, and nothing is registered
under OpenRLHF's own module names, so a later ``import openrlhf.models`` (in a Ray worker with
flash-attn) imports the package normally. When ``openrlhf.models`` is already imported, its
loss module is used, so [`RlstabPolicyLoss`][rlstab.adapters.openrlhf.RlstabPolicyLoss]
subclasses the very ``PolicyLoss`` that OpenRLHF's trainer uses.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import sys
import types
import warnings
from pathlib import Path

SUPPORTED_OPENRLHF = "0.11.2"
"""The OpenRLHF release whose ``PolicyLoss`` and ``ActorPPOTrainer`` this adapter is tested against."""

# PolicyLoss.forward's parameters in 0.11.2 (the API changed within 0.11.x).
FORWARD_PARAMETERS = (
    "log_probs",
    "old_log_probs",
    "advantages",
    "action_mask",
    "rollout_log_probs",
    "dp_size",
    "batch_num_tokens",
    "global_batch_size",
)
_PRIVATE_PACKAGE = "_rlstab_openrlhf_models"


def openrlhf_version() -> str | None:
    try:
        return importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        return None


def loss_module() -> types.ModuleType:
    """OpenRLHF's ``openrlhf.models.loss`` module (the real file), checked for the 0.11.2 API."""
    module = sys.modules.get("openrlhf.models.loss")
    if module is None:
        module = _load_privately()
    _check_api(module)
    return module


def _load_privately() -> types.ModuleType:
    if _PRIVATE_PACKAGE + ".loss" in sys.modules:
        return sys.modules[_PRIVATE_PACKAGE + ".loss"]
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"rlstab's OpenRLHF adapter needs openrlhf=={SUPPORTED_OPENRLHF}: pip install \"rlstab[openrlhf]\" "
            "(on a machine without CUDA: pip install --no-deps openrlhf==0.11.2 deepspeed)"
        )
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    if not (models / "loss.py").is_file():
        raise ImportError(f"{models / 'loss.py'} does not exist: this openrlhf ({openrlhf_version()}) is not 0.11.x")
    package_spec = importlib.machinery.ModuleSpec(_PRIVATE_PACKAGE, None, is_package=True)
    package_spec.submodule_search_locations = [str(models)]
    package = importlib.util.module_from_spec(package_spec)
    sys.modules[_PRIVATE_PACKAGE] = package
    try:
        return importlib.import_module(_PRIVATE_PACKAGE + ".loss")
    except BaseException:
        for name in [n for n in sys.modules if n == _PRIVATE_PACKAGE or n.startswith(_PRIVATE_PACKAGE + ".")]:
            del sys.modules[name]
        raise


def _check_api(module: types.ModuleType) -> None:
    version = openrlhf_version()
    if version != SUPPORTED_OPENRLHF:
        warnings.warn(
            f"rlstab's OpenRLHF adapter is tested with openrlhf=={SUPPORTED_OPENRLHF}; this is openrlhf {version}",
            stacklevel=3,
        )
    policy_loss = getattr(module, "PolicyLoss", None)
    if policy_loss is None:
        raise ImportError(f"{module.__file__} defines no PolicyLoss: openrlhf {version} is not supported")
    found = tuple(inspect.signature(policy_loss.forward).parameters)[1:]
    if found != FORWARD_PARAMETERS:
        raise ImportError(
            f"openrlhf {version}: PolicyLoss.forward{found} differs from 0.11.2's {FORWARD_PARAMETERS}; "
            f"install openrlhf=={SUPPORTED_OPENRLHF}"
        )
