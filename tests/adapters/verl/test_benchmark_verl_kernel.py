"""``benchmarks/gpu.py`` gets veRL's ``linear_cross_entropy`` even where ``import verl`` fails.

On a bare CUDA machine ``import verl`` fails (no ray, no tensordict), and the LM-head table lost its
veRL column. ``benchmarks/gpu_sections/verl_kernel.py`` then loads the kernel from veRL's files
alone. Here, in a fresh process, ``import ray`` is made to fail (so ``import verl`` does) and the
loader must still return veRL's own function, with ``verl/__init__.py`` never run; with nothing
blocked it must come from ``import verl``. The kernel needs CUDA: on CPU only its identity is checked.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[3] / "benchmarks"

CHILD = r"""
import json, sys
if sys.argv[2] == "without ray":
    sys.modules["ray"] = None  # what a bare CUDA machine lacks: `import verl` fails on it
sys.path.insert(0, sys.argv[1])
from gpu_sections.verl_kernel import STANDIN, load_linear_cross_entropy

kernel = load_linear_cross_entropy()
function = kernel.linear_cross_entropy
module = sys.modules["verl.utils.kernel.linear_cross_entropy"]
verl = sys.modules["verl"]
print(json.dumps({
    "status": kernel.status, "loaded_by": kernel.loaded_by, "version": kernel.version,
    "import_error": kernel.import_error,
    "is_verls": function == module.linear_cross_entropy,
    "class": f"{function.__self__.__module__}.{function.__self__.__qualname__}",
    "file": module.__file__,
    "kernels_loaded": hasattr(sys.modules.get("verl.utils.kernel.kernels"), "efficient_entropy_forward"),
    "standin": getattr(verl, STANDIN, False),
    "verl_init_ran": hasattr(verl, "DataProto") or "verl.protocol" in sys.modules,
    "verl_utils_init_ran": hasattr(sys.modules["verl.utils"], "hf_tokenizer"),
    "ray": "ray" in sys.modules and sys.modules["ray"] is not None,
}))
"""


def load_in_child(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(BENCHMARKS), mode], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_without_ray_the_kernel_comes_from_verls_files_and_verl_init_never_runs():
    out = load_in_child("without ray")
    assert "ray" in out["import_error"], out["import_error"]  # `import verl` did fail
    assert (out["status"], out["loaded_by"]) == ("ok", "kernel files alone")
    assert out["version"] == importlib.metadata.version("verl")
    assert out["is_verls"] and out["class"] == "verl.utils.kernel.linear_cross_entropy.LinearCrossEntropy"
    installed = importlib.metadata.distribution("verl").locate_file("verl/utils/kernel/linear_cross_entropy.py")
    assert Path(out["file"]).resolve() == Path(str(installed)).resolve()
    assert out["kernels_loaded"]  # its kernels, verl.utils.device and verl.plugin.platform imported for real
    assert out["standin"] and not out["verl_init_ran"] and not out["verl_utils_init_ran"] and not out["ray"]


def test_where_verl_imports_the_kernel_comes_from_import_verl():
    out = load_in_child("as installed")
    assert (out["status"], out["loaded_by"], out["import_error"]) == ("ok", "import verl", None)
    assert out["version"] == importlib.metadata.version("verl")
    assert out["is_verls"] and out["class"] == "verl.utils.kernel.linear_cross_entropy.LinearCrossEntropy"
    assert not out["standin"] and out["verl_init_ran"]
