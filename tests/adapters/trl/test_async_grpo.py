"""``RlstabAsyncGRPOTrainer`` against the real ``trl.experimental.async_grpo.AsyncGRPOTrainer`` on the CPU.

The trainer class, its dataloader (rollout queue, batcher, tree packing, collator), its training
step, loss call and optimizer step are TRL's; only the rollout source, the weight sync and the
CUDA-only kernel lookups are stand-ins (``async_tiny``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from async_tiny import (
    NoWeightTransfer,
    StandInRolloutWorker,
    async_config,
    make_async_trainer,
    micro_batches,
    on_the_cpu,
)
from trl.experimental.async_grpo import AsyncGRPOTrainer

import rlstab
from rlstab import ConfigError
from rlstab.adapters import trainers
from rlstab.adapters.trl import RlstabAsyncGRPOTrainer
from rlstab.adapters.trl.async_step_scope import Window
from rlstab.cli import main

from trl_tiny import dataset, tokenizer

# TRL's async loss as an objective: PPO clip 0.2/0.2 (AsyncGRPOConfig.epsilon, epsilon_high None), no
# dual-clip, token-mean over every trained token (compute_loss divides by global_n_tokens).
TRL_ASYNC_LOSS = {
    "extends": "grpo",
    "name": "trl_async_loss",
    "surrogate": {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.2, "dual_clip": None},
}
TRL_NAMES = ["ratio", "kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
             "clip_ratio/low_min", "clip_ratio/high_max"]


@pytest.fixture(autouse=True)
def cpu():
    with on_the_cpu(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def loss_and_grads(trainer, inputs: list[dict], window: bool = False):
    """``compute_loss`` on each micro-batch of one optimizer step, as transformers' loop calls it: summed loss, grads."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = len(inputs)
    if window:
        trainer._rlstab_window = Window(step=trainer.state.global_step, inputs=inputs)
    total = 0.0
    for micro_batch in inputs:
        loss = trainer.compute_loss(model, micro_batch)
        loss.backward()
        total += float(loss)
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("accumulation", [1, 2])
def test_trls_async_loss_as_an_objective_is_trls_loss_gradient_and_metrics(tmp_path, accumulation):
    """Conformance: the same micro-batches through TRL's own compute_loss and through rlstab's, same weights."""
    config = {"gradient_accumulation_steps": accumulation, "per_device_train_batch_size": 4 // accumulation}
    theirs = make_async_trainer(tmp_path / "trl", config=config)
    ours = make_async_trainer(tmp_path / "rlstab", cls=RlstabAsyncGRPOTrainer, objective=TRL_ASYNC_LOSS, config=config)
    inputs = micro_batches(theirs, accumulation)
    expected, expected_grads = loss_and_grads(theirs, inputs)
    got, grads = loss_and_grads(ours, inputs)
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert expected_grads.keys() == grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-6, atol=1e-7, msg=name)
    for name in TRL_NAMES:
        assert ours._metrics["train"][name] == pytest.approx(theirs._metrics["train"][name], rel=1e-6, abs=1e-7), name
    assert theirs._metrics["train"]["clip_ratio/region_mean"][0] > 0  # the batch clips: the test can tell the rules apart
    for field in ("_step_trained_tokens", "_step_forward_tokens", "_step_samples"):
        assert getattr(ours, field) == getattr(theirs, field)


def spied(cls):
    """``cls`` recording each ``compute_loss`` call's inputs and returned loss (``calls``)."""

    class Spy(cls):
        calls: list = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            self.calls.append((inputs, loss.detach().clone()))
            return loss

    Spy.calls = []
    return Spy


def trained(trainer):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return before, after, [h for h in trainer.state.log_history if "loss" in h]


