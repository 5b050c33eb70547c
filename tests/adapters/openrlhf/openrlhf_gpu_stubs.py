"""Import-time stand-ins for vLLM and flash-attn, for subprocesses that import OpenRLHF's trainer on CPU.

Both packages build only against CUDA. OpenRLHF 0.11.2's trainer modules import a few of their
names at import time (``openrlhf/trainer/ray/__init__.py`` imports the vLLM engine module;
``openrlhf/models/actor.py`` imports ``ring_attn_utils``, which imports flash-attn's padding
helpers) but call them only for vLLM generation and ``--ds.packing_samples``, which these tests
do not use. The stand-ins provide exactly those names and raise if anything calls them, so every
line of OpenRLHF that runs in a test is OpenRLHF's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_UNAVAILABLE = '''
def _unavailable(*args, **kwargs):
    raise RuntimeError("{package} is a CUDA-only package, stubbed for a CPU test")
'''

STUBS = {
    "vllm/__init__.py": _UNAVAILABLE.format(package="vLLM") + '__version__ = "0.29.0"\nSamplingParams = _unavailable\n',
    "vllm/inputs/__init__.py": _UNAVAILABLE.format(package="vLLM") + "TokensPrompt = _unavailable\n",
    "vllm/utils/__init__.py": _UNAVAILABLE.format(package="vLLM") + "random_uuid = _unavailable\n",
    "flash_attn/__init__.py": "",
    "flash_attn/bert_padding.py": _UNAVAILABLE.format(package="flash-attn")
    + "index_first_axis = pad_input = rearrange = unpad_input = _unavailable\n",
    "flash_attn/utils/__init__.py": "",
    "flash_attn/utils/distributed.py": _UNAVAILABLE.format(package="flash-attn") + "all_gather = _unavailable\n",
}


def write_stubs(directory: Path) -> Path:
    """Write the stand-in packages under ``directory`` and return it (put it on PYTHONPATH)."""
    for relative, text in STUBS.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return directory


def subprocess_env(stub_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment for a test subprocess: this interpreter's, plus the stubs on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(stub_dir)] if stub_dir is not None else []
    paths += [p for p in sys.path if p and "site-packages" not in p and Path(p).is_dir()]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env
