"""The CUDA suite: rlstab's GPU paths on a card (``pytest -m cuda``, or ``scripts/gpu.sh`` on a lent machine).

Every test under ``tests/cuda`` is marked ``cuda`` and, where ``torch.cuda.is_available()`` is False,
skipped with that reason: the only skip the suite has. Nothing here sets ``TRITON_INTERPRET``: on a card
the kernels are compiled for it.
"""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False): the CUDA suite runs on a card, see docs/gpu.md"


@pytest.hookimpl(tryfirst=True)  # before `-m cuda` selects by the mark
def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason=NO_CUDA))


@pytest.fixture
def cuda():
    return torch.device("cuda")
