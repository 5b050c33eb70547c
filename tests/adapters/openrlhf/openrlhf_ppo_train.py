"""Run as one rank of a gloo group: OpenRLHF's real ``ActorPPOTrainer.ppo_train`` over several training batches.

``python openrlhf_ppo_train.py CONFIG.json`` with the CUDA-only stand-ins (``openrlhf_gpu_stubs``) on
PYTHONPATH. CONFIG holds ``rank``, ``world_size``, ``store`` (a file for gloo's rendezvous), ``out``
(a torch.save file this rank writes), and ``cases``: a list of runs, each

    {"name", "objective" (YAML), "mode" ("optimizer_step" | "local"), "batches": [first, stop),
     "save_after": k or null, "ckpt": directory or null, "resume": bool, "expect_error": bool,
     "skip_check": bool}

Each run builds a fresh tiny Llama (the same initial weights on every rank), OpenRLHF's real
``Actor``, ``NaiveReplayBuffer``, ``ActorPPOTrainer`` (its own ``__init__`` builds the loss from the
environment, as in a Ray worker) and a real ``DeepspeedStrategy`` object, then for each training
batch: this rank's own experiences (different prompts per rank; old log-probs from the current
actor, as OpenRLHF's experience maker computes them) go into the replay buffer, ``ppo_train`` runs
(2 epochs x 2 optimizer steps x 2 micro-batches of 2 responses per rank), and the buffer is cleared
(as ``PolicyModelActor.fit`` does). Every ``gather`` / ``begin_training_batch`` of the compiled
objective is recorded (its inputs, its results, the state after), so the test can recompute them in
one process on both ranks' inputs together.

Checkpoints go through OpenRLHF's own ``PolicyModelActor.save_checkpoint`` (the real function of the
Ray actor class, called on a stand-in ``self`` holding the strategy and the actor) and the real
``DeepspeedStrategy.save_ckpt`` / ``load_ckpt`` (wrapped by rlstab); resuming calls
``strategy.load_ckpt(actor.model, <ckpt>/_actor)`` and then builds the trainer, in that order, as
``PolicyModelActor.init_model_from_pretrained`` does.

What stands in for what cannot run on CPU: the DeepSpeed engine (``FakeEngine``, a
``DeepSpeedEngine`` subclass: forward is the module's; ``save_checkpoint`` / ``load_checkpoint`` write
and read the module, optimizer and scheduler states and ``client_state`` with ``torch.save``, rank 0
writing as DeepSpeed's non-ZeRO-3 path does); DeepSpeed's gradient accumulation and data-parallel
averaging (``strategy.backward`` divides the loss by the accumulation steps, ``optimizer_step``
all-reduces the gradients to their mean and steps every ``accumulated_gradient`` calls); the CUDA
synchronisation in ``torch_dist_barrier_and_cuda_sync`` (only the gloo barrier remains); and
``torch.cuda.current_device`` (0 while the replay buffer names its CUDA device, which it does not use
here; ``"cpu"`` while ``ppo_train`` moves experiences).
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import sys
import time
from types import SimpleNamespace as NS

import torch
import torch.distributed as dist

P, A = 3, 6  # prompt and response lengths
MICRO, GAS, STEPS_PER_EPOCH, EPOCHS = 2, 2, 2, 2
SAMPLES = MICRO * GAS * STEPS_PER_EPOCH  # per rank and training batch


def main(config_path: str) -> None:
    config = json.loads(open(config_path).read())
    torch.set_num_threads(1)  # two ranks share the machine's cores
    rank, world = config["rank"], config["world_size"]
    from rlstab.adapters.openrlhf.hook import SETUP_HOOK

    module, _, function = SETUP_HOOK.rpartition(".")
    getattr(importlib.import_module(module), function)()  # what Ray does in each worker
    import surprisal_controller  # tests/: a stateful kind of the tests' own, for the cases that name it

    surprisal_controller.register()

    from openrlhf.trainer.ray import ppo_actor
    from openrlhf.utils.deepspeed import deepspeed as ds_module

    dist.init_process_group("gloo", init_method=f"file://{config['store']}", rank=rank, world_size=world)
    ppo_actor.torch_dist_barrier_and_cuda_sync = dist.barrier
    ds_module.torch_dist_barrier_and_cuda_sync = dist.barrier
    results = {}
    for case in config["cases"]:
        results[case["name"]] = run_case(ppo_actor, case, rank, world)
    torch.save(results, config["out"])
    dist.barrier()
    dist.destroy_process_group()


def build(ppo_actor, case, rank, world):
    """A fresh actor, optimizer, engine, strategy; the checkpoint loaded first when resuming; then the trainer."""
    import deepspeed
    from openrlhf.models import Actor
    from openrlhf.utils.deepspeed import DeepspeedStrategy
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlstab.adapters.openrlhf.config import OBJECTIVE_ENV, STEP_STATISTICS_ENV

    class FakeEngine(deepspeed.DeepSpeedEngine):
        """Stands in for DeepSpeed's engine: the module's forward, and checkpoints with torch.save."""

        def __init__(self, module, optimizer, scheduler):
            torch.nn.Module.__init__(self)
            self.module = module
            self.__dict__["_ckpt"] = (optimizer, scheduler)

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

        def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True):
            optimizer, scheduler = self.__dict__["_ckpt"]
            if dist.get_rank() == 0:
                os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
                torch.save({"module": self.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "client_state": dict(client_state or {})},
                           os.path.join(save_dir, tag, "state.pt"))
                if save_latest:
                    with open(os.path.join(save_dir, "latest"), "w") as f:
                        f.write(tag)
            dist.barrier()

        def load_checkpoint(self, load_dir, tag=None, **kwargs):
            optimizer, scheduler = self.__dict__["_ckpt"]
            tag = tag or open(os.path.join(load_dir, "latest")).read().strip()
            path = os.path.join(load_dir, tag)
            saved = torch.load(os.path.join(path, "state.pt"), weights_only=False)
            self.module.load_state_dict(saved["module"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            return path, saved["client_state"]

    os.environ[OBJECTIVE_ENV] = case["objective"]
    os.environ[STEP_STATISTICS_ENV] = case["mode"]
    torch.manual_seed(0)
    model_config = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(model_config).float()
    model.config._attn_implementation = "eager"
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    engine = FakeEngine(model, optimizer, scheduler)
    actor = Actor(engine)
    actor.packing_samples = False  # Actor.__init__ sets it only when it loads a model by name

    args = NS(
        actor=NS(eps_clip_low_high=(0.2, 0.28), dual_clip=10.0, loss_agg_mode="token-mean", policy_loss_type="ppo",
                 aux_loss_coef=0.0, entropy_coef=None),
        algo=NS(advantage=NS(is_correction_level="off", is_correction_mode="mask", is_correction_gating="ratio",
                             is_correction_threshold=[0.5, 5.0]),
                kl=NS(use_loss=False)),
        train=NS(max_epochs=EPOCHS, dynamic_batch_enable=False, colocate_all=False, async_enable=False),
        ds=NS(packing_samples=False, tensor_parallel_size=1, param_dtype="fp32"),
        vllm=NS(sync_backend="gloo"),
        ckpt=NS(path=case.get("ckpt"), max_num=3, max_mem=1000),
    )
    strategy = DeepspeedStrategy(micro_train_batch_size=MICRO, train_batch_size=SAMPLES * world, args=args)
    strategy.world_size = world
    strategy.accumulated_gradient = GAS
    micro_steps = [0]
    grad_norms = [0.0]

    def backward(loss, _model, _optim):
        (loss / GAS).backward()  # DeepSpeed scales each micro-batch loss by 1 / gradient-accumulation steps

    def optimizer_step(optim, _model, sched, name=None):
        micro_steps[0] += 1
        if micro_steps[0] % GAS:  # DeepSpeed steps at accumulation boundaries only
            return
        for p in model.parameters():  # DeepSpeed averages gradients over data-parallel ranks
            dist.all_reduce(p.grad)
            p.grad /= world
        grad_norms[0] = torch.stack([p.grad.norm() for p in model.parameters()]).norm().item()
        optim.step()
        optim.zero_grad()
        sched.step()

    strategy.backward = backward
    strategy.optimizer_step = optimizer_step
    strategy.get_grad_norm = lambda _model: grad_norms[0]

    if case.get("resume"):  # as PolicyModelActor.init_model_from_pretrained: load, then build the trainer
        strategy.load_ckpt(actor.model, os.path.join(case["ckpt"], "_actor"))
    torch.cuda.current_device = lambda: 0  # NaiveReplayBuffer names a CUDA device it does not use here
    trainer = ppo_actor.ActorPPOTrainer(strategy, actor, None, optimizer, scheduler, micro_train_batch_size=MICRO,
                                        dataloader_pin_memory=False)
    torch.cuda.current_device = lambda: "cpu"  # ppo_train moves experiences to it
    return trainer, strategy, model


def experiences(actor, rank: int, index: int):
    """This rank's training batch ``index``: its own prompts, old log-probs from the current actor."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    g = torch.Generator().manual_seed(1000 * index + rank)
    B = SAMPLES
    sequences = torch.randint(1, 48, (B, P + A), generator=g)
    lengths = torch.randint(2, A + 1, (B,), generator=g)
    action_mask = torch.arange(A) < lengths[:, None]
    attention_mask = torch.ones(B, P + A, dtype=torch.long)
    attention_mask[:, P:] = action_mask.long()
    sequences = sequences * attention_mask
    advantages = (torch.randn(B, generator=g)[:, None] * action_mask).contiguous()
    with torch.no_grad():
        old = actor(sequences, action_mask, attention_mask)
    return Experience(sequences=sequences, attention_mask=attention_mask, action_mask=action_mask,
                      action_log_probs=old, advantages=advantages, info={})


