"""Run as a fresh process: Ray's setup hook, then one real OpenRLHF ``ActorPPOTrainer.training_step``.

``python openrlhf_training_step.py OUT.json`` with ``$RLSTAB_OPENRLHF_OBJECTIVE``
set and the CUDA-only stand-ins (``openrlhf_gpu_stubs``) on PYTHONPATH. It

1. calls the ``worker_process_setup_hook`` by the dotted path the launcher gives Ray, as Ray does;
2. imports OpenRLHF 0.11.2's real ``openrlhf.trainer.ray.ppo_actor``;
3. builds the real ``ActorPPOTrainer`` (its own ``__init__`` builds the loss from its args) around
   OpenRLHF's real ``Actor`` wrapping a tiny Llama built in code;
4. runs the real ``training_step`` on one micro-batch (``--actor.entropy_coef`` unset, and 0), and independently computes what the rlstab
   loss should give for it (exact full-vocabulary entropy from the logits, autograd gradients),
   writing both to OUT.json.

What stands in for what cannot run on CPU: DeepSpeed's engine (``strategy.backward`` is
``loss.backward()``, ``optimizer_step`` is ``optimizer.step()``), and the CUDA synchronisation in
``torch_dist_barrier_and_cuda_sync`` (only the barrier, over a one-process gloo group, remains),
and ``torch.cuda.current_device`` (the replay buffer names a CUDA device it does not use here).
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
import tempfile
from types import SimpleNamespace as NS

import torch
import torch.distributed as dist


def main(out_path: str) -> None:
    from rlstab.adapters.openrlhf.hook import SETUP_HOOK

    module, _, function = SETUP_HOOK.rpartition(".")
    getattr(importlib.import_module(module), function)()  # what Ray does in each worker

    from openrlhf.trainer.ray import ppo_actor

    store = tempfile.NamedTemporaryFile(delete=False).name
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ppo_actor.torch_dist_barrier_and_cuda_sync = dist.barrier  # no CUDA to synchronise
    torch.cuda.current_device = lambda: 0  # NaiveReplayBuffer names a CUDA device (unused by training_step)
    # --actor.entropy_coef unset, and set to 0 (OpenRLHF computes and logs its entropy, with gradient)
    results = {coef: one_step(ppo_actor, coef) for coef in ("none", "0.0")}
    with open(out_path, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def one_step(ppo_actor, entropy_coef: str) -> dict:
    from openrlhf.models import Actor
    from openrlhf.models.loss import PolicyLoss
    from openrlhf.trainer.ppo_utils.experience import Experience
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlstab.adapters.openrlhf.loss import RlstabPolicyLoss

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).float()
    model.config._attn_implementation = "eager"
    reference_model = copy.deepcopy(model)
    actor = Actor(model)
    actor.packing_samples = False  # Actor.__init__ sets it only when it loads a model by name

    coef = None if entropy_coef == "none" else float(entropy_coef)
    args = NS(
        actor=NS(eps_clip_low_high=(0.2, 0.28), dual_clip=10.0, loss_agg_mode="token-mean", policy_loss_type="ppo",
                 aux_loss_coef=0.0, entropy_coef=coef),
        algo=NS(advantage=NS(is_correction_level="off", is_correction_mode="mask", is_correction_gating="ratio",
                             is_correction_threshold=[0.5, 5.0]),
                kl=NS(use_loss=False)),
        train=NS(max_epochs=1, dynamic_batch_enable=False, colocate_all=False, async_enable=False),
        ds=NS(packing_samples=False),
        vllm=NS(sync_backend="gloo"),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    recorded = {}

    def optimizer_step(optim, _model, sched, name=None):
        recorded["grads"] = [p.grad.detach().clone() for p in model.parameters()]
        optim.step()
        optim.zero_grad()
        sched.step()

    strategy = NS(
        args=args,
        ring_attn_group=None,
        backward=lambda loss, _model, _optim: loss.backward(),
        optimizer_step=optimizer_step,
        get_grad_norm=lambda _model: torch.stack([g.norm() for g in recorded["grads"]]).norm().item(),
    )
    trainer = ppo_actor.ActorPPOTrainer(strategy, actor, None, optimizer, scheduler, micro_train_batch_size=4)

    # One micro-batch: 4 prompts of 3 tokens (left-padded), responses of up to 6 tokens (right-padded).
    g = torch.Generator().manual_seed(1)
    B, P, A = 4, 3, 6
    sequences = torch.randint(1, config.vocab_size, (B, P + A), generator=g)
    attention_mask = torch.ones(B, P + A, dtype=torch.long)
    attention_mask[0, 0] = 0
    lengths = torch.tensor([6, 4, 5, 2])
    action_mask = torch.arange(A) < lengths[:, None]
    attention_mask[:, P:] = action_mask.long()
    advantages = torch.tensor([1.0, -0.5, 0.8, 1.2])[:, None].expand(B, A) * action_mask

    with torch.no_grad():
        old = actor(sequences, action_mask, attention_mask)  # the policy that "sampled" (on-policy)
    experience = Experience(sequences=sequences, attention_mask=attention_mask, action_mask=action_mask,
                            action_log_probs=old, advantages=advantages.contiguous(), info={})

    # What the rlstab loss should give: exact entropy and log-probs from the logits, autograd.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = reference_model(sequences, attention_mask=attention_mask, position_ids=position_ids).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
    target = sequences[:, 1:]
    logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)[:, -A:] * action_mask
    entropy = -(logp_all.exp() * logp_all).sum(-1)[:, -A:].detach()
    expected_fn = RlstabPolicyLoss(objective=trainer.actor_loss_fn.objective)
    logp.__setattr__("_rlstab_entropy", entropy)
    n = action_mask.sum().float()
    expected_loss = expected_fn(logp, old, advantages, action_mask=action_mask, dp_size=1, batch_num_tokens=n,
                                global_batch_size=torch.tensor(4.0))[0]
    expected_loss.backward()
    expected_norm = torch.stack([p.grad.norm() for p in reference_model.parameters()]).norm().item()

    status = trainer.training_step(experience, kl_ctl=0.0, step=0)

    # The wrapped forward, called as training_step calls it, once more: what the caller sees.
    log_probs, output = actor(sequences, action_mask, attention_mask=attention_mask, return_output=True,
                              return_entropy=coef is not None)
    with torch.no_grad():
        plain = actor(sequences, action_mask, attention_mask)
    return {
        "loss_class": type(trainer.actor_loss_fn).__name__,
        "is_policy_loss": isinstance(trainer.actor_loss_fn, PolicyLoss),
        "objective": trainer.actor_loss_fn.objective.name,
        "forward_wrapped": getattr(Actor.forward, "__rlstab_wrapped__", False),
        "policy_loss": status["metrics"]["policy_loss"].item(),
        "expected_loss": expected_loss.item(),
        "grad_norm": status["metrics"]["actor_grad_norm"],
        "expected_grad_norm": expected_norm,
        "entropy_loss_logged": "entropy_loss" in status["metrics"],
        "metrics": trainer.actor_loss_fn.last_metrics,
        "expected_metrics": expected_fn.last_metrics,
        "exact_entropy_mean": (entropy * action_mask).sum().item() / n.item(),
        "attached_entropy_requires_grad": log_probs._rlstab_entropy.requires_grad,
        "output_has_entropy": hasattr(output, "entropy"),
        "no_grad_forward_has_entropy": hasattr(plain, "_rlstab_entropy"),
        "ppo_clip_ratio": status["metrics"]["ppo_clip_ratio"].item(),
        "logged_silenced": status["metrics"].get("rlstab/mask/s2t/silenced"),
        "logged_weight": status["weights"].get("rlstab/mask/s2t/silenced"),
    }


if __name__ == "__main__":
    main(sys.argv[1])
