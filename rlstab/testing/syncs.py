"""Host synchronisations, counted on any device: what would stop the CPU until a GPU drains its queue.

A loss runs between the trainer's forward and its backward. On a GPU the CPU queues kernels ahead of
the device; any operation that needs a value computed on the device (``.item()``, ``bool(tensor)``,
``.tolist()``, a shape that depends on the data) makes the CPU wait until every queued kernel has
run, and the backward cannot be queued meanwhile. [`host_syncs`][rlstab.testing.syncs.host_syncs]
records such operations wherever they run, CPU tensors included, so a test without a GPU can hold a
code path to "no host sync":

    with host_syncs() as syncs:
        loss_fn(batch, step=stats)
    assert not syncs, syncs  # each entry: the operation and the first caller outside torch

What counts (each a synchronisation on CUDA):

- a tensor's value read on the host: ``aten._local_scalar_dense`` (``item``, ``bool``, ``float``,
  ``int``), ``Tensor.tolist`` and ``Tensor.numpy`` (which on CPU bypass the dispatcher, so they are
  patched for the duration);
- an output whose size depends on the data: ``nonzero``, ``masked_select``, boolean-mask indexing,
  ``unique``, ``repeat_interleave`` without ``output_size``, ``bincount``;
- a tensor built from host data (``torch.tensor(...)``, ``torch.as_tensor(python_number)``:
  ``aten.lift_fresh``), which on a GPU is a blocking host-to-device copy;
- a copy between devices.

``torch.full``, ``torch.zeros`` and arithmetic with Python numbers put the number in the kernel's
arguments and do not count.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator

from rlstab.lazy import torch

_HOST_READS = {"_local_scalar_dense"}
_DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
                   "unique_consecutive", "bincount"}
_TORCH_DIR = None


def _op_name(func) -> str:
    return func.__name__.split(".")[0]  # "aten.index.Tensor" -> "index"


def _sync_kind(func, args, kwargs) -> str | None:
    name = _op_name(func)
    if name in _HOST_READS:
        return "host read"
    if name in _DATA_DEPENDENT:
        return "data-dependent size"
    if name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
        if isinstance(args[0], torch.Tensor) and (len(args) < 2 or isinstance(args[1], torch.Tensor)):
            return "data-dependent size"
    if name in ("index", "index_put", "index_put_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
            return "data-dependent size"
    if name == "lift_fresh":
        return "host-to-device copy"
    if name in ("_to_copy", "copy_", "to"):
        devices = {a.device for a in args if isinstance(a, torch.Tensor)}
        target = kwargs.get("device")
        if target is not None:
            devices.add(torch.device(target))
        if len(devices) > 1:
            return "copy between devices"
    return None


def _caller() -> str:
    """The first frame outside torch and this module: where the synchronising call was written."""
    global _TORCH_DIR
    if _TORCH_DIR is None:
        _TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
    here = os.path.abspath(__file__)
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(_TORCH_DIR) and os.path.abspath(frame.filename) != here:
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "?"


@contextlib.contextmanager
def host_syncs() -> Iterator[list[str]]:
    """Within it, every operation that would synchronise a GPU with the host is appended to the yielded list.

    Each entry reads ``"<kind>: <op> at <file>:<line> (<function>)"``. Works on CPU tensors (the
    point: CI has no GPU) and on CUDA ones; nests with other dispatch modes.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    found: list[str] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            kind = _sync_kind(func, args, kwargs)
            if kind is not None:
                found.append(f"{kind}: {func} at {_caller()}")
            return func(*args, **kwargs)

    patched = {}
    for name in ("tolist", "numpy"):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            found.append(f"host read: Tensor.{_name} at {_caller()}")
            return _original(self, *args, **kwargs)

        patched[name] = original
        setattr(torch.Tensor, name, wrapper)
    try:
        with _Record():
            yield found
    finally:
        for name, original in patched.items():
            setattr(torch.Tensor, name, original)