def record_calls(compiled, events):
    """Record each gather / begin_training_batch: its inputs (as the ranks used them), results and the state after."""
    gather, begin = compiled.gather, compiled.begin_training_batch

    def rows(batches):
        fields = ("logprobs", "old_logprobs", "advantages", "response_mask", "entropy")
        return [{f: None if getattr(b, f) is None else getattr(b, f).detach().clone() for f in fields} for b in batches]

    def recorded_gather(batches, **kwargs):
        batches = list(batches)
        stats = gather(batches, **kwargs)
        events.append({"kind": "gather", "batches": rows(batches), "thresholds": stats.thresholds,
                       "hooks": copy.deepcopy(stats.hooks), "kept": stats.counts.tokens_kept,
                       "valid": stats.counts.tokens_valid, "state": compiled.state_dict(),
                       "update_state": kwargs.get("update_state", True), "part_of_step": kwargs.get("part_of_step", False)})
        return stats

    def recorded_begin(batches, **kwargs):
        batches = list(batches)
        begin(batches, **kwargs)
        events.append({"kind": "begin", "batches": rows(batches), "state": compiled.state_dict()})

    compiled.gather, compiled.begin_training_batch = recorded_gather, recorded_begin


def run_case(ppo_actor, case, rank, world) -> dict:
    from rlstab.adapters.openrlhf import step_scope

    if case.get("skip_check"):  # only to show what the refused setting would do
        original_check = step_scope.check_trainer
        step_scope.check_trainer = lambda trainer, loss: None
    try:
        trainer, strategy, model = build(ppo_actor, case, rank, world)
    except Exception as err:  # noqa: BLE001 - the test asserts on the message
        if not case.get("expect_error"):
            raise
        return {"error": f"{type(err).__name__}: {err}"}
    finally:
        if case.get("skip_check"):
            step_scope.check_trainer = original_check
    if case.get("expect_error"):
        return {"error": None}
    loss = trainer.actor_loss_fn
    events: list = []
    record_calls(loss.compiled, events)
    states, seconds = [], []
    first, stop = case["batches"]
    for index in range(first, stop):
        trainer.replay_buffer.append(experiences(trainer.actor, rank, index))
        torch.manual_seed(7 * index + rank)  # the DataLoader's shuffle
        start = time.perf_counter()
        status = trainer.ppo_train(0.0)
        seconds.append(time.perf_counter() - start)
        trainer.replay_buffer.clear()
        states.append(loss.compiled.state_dict())
        if case.get("save_after") == index + 1:
            save_checkpoint = ppo_actor.PolicyModelActor.__ray_metadata__.modified_class.save_checkpoint
            holder = NS(strategy=strategy, actor=trainer.actor, disable_ds_ckpt=False, save_hf_ckpt=False)
            save_checkpoint(holder, f"global_step{index + 1}", client_states={"episode": index + 1})
    return {
        "events": events,
        "states": states,
        "seconds": seconds,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "status_keys": sorted(status),
        "kept_fraction": status.get("rlstab/tokens/kept_fraction"),
    }


if __name__ == "__main__":
    main(sys.argv[1])
