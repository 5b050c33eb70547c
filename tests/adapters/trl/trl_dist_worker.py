"""One process of a real 2-process TRL run on CPU (accelerate MULTI_CPU, gloo), started by test_processes.py.

Each rank builds TRL's GRPOTrainer and RlstabGRPOTrainer (the accelerate state is initialised
from RANK / WORLD_SIZE / MASTER_ADDR, as ``accelerate launch`` sets them), crafts its own
micro-batches, runs both trainers' ``_compute_loss`` and averages the gradients over the ranks
as DDP does. Rank 0 saves the inputs, losses, gradients and metrics for the test to compare.

Usage: ``python trl_dist_worker.py OUT_DIR``.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trl_tiny import crafted_inputs, last_metrics, make_trainer, tiny_model

CONFORMANCE = {
    # case: (TRL GRPOConfig fields, rlstab objective)
    "dapo+delta10": ({"loss_type": "dapo", "epsilon_high": 0.28, "delta": 10.0}, "dapo"),
    "20-entropy": (
        {"loss_type": "dapo", "epsilon_high": 0.28, "delta": 10.0, "top_entropy_quantile": 0.2},
        "20-entropy",
    ),
}
# Ragged lengths per rank; with both ranks' 24 + 23 = 47 valid tokens in one micro-batch, TRL's
# 0.8-quantile position is 0.8 * 46 = 36.8 (no tie at the threshold).
LENGTHS = {0: [0, 3, 7, 5, 2, 7], 1: [6, 1, 4, 7, 2, 3]}


def averaged_grads(model) -> dict[str, torch.Tensor]:
    """DDP's gradient average over the ranks."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.detach().clone()
        dist.all_reduce(g)
        out[name] = g / dist.get_world_size()
    return out


def step(trainer, batches: list[dict], ga: int):
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = ga
    trainer._buffered_inputs = batches
    losses = []
    for j, inputs in enumerate(batches):
        trainer._step = j
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        losses.append(loss.detach())
    trainer.state.global_step += 1
    return torch.stack(losses), averaged_grads(model), last_metrics(trainer)


def main(out: Path) -> None:
    rank = int(__import__("os").environ["RANK"])
    results = {}
    model = tiny_model(sharpen=8.0)
    for case, (trl_fields, objective) in CONFORMANCE.items():
        shared = {"gradient_accumulation_steps": 1, "steps_per_generation": 1}
        theirs = make_trainer(out / case / "trl", None, model=copy.deepcopy(model), **trl_fields, **shared)
        ours = make_trainer(out / case / "rlstab", objective, model=copy.deepcopy(model), **shared)
        assert theirs.accelerator.num_processes == 2 and dist.is_initialized()
        inputs = crafted_inputs(theirs, 20 + rank, lengths=LENGTHS[rank])
        total = inputs["completion_mask"].sum().clone()
        dist.all_reduce(total)
        inputs["num_items_in_batch"] = total.float()  # TRL's count over both processes
        results[case] = {"trl": step(theirs, [inputs], 1), "rlstab": step(ours, [inputs], 1)}

    # An optimizer step of 2 micro-batches per rank with exact step statistics.
    ours = make_trainer(
        out / "exact",
        "stapo",
        model=copy.deepcopy(model),
        step_statistics="optimizer_step",
        gradient_accumulation_steps=2,
    )
    batches = [crafted_inputs(ours, 30 + 2 * rank + j, lengths=LENGTHS[(rank + j) % 2]) for j in range(2)]
    total = sum(b["completion_mask"].sum() for b in batches).clone()
    dist.all_reduce(total)
    for b in batches:
        b["num_items_in_batch"] = total.float()
    results["exact"] = step(ours, batches, 2)

    gathered = [None, None]
    dist.all_gather_object(
        gathered,
        {
            "batches": batches,
            "losses": {k: v["rlstab"][0] if k != "exact" else v[0] for k, v in results.items()},
        },
    )
    if rank == 0:
        torch.save({"results": results, "ranks": gathered, "model": model.state_dict()}, out / "results.pt")
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
