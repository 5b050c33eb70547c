"""shadow_masks: masks measured while they do not act — the loss is that of the objective without them."""

import pytest
import torch

import rlstab
from rlstab.compiler.plan import Plan
from rlstab.explain import explain

from batches import random_batch
from step_worker import take

SPLITS = [(0, 3), (3, 8), (8, 12), (12, 16)]
S2T = {"kind": "s2t", "tau_p": 0.05}  # fires on the test batches' low-probability tail


def with_shadows(name, shadows=(S2T,)):
    return rlstab.load({"extends": name, "shadow_masks": list(shadows)})


def step(objective, batch):
    """Gather over four micro-batches, then each micro-batch's loss and gradient: (losses, gradient, metrics)."""
    loss_fn = objective.compile()
    leaf = batch.logprobs.detach().clone().requires_grad_()
    micro = [take(batch, lo, hi, leaf) for lo, hi in SPLITS]
    stats = loss_fn.gather(micro)
    outs = [loss_fn(mb, step=stats) for mb in micro]
    sum(o.loss for o in outs).backward()
    return [o.loss for o in outs], leaf.grad, outs


@pytest.mark.parametrize("name", ["grpo", "dapo", "stapo", "20-entropy", "dr_grpo", "clip_cov"])
def test_loss_and_gradients_are_bit_identical_with_and_without_shadow_masks(name):
    batch = random_batch(B=16, T=24, seed=11, rewards=True)
    shadows = [S2T, {"kind": "entropy_quantile"}, {"kind": "random_silence", "fraction": 0.3}]
    losses, grad, _ = step(rlstab.load(name), batch)
    shadow_losses, shadow_grad, outs = step(with_shadows(name, shadows), batch)
    assert all(torch.equal(a, b) for a, b in zip(losses, shadow_losses))
    assert torch.equal(grad, shadow_grad)
    assert outs[0].metrics["shadow/s2t/silenced"] >= 0 and "shadow/random_silence/target" in outs[0].metrics


def test_a_shadow_s2t_reports_what_an_acting_s2t_silences():
    # S2T does not change the valid tokens, so as a shadow it silences the tokens it silences acting.
    batch = random_batch(B=16, T=24, seed=3, advantages="sequence")
    shadow = with_shadows("grpo").compile()(batch).metrics
    acting = rlstab.load({"extends": "grpo", "masks": [S2T]}).compile()(batch).metrics
    assert shadow["shadow/s2t/silenced"] == acting["mask/s2t/silenced"] > 0
    for name in ("kept", "kept_fraction", "entropy_threshold"):
        assert shadow[f"shadow/s2t/{name}"] == acting[f"mask/s2t/{name}"]
    assert shadow["tokens/kept"] == shadow["tokens/valid"]  # nothing silenced for real


def test_the_shadow_metrics_declare_how_they_combine():
    out = with_shadows("grpo").compile()(random_batch(B=8, T=12, seed=1))
    kinds = {name: out.metrics.combines(f"shadow/s2t/{name}")
             for name in ("kept", "silenced", "kept_fraction", "entropy_threshold")}
    assert kinds == {"kept": "sum", "silenced": "sum", "kept_fraction": "token_mean", "entropy_threshold": "step"}


def test_shadow_metrics_are_step_wide():
    # Over four micro-batches, the summed shadow/s2t/silenced equals the whole step's, and the thresholds agree.
    batch = random_batch(B=16, T=24, seed=11, advantages="sequence")
    objective = with_shadows("grpo")
    whole = objective.compile()(batch).metrics
    _, _, outs = step(objective, batch)
    assert sum(o.metrics["shadow/s2t/silenced"] for o in outs) == whole["shadow/s2t/silenced"]
    assert all(o.metrics["shadow/s2t/entropy_threshold"] == whole["shadow/s2t/entropy_threshold"] for o in outs)


def test_mask_keeps_and_silences_return_the_shadow_masks_under_their_labels():
    batch = random_batch(B=16, T=24, seed=3, advantages="sequence")
    objective = rlstab.load({"extends": "stapo", "shadow_masks": [S2T, {"kind": "entropy_quantile"}, S2T]})
    loss_fn = objective.compile()
    silences, keeps = loss_fn.mask_silences(batch), loss_fn.mask_keeps(batch)
    assert list(silences) == ["s2t", "shadow/s2t_0", "shadow/entropy_quantile", "shadow/s2t_2"] == list(keeps)
    metrics = loss_fn(batch).metrics
    valid = batch.response_mask.float()
    for label in ("shadow/s2t_0", "shadow/entropy_quantile"):
        assert silences[label].sum() == metrics[f"{label}/silenced"]
        assert torch.equal(silences[label] + keeps[label], valid)
    assert torch.equal(silences["shadow/s2t_0"], silences["shadow/s2t_2"])


def test_the_shadow_label_for_one_s2t_is_shadow_s2t():
    loss_fn = with_shadows("dapo").compile()
    assert loss_fn.plan.shadow_labels == ("shadow/s2t",)
    batch = random_batch(B=8, T=12, seed=1)
    assert "shadow/s2t" in loss_fn.mask_silences(batch) and loss_fn.mask_labels == []


def test_the_plan_lists_the_shadow_masks_and_their_reads_without_torch():
    plan = Plan.of(with_shadows("grpo"))
    assert plan.shadow_labels == ("shadow/s2t",) and plan.mask_labels == ()
    assert plan.readers("entropy") == ["shadow_masks[0] (s2t)"]


def test_a_batch_without_what_a_shadow_mask_reads_is_refused():
    batch = random_batch(B=8, T=12, seed=1)
    batch.entropy = None
    with pytest.raises(rlstab.BatchError, match=r"shadow_masks\[0\] \(s2t\) reads TokenBatch.entropy"):
        with_shadows("grpo").compile()(batch)


def test_the_fingerprint_of_an_objective_without_shadow_masks_is_unchanged():
    # Digests published before the field existed (computed at the commit before it).
    assert rlstab.load("grpo").fingerprint() == "a94029cf76f8102b1958c7a449c8f519671677d7b360192886daac7bc1aa60e4"
    assert rlstab.load("stapo").fingerprint() == "d8a7088293603801de7ed6df6da24de80f50becca9cad39ef41661092e3cd292"
    assert with_shadows("grpo").fingerprint() != rlstab.load("grpo").fingerprint()
    assert "shadow_masks" not in rlstab.load("grpo").to_yaml()


def test_statistics_gathered_without_the_shadow_masks_are_refused():
    batch = random_batch(B=8, T=12, seed=1)
    stats = rlstab.load("grpo").compile().gather([batch])
    with pytest.raises(rlstab.BatchError, match="gathered by"):
        with_shadows("grpo").compile()(batch, step=stats)


def test_explain_and_yaml_show_the_shadow_masks():
    objective = with_shadows("dapo")
    text = explain(objective)
    assert "shadow masks (measured, not acting" in text and "shadow/s2t s2t: silence iff" in text
    assert rlstab.load(objective.to_yaml()) == objective


def test_a_rejection_cannot_be_a_shadow_mask():
    with pytest.raises(rlstab.ConfigError, match=r"shadow_masks\[0\] = 'rollout_rejection': .*cannot be a shadow mask"):
        with_shadows("grpo", [{"kind": "rollout_rejection", "high": 2.0, "rejected": "padding"}])
