"""Cost of veRL's step-wide statistics (``step_statistics: optimizer_step``) against ``local``.

One real veRL ``TrainingWorker`` (fsdp2 engine, one gloo rank on CPU, the tiny Llama of the adapter
tests) trains the same training batch alternately under each mode, ``--repeats`` times; the table
gives the median wall time of ``train_mini_batch`` per mode and the ratio to ``local`` measured in
the same run. Run in the veRL environment (``scripts/test.sh`` builds it), from the repository root:

    python benchmarks/verl_step_statistics.py                   # stapo, 7 repeats
    python benchmarks/verl_step_statistics.py --objective stare --mini-batches 4

``--mini-batches``: optimizer steps per training batch (the first uses the old-log-prob pass, each
later one runs a no-grad forward). ``--no-kept-entropy``: the batch lacks the old policy's entropy
that the adapter keeps from veRL's old-log-prob pass, so the training batch costs a forward too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "adapters" / "verl"))  # the CPU platform and tiny model of the tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objective", default="stapo")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mini-batches", type=int, default=2)
    parser.add_argument("--no-kept-entropy", action="store_true")
    args = parser.parse_args()

    import torch

    import training_worker_rank as base

    os.environ.update(HF_HUB_OFFLINE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    torch.set_num_threads(1)
    base.install_cpu_platform()
    base.register_fsdp_engine_for_cpu()
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)

    from functools import partial

    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils import losses
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from rlstab.adapters.verl.step_scope import OLD_ENTROPY

    model_path = tempfile.mkdtemp()
    base.save_tiny_llama(model_path)
    mini = base.BATCH // args.mini_batches
    overrides = [
        "actor_rollout_ref.actor.policy_loss._target_=rlstab.adapters.verl.RlstabPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=rlstab",
        f"+actor_rollout_ref.actor.policy_loss.objective={args.objective}",
        "actor_rollout_ref.actor.calculate_entropy=true",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    ]
    arr = base.compose_actor_rollout_ref(model_path, overrides)
    config, actor_config = base.training_worker_config(arr)
    worker = TrainingWorker(config=config)
    worker.reset()
    worker.set_loss_fn(partial(losses.ppo_loss, config=actor_config))
    policy_loss = actor_config.policy_loss

    batch = base.rollout_batch(model_path)
    probe = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(probe, calculate_entropy=True, compute_loss=False)
    output = worker.infer_batch(probe)
    if not args.no_kept_entropy:
        batch.batch[OLD_ENTROPY] = no_padding_2_padding(tu.get(output, "entropy"), probe).float()

    times: dict[str, list[float]] = {"local": [], "optimizer_step": []}
    for _ in range(args.repeats):
        for mode in times:
            object.__setattr__(policy_loss, "step_statistics", mode)
            start = time.perf_counter()
            worker.train_mini_batch(base.update_actor_input(batch, arr.actor))
            times[mode].append(time.perf_counter() - start)
    base_time = statistics.median(times["local"])
    print(f"objective {args.objective}, {args.mini_batches} optimizer steps per training batch of {base.BATCH}, "
          f"{'no ' if args.no_kept_entropy else ''}kept old entropy, {args.repeats} repeats (medians)")
    print("| step_statistics | train_mini_batch (s) | ratio to local |")
    print("|---|---:|---:|")
    for mode, values in times.items():
        median = statistics.median(values)
        print(f"| {mode} | {median:.3f} | {median / base_time:.2f} |")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
