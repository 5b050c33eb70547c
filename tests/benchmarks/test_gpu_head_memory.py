"""The LM-head table's working memory: peak extra memory less the gradients a path returns.

Every path must return ``h.grad`` and ``W.grad``; the memory target compares what a path needs
beyond them (veRL's own figure, 0.14 GiB at N = 4,096, can only be such a working figure). CI has no
GPU to measure memory on, so these check the subtraction and the target on made-up numbers.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu.py"
VERL = "veRL linear_cross_entropy"  # the column's name, which the tables and the targets print


@pytest.fixture(scope="module")
def head():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # puts gpu_sections on sys.path
    return importlib.import_module("gpu_sections.head")


def test_gradient_bytes_counts_each_gradient_storage_once(head):
    h = torch.zeros(3, 4, dtype=torch.bfloat16, requires_grad=True)
    w = torch.zeros(5, 4, dtype=torch.float32, requires_grad=True)
    none = torch.zeros(7, requires_grad=True)  # no gradient: nothing to count
    (h.float().sum() + w.sum()).backward()
    assert head.gradient_bytes(h, w, none) == 3 * 4 * 2 + 5 * 4 * 4
    shared = torch.zeros(2, 8)
    a, b = torch.zeros(8, requires_grad=True), torch.zeros(8, requires_grad=True)
    a.grad, b.grad = shared[0], shared[1]  # two views of one storage
    assert head.gradient_bytes(a, b) == 2 * 8 * 4


def row(rlstab: tuple[float, float], verl: tuple[float, float]) -> dict:
    def path(peak, working):
        return {"status": "ok", "ms": 1.0, "peak_extra_gib": peak, "working_gib": working,
                "logprob_err": 1e-6, "entropy_err": 1e-6}

    return {"tokens": 4096, "active": 1.0, "floor_ms": 0.5,
            "paths": {"rlstab": path(*rlstab), VERL: path(*verl)}}


def memory_target(head, section: dict):
    targets = []
    rep = SimpleNamespace(target=lambda name, value, limit, ok, where, timing, dry: targets.append(
        {"target": name, "value": value, "limit": limit, "pass": ok, "timing": timing}))
    head.head_targets(rep, section, dry=True)
    return [t for t in targets if "memory" in t["target"]]


def test_the_memory_target_compares_working_memory_not_peak(head):
    assert head.VERL == VERL
    # rlstab's peak is the higher (gradients included), its working memory the lower: it passes
    (target,) = memory_target(head, {"rows": [row(rlstab=(2.6, 0.1), verl=(2.5, 0.14))]})
    assert target == {"target": "LM head working memory <= veRL's", "value": 0.1, "limit": 0.14, "pass": True,
                      "timing": False}  # judged in a dry run too: not a timing
    (target,) = memory_target(head, {"rows": [row(rlstab=(0.3, 0.2), verl=(2.5, 0.14))]})
    assert (target["value"], target["pass"]) == (0.2, False)  # the lower peak, the higher working memory: it fails