def test_one_training_step_of_the_real_trainer_backpropagates_rlstabs_loss(tmp_path):
    """TRL's train(), one optimizer step, for TRL's AsyncGRPOTrainer and for rlstab's with TRL's loss as an objective:
    the same micro-batch, the same loss backpropagated, the same weights after the optimizer step; metrics logged."""
    theirs = make_async_trainer(tmp_path / "trl", cls=spied(AsyncGRPOTrainer))
    ours = make_async_trainer(tmp_path / "rlstab", cls=spied(RlstabAsyncGRPOTrainer), objective=TRL_ASYNC_LOSS)
    start, trl_after, _ = trained(theirs)
    before, after, (step,) = trained(ours)
    assert ours.state.global_step == 1 and len(ours.calls) == len(theirs.calls) == 1
    (inputs, loss), (trl_inputs, trl_loss) = ours.calls[0], theirs.calls[0]
    assert torch.equal(inputs["token_index"], trl_inputs["token_index"])
    assert torch.equal(inputs["old_log_probs"], trl_inputs["old_log_probs"])
    assert float(loss) == pytest.approx(float(trl_loss), rel=1e-6)
    assert step["loss"] == pytest.approx(float(loss), rel=1e-6)  # what TRL logged is what rlstab's loss returned
    moved = [n for n in after if not torch.equal(after[n], before[n])]
    assert moved, "no weight changed"
    for name in after:
        assert torch.equal(before[name], start[name])
        torch.testing.assert_close(after[name], trl_after[name], rtol=1e-5, atol=1e-6, msg=name)
    for key in ["rlstab/loss/policy", "rlstab/tokens/valid", "rlstab/step/tokens_valid", "rlstab/clip/low_fraction",
                "rlstab/tokens/kept_fraction", *TRL_NAMES, "reward", "batch/trained_tokens_per_step"]:
        assert key in step, key
    assert step["rlstab/step/tokens_valid"] == step["batch/trained_tokens_per_step"]


