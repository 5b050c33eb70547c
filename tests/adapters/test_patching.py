"""``patch_once``: every adapter's wrapper of a trainer function, installed once per patch."""

import doctest
import functools
import pathlib
import re
import types

import rlstab.adapters.patching as patching
from rlstab.adapters.patching import MARKER, patch_once, patched_by


def counting(calls):
    def wrap(original):
        @functools.wraps(original)
        def wrapper(*args):
            calls.append(args)
            return original(*args)

        return wrapper

    return wrap


def test_patches_once_and_keeps_the_original():
    def f(x):
        return x + 1

    owner, calls = types.SimpleNamespace(f=f), []
    assert patch_once(owner, "f", counting(calls), key="a") is True
    wrapped = owner.f
    assert patch_once(owner, "f", counting(calls), key="a") is False  # a second install: nothing happens
    assert owner.f is wrapped and owner.f.__wrapped__ is f
    assert owner.f(1) == 2 and calls == [(1,)]  # wrapped once, not twice
    assert patched_by(owner.f) == ("a",) and getattr(owner.f, MARKER) == ("a",)
    assert patched_by(f) == ()


def test_the_original_is_kept_when_the_wrapper_does_not_keep_it():
    owner = types.SimpleNamespace(f=lambda x: x)
    patch_once(owner, "f", lambda original: lambda x: original(x) * 10, key="a")
    assert owner.f(2) == 20 and owner.f.__wrapped__(2) == 2


def test_another_patch_on_the_same_function_still_runs():
    """Two patches meet on one function: OpenRLHF's ``training_step`` (step scope, metrics). ``functools.wraps``
    copies the first wrapper's marker onto the second; each key is still patched once."""
    owner, first, second = types.SimpleNamespace(f=lambda x: x), [], []
    assert patch_once(owner, "f", counting(first), key="step_scope")
    assert patch_once(owner, "f", counting(second), key="metrics")
    assert not patch_once(owner, "f", counting(first), key="step_scope")
    assert not patch_once(owner, "f", counting(second), key="metrics")
    owner.f(3)
    assert first == second == [(3,)]
    assert patched_by(owner.f) == ("step_scope", "metrics")


def test_a_subclass_inheriting_a_function_patched_under_another_key_gets_its_own_patch():
    """veRL's ``TinkerTrainingWorker`` inherits ``TrainingWorker.set_loss_fn``, which the entropy patch wraps:
    the Tinker refusal must still wrap it (with one boolean marker it would believe it had run)."""

    class Base:
        def set_loss_fn(self, fn):
            return fn

    class Child(Base):
        pass

    base_calls, child_calls = [], []
    patch_once(Base, "set_loss_fn", counting(base_calls), key="entropy")
    assert patch_once(Child, "set_loss_fn", counting(child_calls), key="tinker")
    assert "set_loss_fn" in vars(Child) and Base.set_loss_fn is not Child.set_loss_fn
    Child().set_loss_fn(1)
    Base().set_loss_fn(2)
    assert len(child_calls) == 1 and len(base_calls) == 2


def test_also_replaces_the_same_original_bound_elsewhere():
    """veRL's ``ppo_loss``: modules that ran ``from losses import ppo_loss`` get the wrapper too, unless they
    hold something else."""

    def ppo_loss():
        return "verl"

    def other():
        return "other"

    losses = types.SimpleNamespace(ppo_loss=ppo_loss)
    caller = types.SimpleNamespace(ppo_loss=ppo_loss)
    unrelated = types.SimpleNamespace(ppo_loss=other)
    assert patch_once(losses, "ppo_loss", lambda f: lambda: "wrapped " + f(), key="k", also=[caller, unrelated, losses])
    assert losses.ppo_loss is caller.ppo_loss and caller.ppo_loss() == "wrapped verl"
    assert unrelated.ppo_loss is other


def test_the_docstring_example_runs():
    assert doctest.testmod(patching).failed == 0


def test_every_adapter_wrapper_goes_through_patch_once():
    """No adapter marks a wrapper by hand: the only marker is ``MARKER``, set in ``patching``."""
    adapters = pathlib.Path(patching.__file__).parent
    by_hand = re.compile(r"__rlstab_\w+__\s*=|setattr\([^)]*(WRAPPED|_wrapped)|_rlstab_\w*wrapped")
    offenders = [
        f"{path.relative_to(adapters)}:{n}"
        for path in sorted(adapters.rglob("*.py"))
        if path.name != "patching.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if by_hand.search(line)
    ]
    assert not offenders, offenders
