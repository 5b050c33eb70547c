"""Cost of OpenRLHF's step-wide statistics (``--step-statistics optimizer_step``) against ``local``.

OpenRLHF 0.11.2's real ``ActorPPOTrainer.ppo_train`` (one gloo rank on CPU, the tiny Llama and the
stand-ins of the adapter tests: ``tests/adapters/openrlhf/openrlhf_ppo_train.py``) trains a training
batch of 8 responses (2 epochs x 2 optimizer steps x 2 micro-batches of 2) under each mode,
alternating which mode goes first, ``--repeats`` times; the table gives the median wall time of
``ppo_train`` per mode and the ratio to ``local`` measured in the same run. Run in the OpenRLHF
environment, from the repository root:

    python benchmarks/openrlhf_step_statistics.py                 # grpo, stapo, stare; 9 repeats

What the step-wide mode adds: one no-grad forward per micro-batch of every optimizer step (none on
the training batch's first step when nothing reads entropy), a forward over the whole replay buffer
when a training-batch component reads entropy (STARE), and a few all-reduces per step.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "adapters" / "openrlhf"))  # the CPU stand-ins and tiny model of the tests

OBJECTIVES = {
    "grpo": "grpo",
    "stapo": "stapo",
    "stare": {"extends": "dapo", "reweighters": [{"kind": "stare", "adaptive": True, "target_entropy": 5.0}]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    from openrlhf_gpu_stubs import write_stubs

    sys.path.insert(0, str(write_stubs(Path(tempfile.mkdtemp()))))
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")

    import openrlhf_ppo_train as base
    import torch
    import torch.distributed as dist

    from rlstab.adapters.openrlhf.config import OBJECTIVE_ENV, build_objective, objective_to_env
    from rlstab.adapters.openrlhf.hook import SETUP_HOOK

    torch.set_num_threads(1)
    os.environ[OBJECTIVE_ENV] = objective_to_env(build_objective("stapo"))  # an entropy reader: Actor.forward wrapped
    module, _, function = SETUP_HOOK.rpartition(".")
    getattr(importlib.import_module(module), function)()
    from openrlhf.trainer.ray import ppo_actor
    from openrlhf.utils.deepspeed import deepspeed as ds_module

    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    ppo_actor.torch_dist_barrier_and_cuda_sync = ds_module.torch_dist_barrier_and_cuda_sync = dist.barrier

    rows = []
    for name in args.objectives:
        text = objective_to_env(build_objective(OBJECTIVES[name]))
        modes = ("optimizer_step", "local")
        trainers = {m: base.build(ppo_actor, {"objective": text, "mode": m}, 0, 1)[0] for m in modes}
        times = {m: [] for m in modes}
        for r in range(args.repeats + 1):  # the first round warms up
            for m in modes if r % 2 else reversed(modes):
                trainer = trainers[m]
                trainer.replay_buffer.append(base.experiences(trainer.actor, 0, r))
                torch.manual_seed(r)
                start = time.perf_counter()
                trainer.ppo_train(0.0)
                if r:
                    times[m].append(time.perf_counter() - start)
                trainer.replay_buffer.clear()
        step, local = (statistics.median(times[m]) for m in modes)
        rows.append({"objective": name, "optimizer_step_s": step, "local_s": local, "ratio": step / local})
    print(f"{'objective':<10} {'optimizer_step':>15} {'local':>10} {'ratio':>7}   (median of {args.repeats}, ppo_train)")
    for row in rows:
        print(f"{row['objective']:<10} {row['optimizer_step_s'] * 1e3:>13.1f}ms {row['local_s'] * 1e3:>8.1f}ms "
              f"{row['ratio']:>6.2f}x")
    print(json.dumps(rows))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
