"""Stateful components survive a checkpoint: a resumed run equals an uninterrupted one (STARE's controller)."""

import json

import pytest
import torch

import rlstab

from batches import random_batch

STARE = {
    "extends": "dapo",
    # H_tgt = 1.0 sits inside the entropies of random_batch (uniform on [0, 2], scaled per step below),
    # so the controller moves both ways and the gate opens and closes.
    "reweighters": [{"kind": "stare", "variant": "C2", "adaptive": True, "alpha": 0.05, "target_entropy": 1.0}],
}
STEPS = 8
SCALES = [0.6, 0.7, 0.5, 1.4, 0.8, 1.3, 0.9, 0.4]  # H_bar ~ scale: below, below, below, above, ...


def step_batches(step: int) -> list[rlstab.TokenBatch]:
    """Two micro-batches of step ``step``: each step has its own data and entropy level."""
    b = random_batch(B=16, T=12, seed=100 + step, advantages="sequence")
    fields = {f: getattr(b, f) for f in b.__dataclass_fields__}
    fields["entropy"] = b.entropy * SCALES[step]
    fields["logprobs"] = b.logprobs.detach()
    halves = []
    for lo, hi in ((0, 7), (7, 16)):
        part = {k: (v[lo:hi] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}
        part["logprobs"] = part["logprobs"].clone().requires_grad_()
        halves.append(rlstab.TokenBatch(**part))
    return halves


def run(loss_fn, steps) -> list[tuple]:
    """Per step: the controller's values and each micro-batch's loss and gradient."""
    out = []
    for step in steps:
        micro = step_batches(step)
        stats = loss_fn.gather(micro)
        losses, grads = [], []
        for mb in micro:
            res = loss_fn(mb, step=stats)
            res.loss.backward()
            losses.append(res.loss.item())
            grads.append(mb.logprobs.grad.clone())
        m = res.metrics
        out.append(((m["reweight/stare/W"], m["reweight/stare/M"], m["reweight/stare/gate"]), losses, grads))
    return out


def test_resumed_run_gives_the_same_weights_as_an_uninterrupted_one():
    uninterrupted = run(rlstab.load(STARE).compile(), range(STEPS))
    controllers = [c for c, _, _ in uninterrupted]
    assert len({c[0] for c in controllers}) > 2 and {c[2] for c in controllers} == {0.0, 1.0}  # it moves, both ways

    for k in (1, 3, 5):
        first = rlstab.load(STARE).compile()
        head = run(first, range(k))
        saved = json.loads(json.dumps(first.state_dict()))  # plain data: survives any checkpoint format
        resumed = rlstab.load(STARE).compile()
        resumed.load_state_dict(saved)
        tail = run(resumed, range(k, STEPS))
        for (c, losses, grads), (c_ref, losses_ref, grads_ref) in zip(head + tail, uninterrupted):
            assert c == c_ref
            assert losses == losses_ref
            for g, g_ref in zip(grads, grads_ref):
                assert torch.equal(g, g_ref)


def test_a_fresh_objective_without_the_state_diverges():
    """The check above can fail: without load_state_dict the controller restarts from W = 1.1."""
    uninterrupted = run(rlstab.load(STARE).compile(), range(STEPS))
    restarted = run(rlstab.load(STARE).compile(), range(3, STEPS))
    assert [c for c, _, _ in restarted] != [c for c, _, _ in uninterrupted[3:]]


def test_state_dict_names_the_component_and_holds_plain_values():
    loss_fn = rlstab.load(STARE).compile()
    assert loss_fn.state_dict() == {"reweighters[0] (stare)": {"gate": True, "W": 1.1, "M": 0.9, "H_bar": None}}
    run(loss_fn, range(1))
    (state,) = loss_fn.state_dict().values()
    assert set(state) == {"gate", "W", "M", "H_bar"} and all(isinstance(v, (bool, float)) for v in state.values())


def test_load_state_dict_refuses_another_objectives_state():
    loss_fn = rlstab.load(STARE).compile()
    with pytest.raises(ValueError, match=r"does not fit this objective's stateful components"):
        loss_fn.load_state_dict({"reweighters[1] (stare)": {}})
    with pytest.raises(ValueError, match=r"does not fit"):
        rlstab.load("dapo").compile().load_state_dict(loss_fn.state_dict())


def test_gathers_without_update_state_reuse_the_steps_start():
    """An adapter that gathers per micro-batch passes update_state=False after the first: the controller moves once."""
    loss_fn = rlstab.load(STARE).compile()
    micro = step_batches(0)  # H_bar below 1.0: W 1.1 -> 1.15
    first = loss_fn.gather(micro[:1], update_state=True)
    again = loss_fn.gather(micro[1:], update_state=False)
    assert first.hooks[0]["W"] == pytest.approx(1.15)
    assert again.hooks[0]["W"] == pytest.approx(1.15)  # not 1.2: the step's start state, moved once
    assert loss_fn.state_dict()["reweighters[0] (stare)"]["W"] == pytest.approx(1.15)
    nxt = loss_fn.gather(step_batches(2))  # the next step moves on from 1.15
    assert nxt.hooks[0]["W"] == pytest.approx(1.2)
