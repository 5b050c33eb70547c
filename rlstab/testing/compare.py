"""Comparisons with messages that say where two results differ.

Losses and gradients of two computations that should be equal are compared with ``rtol = 1e-5``,
``atol = 1e-6``: a different micro-batch split or an extra padding row changes only the order of
float32 sums, never the terms. Step statistics (counts, thresholds, estimator tables, the step
values of hooks) are compared the same way, field by field, through ``summary``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from rlstab.lazy import torch

if TYPE_CHECKING:
    from rlstab.metrics import Metrics

RTOL, ATOL = 1e-5, 1e-6


def assert_close(actual, expected, what: str, *, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Tensors (or numbers) equal within the tolerances, NaN equal to NaN; else AssertionError naming ``what``."""
    a = torch.as_tensor(actual).detach().to(torch.float64)
    e = torch.as_tensor(expected).detach().to(torch.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {tuple(a.shape)} instead of {tuple(e.shape)}")
    close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if not bool(close.all()):
        where = (~close).nonzero()[0].tolist()
        at = f" at index {where}" if where else ""
        raise AssertionError(
            f"{what}: {int((~close).sum())} value(s) differ{at}: {a[tuple(where)].item()!r} instead of "
            f"{e[tuple(where)].item()!r}"
        )


def assert_grads_close(actual: dict, expected: dict, what: str, rows: int | None = None) -> None:
    """Each field's gradient (``loss_and_grad``'s dict) equal within the tolerances; ``rows``: compare the first rows only."""
    assert set(actual) == set(expected), f"{what}: gradients of {sorted(actual)} instead of {sorted(expected)}"
    for name, want in expected.items():
        got = actual[name] if rows is None else actual[name][:rows]
        assert_close(got, want, f"{what}: the gradient with respect to {name}")


def plain(value: Any) -> Any:
    """``value`` as nested dicts, lists, numbers and CPU tensors (StepStats, estimator tables, hook values)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "__dict__"):
        return {k: plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def differences(actual: Any, expected: Any, path: str = "", *, rtol: float = RTOL, atol: float = ATOL) -> list[str]:
    """Where two ``plain`` values differ (numbers within the tolerances), one line each."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return [f"{path or '<value>'}: {_short(actual)} instead of {_short(expected)}"]
        return [d for k in expected for d in differences(actual[k], expected[k], f"{path}.{k}" if path else k, rtol=rtol, atol=atol)]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: {_short(actual)} instead of {_short(expected)}"]
        return [d for i, (a, e) in enumerate(zip(actual, expected)) for d in differences(a, e, f"{path}[{i}]", rtol=rtol, atol=atol)]
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
            return [f"{path}: {_short(actual)} instead of {_short(expected)}"]
        if expected.dtype == torch.bool or not (expected.is_floating_point() or actual.is_floating_point()):
            return [] if torch.equal(actual, expected) else [f"{path}: {_short(actual)} instead of {_short(expected)}"]
        try:
            assert_close(actual, expected, path, rtol=rtol, atol=atol)
        except AssertionError as err:
            return [str(err)]
        return []
    if isinstance(expected, float) or isinstance(actual, float):
        if isinstance(actual, bool) or isinstance(expected, bool) or not isinstance(actual, (int, float)):
            return [f"{path}: {actual!r} instead of {expected!r}"]
        if math.isnan(expected) and math.isnan(actual):
            return []
        if math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol):
            return []
        return [f"{path}: {actual!r} instead of {expected!r}"]
    return [] if actual == expected else [f"{path}: {actual!r} instead of {expected!r}"]


def assert_same(actual: Any, expected: Any, what: str, **tol) -> None:
    found = differences(plain(actual), plain(expected), **tol)
    if found:
        raise AssertionError(f"{what} differ: " + "; ".join(found[:5]) + (f" (and {len(found) - 5} more)" if len(found) > 5 else ""))


def summary(stats, *, world_size: bool = True) -> dict:
    """What a ``StepStats`` fixed for the step, as plain values (the fingerprint and name left out)."""
    out = {
        "counts": plain(stats.counts),
        "thresholds": plain(stats.thresholds),
        "advantage": plain(stats.advantage),
        "hooks": plain(stats.hooks),
        "step_level": plain(stats.step_level),
        "branch_counts": plain(stats.branch_counts),
    }
    if not world_size:
        for key in ("counts", "branch_counts"):
            if out[key] is not None:
                out[key].pop("world_size")
    return out


def step_metrics(metrics: Metrics) -> dict[str, float]:
    """The metrics a micro-batch reports about the whole step, those the loss declares ``"step"``
    ([`Metrics.combines`][rlstab.metrics.Metrics.combines]): ``step/...``, the masks' thresholds, the
    estimator's, the surrogate's and the reweighters' step values."""
    return {name: value for name, value in metrics.items() if metrics.combines(name) == "step"}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
