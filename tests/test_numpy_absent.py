"""With NumPy absent (the core install does not bring it), no command prints torch's NumPy warning.

torch warns "Failed to initialize NumPy" when it is imported without NumPy. rlstab never uses NumPy,
so that line would only be noise in a user's terminal or pre-commit hook. Each case runs in a fresh
interpreter in which ``import numpy`` fails, as in an environment that never installed it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import rlstab

PRESETS = Path(rlstab.__file__).parent / "presets"

# Makes `import numpy` fail as if it were not installed (torch then warns at import).
WITHOUT_NUMPY = "import sys; sys.modules['numpy'] = None; "


def run_without_numpy(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_NUMPY + code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["presets"],
        ["validate", str(PRESETS / "stapo.yaml")],
        ["explain", "stare"],
        ["schema"],
        ["components"],
        ["demo", "--help"],
    ],
    ids=lambda argv: " ".join(argv[:1]) + (" --help" if "--help" in argv else ""),
)
def test_cli_prints_no_numpy_warning(argv):
    code = f"from rlstab.cli import main; sys.exit(main({argv!r}))"
    result = run_without_numpy(code)
    assert result.returncode == 0, result.stderr
    assert "NumPy" not in result.stderr, result.stderr
    assert result.stderr == "", result.stderr  # nothing at all on stderr for a successful command


def test_computing_a_loss_prints_no_numpy_warning():
    """The path on which rlstab itself imports torch: compiling an objective and computing a loss.

    The snippet imports torch only after ``compile()``, because a user's own first ``import torch``
    would warn from torch, not from rlstab.
    """
    code = (
        "import rlstab\n"
        "loss_fn = rlstab.load('stapo').compile()\n"
        "import torch\n"
        "lp = torch.full((2, 3), -1.0, requires_grad=True)\n"
        "batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=lp.detach(), advantages=torch.tensor([1.0, -1.0]),\n"
        "                          response_mask=torch.ones(2, 3, dtype=torch.bool), entropy=torch.ones(2, 3))\n"
        "loss_fn(batch).loss.backward()\n"
    )
    result = run_without_numpy(code)
    assert result.returncode == 0, result.stderr
    assert "NumPy" not in result.stderr, result.stderr
