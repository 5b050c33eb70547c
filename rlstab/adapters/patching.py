"""Patch a trainer's function once: the one helper behind every adapter's wrapper.

An adapter wraps trainer functions (veRL's ``TrainingWorker.train_batch``, OpenRLHF's
``Actor.forward``, ...) from code that may run more than once in a process: ``import verl`` after
an explicit import, Ray's setup hook in a process that already ran it. A second install must not
wrap the wrapper. [`patch_once`][rlstab.adapters.patching.patch_once] replaces ``owner.name`` by
``wrap(original)`` unless a patch with the same ``key`` is already there, and records the keys of
every patch on the replacement under one attribute, ``__rlstab_wrapped__`` (``MARKER``).

A key, not a flag, because two patches may meet on one function: veRL's ``TinkerTrainingWorker``
inherits ``set_loss_fn`` from ``TrainingWorker``, whose ``set_loss_fn`` rlstab already wraps for the
engine's entropy, and OpenRLHF's ``training_step`` is wrapped for the step scope and for the
metrics. A flag copied by ``functools.wraps`` (which copies the function's ``__dict__``) would make
the second patch believe it had run.

The original stays reachable as the replacement's ``__wrapped__`` (set by ``functools.wraps``, or
here when the wrapper does not set it).

Example:
    >>> import types
    >>> owner = types.SimpleNamespace(f=lambda x: x + 1)
    >>> def doubled(original):
    ...     return lambda x: 2 * original(x)
    >>> patch_once(owner, "f", doubled, key="example.doubled"), owner.f(1)
    (True, 4)
    >>> patch_once(owner, "f", doubled, key="example.doubled"), owner.f(1)  # installed again: nothing changes
    (False, 4)
    >>> patched_by(owner.f), owner.f.__wrapped__(1)
    (('example.doubled',), 2)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

MARKER = "__rlstab_wrapped__"
"""The attribute of a replacement that holds the keys of the patches applied to it (a tuple of str)."""


def patched_by(function: Any) -> tuple[str, ...]:
    """The keys of the rlstab patches in ``function``'s chain of wrappers (``()`` for an unpatched one)."""
    keys = getattr(function, MARKER, ())
    return keys if isinstance(keys, tuple) else ()


def patch_once(
    owner: Any, name: str, wrap: Callable[[Callable], Callable], *, key: str, also: Iterable[Any] = ()
) -> bool:
    """Replace ``owner.name`` by ``wrap(original)``, unless the patch ``key`` is already there; whether it patched.

    ``owner``: a class or a module. ``key``: what the patch is (the adapter's module and the patch,
    ``"rlstab.adapters.verl.tinker"``); a patch with another key on the same function, or on a base
    class's function that ``owner`` inherits, does not stop it. ``also``: other owners that bound the
    same original under ``name`` (modules that ran ``from ... import name``): each of them that still
    holds the original gets the same replacement.
    """
    original = getattr(owner, name)
    keys = patched_by(original)
    if key in keys:
        return False
    replacement = wrap(original)
    if getattr(replacement, "__wrapped__", None) is not original:
        replacement.__wrapped__ = original
    setattr(replacement, MARKER, (*keys, key))
    setattr(owner, name, replacement)
    for other in also:
        if other is not owner and getattr(other, name, None) is original:
            setattr(other, name, replacement)
    return True