@pytest.mark.parametrize("objective", ["stapo", "20-entropy"])
def test_optimizer_step_statistics_do_not_depend_on_the_micro_batches(tmp_path, objective):
    """Two micro-batches of 2 samples with step_statistics='optimizer_step' = one micro-batch of 4 (thresholds, counts,
    loss, gradients); with 'data_parallel' each micro-batch has its own entropy threshold, so the two differ."""
    def run(name, accumulation, step_statistics):
        trainer = make_async_trainer(
            tmp_path / name, cls=RlstabAsyncGRPOTrainer, objective=objective, step_statistics=step_statistics,
            config={"gradient_accumulation_steps": accumulation, "per_device_train_batch_size": 4 // accumulation},
        )
        loss, grads = loss_and_grads(trainer, micro_batches(trainer, accumulation), window=True)
        return loss, grads, trainer._metrics["train"]

    whole, whole_grads, whole_metrics = run("whole", 1, "optimizer_step")
    split, split_grads, split_metrics = run("split", 2, "optimizer_step")
    assert split == pytest.approx(whole, rel=1e-5, abs=1e-7)
    for name, grad in split_grads.items():
        torch.testing.assert_close(grad, whole_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    threshold = [k for k in whole_metrics if k.endswith("entropy_threshold")]
    assert threshold and split_metrics[threshold[0]] == pytest.approx(whole_metrics[threshold[0]] * 2, rel=1e-5)
    assert split_metrics["rlstab/step/tokens_valid"] == whole_metrics["rlstab/step/tokens_valid"] * 2  # both micro-batches
    local, _, local_metrics = run("local", 2, "data_parallel")
    assert local_metrics[threshold[0]][0] != pytest.approx(local_metrics[threshold[0]][1], rel=1e-6)


def test_proximal_mode_weights_each_token_by_the_truncated_sampler_ratio(tmp_path):
    """old_logprobs='proximal' with tis (cap 2): the ratio is 1 in value and the token weight min(pi / pi_sampler, 2),
    restated here from TRL's flat tensors: loss = sum_t -A_t w_t exp(lp_t - sg(lp_t)) / N, its gradient -A w d lp / N."""
    objective = {**TRL_ASYNC_LOSS, "name": "tis_async", "reweighters": [{"kind": "tis", "level": "token", "cap": 2.0}]}
    ours = make_async_trainer(tmp_path / "rlstab", cls=RlstabAsyncGRPOTrainer, objective=objective,
                              old_logprobs="proximal")
    (inputs,) = micro_batches(ours)
    got, grads = loss_and_grads(ours, [inputs])
    theirs = make_async_trainer(tmp_path / "trl")
    model = theirs.model
    model.zero_grad(set_to_none=True)
    selected = inputs["token_index"] >= 0
    keep = inputs["attention_mask"].bool()
    tree = {k: inputs[k][inputs[k] >= 0] for k in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")}
    tree["tree_max_seqlen_q"], tree["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][0].tolist()
    out = model(input_ids=inputs["input_ids"][keep][None], position_ids=inputs["position_ids"][keep][None],
                shift_labels=inputs["shift_labels"][keep][None], fused_lm_head=True, **tree)
    lp = out.log_probs.flatten()[inputs["token_index"][selected]]
    sampler, advantages = inputs["old_log_probs"][selected], inputs["advantages"][selected]
    weight = torch.exp(lp.detach() - sampler).clamp(max=2.0)
    expected = (-advantages * weight * torch.exp(lp - lp.detach())).sum() / inputs["global_n_tokens"][0]
    expected.backward()
    assert got == pytest.approx(float(expected), rel=1e-6, abs=1e-7)
    assert bool((torch.exp(lp.detach() - sampler) > 2.0).any())  # the cap binds on this batch
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)


# ----------------------------------------------------------------------------- refusals, and validate --trainer

MISSING_MODEL = "no-such-org/no-such-model"  # loading it would fail: the check must come first
PROXIMAL = "RlstabAsyncGRPOTrainer(old_logprobs='proximal')"


def start_up(tmp_path, objective, **kwargs) -> list[str]:
    """The adapter's start-up check: [] when it passes (the missing model fails later), else its problem lines."""
    try:
        RlstabAsyncGRPOTrainer(
            objective=objective, model=MISSING_MODEL, args=async_config(tmp_path), train_dataset=dataset(),
            processing_class=tokenizer(), rollout_worker=StandInRolloutWorker(groups=0),
            weight_transfer=NoWeightTransfer(), **kwargs,
        )
    except ConfigError as err:
        assert all("\n" not in line for line in err.problems)  # one line per problem
        return err.problems
    except Exception:  # noqa: BLE001 - past the check: loading the missing model fails
        return []
    raise AssertionError("the trainer was built from a model that does not exist")


def test_the_refusals_name_the_component_the_field_and_what_to_do(tmp_path):
    problems = start_up(tmp_path, "tis")
    assert problems == [
        "reweighters[0] (tis) reads TokenBatch.rollout_logprobs: " + trainers.TRL_ASYNC.on_setting["rollout_logprobs"][1]
    ]
    assert "old_logprobs='proximal'" in problems[0]
    assert start_up(tmp_path, "tis", old_logprobs="proximal") == []
    kl = start_up(tmp_path, {"extends": "grpo", "regularisers": [{"kind": "kl", "coef": 0.01}]})
    assert kl == ["regularisers[0] (kl) reads TokenBatch.ref_logprobs: " + trainers.TRL_ASYNC.unavailable["ref_logprobs"]]
    assert "no reference model" in kl[0]
    with pytest.raises(ConfigError, match="old_logprobs = 'behaviour': must be one of 'sampler', 'proximal'"):
        RlstabAsyncGRPOTrainer(objective="grpo", model=MISSING_MODEL, old_logprobs="behaviour")


def command(capsys, name: str) -> tuple[int, list[str], list[str]]:
    code = main(["validate", "--trainer", "trl-async", name])
    captured = capsys.readouterr()
    prefix = f"{name} (with TRL AsyncGRPO): "
    assert all(line.startswith(prefix) for line in captured.err.splitlines()), captured.err
    problems = [line[len(prefix):] for line in captured.err.splitlines()]
    needs = [line.split(" needs ", 1)[1].split(" (", 1)[0] for line in captured.out.splitlines() if " needs " in line]
    return code, problems, needs


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_validate_trainer_trl_async_and_the_start_up_check_agree(tmp_path, capsys, name):
    code, problems, needs = command(capsys, name)
    settings = [line.split(" (", 1)[0] for line in trainers.settings(rlstab.load(name), "trl-async")]
    assert set(settings) <= {PROXIMAL}
    assert needs == ([] if problems else settings)  # an objective it refuses is answered with its problems only
    kwargs = {"old_logprobs": "proximal"} if settings else {}
    assert start_up(tmp_path, name, **kwargs) == problems, name
    assert code == (1 if problems else 0)
    if not problems and needs:  # what the command names is needed: without it the start-up check refuses
        assert start_up(tmp_path, name) != []


def test_the_async_test_sees_every_outcome(capsys):
    outcomes = {name: command(capsys, name) for name in ("vcpo", "grpo", "m2po", "decoupled_ppo")}
    assert outcomes["vcpo"][0] == 1
    assert outcomes["grpo"] == outcomes["m2po"] == (0, [], [])
    assert outcomes["decoupled_ppo"] == (0, [], [PROXIMAL])


def test_the_rlstab_trainer_is_the_async_trainer():
    assert issubclass(RlstabAsyncGRPOTrainer, AsyncGRPOTrainer)
