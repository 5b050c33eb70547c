"""Two real processes (accelerate MULTI_CPU over gloo), as ``accelerate launch --num_processes 2`` runs TRL.

Checks what one process cannot: rlstab's step statistics reduced over ``torch.distributed`` inside
TRL's process group. TRL's dapo and 20-entropy (whose entropy quantile TRL gathers over the
processes) against the presets, with DDP's gradient average; and an optimizer step of two
micro-batches on each of two processes with ``step_statistics="optimizer_step"`` against one
process computing the four micro-batches as one.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trl_tiny import make_trainer, tiny_model

HERE = Path(__file__).parent
METRICS = [
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("processes")
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            OMP_NUM_THREADS="1",
            HF_HUB_OFFLINE="1",
            PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "trl_dist_worker.py"), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return torch.load(out / "results.pt", weights_only=False)


@pytest.mark.parametrize("case", ["dapo+delta10", "20-entropy"])
def test_two_processes_match_trl(results, case):
    (loss, grads, metrics) = results["results"][case]["trl"]
    (our_loss, our_grads, our_metrics) = results["results"][case]["rlstab"]
    torch.testing.assert_close(our_loss, loss, rtol=1e-6, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(our_grads[name], grads[name], rtol=1e-6, atol=1e-6, msg=name)
    for name in METRICS:
        assert our_metrics[name] == pytest.approx(metrics[name], abs=1e-6), name
    if case == "20-entropy":
        # 47 valid tokens over both processes (24 + 23); the top 20% by entropy are kept on the two
        # together: ceil-ish count 47 - floor(36.8) - 1 = 10 tokens, so rank 0 reports its share of them.
        assert our_metrics["rlstab/tokens/kept"] < our_metrics["rlstab/tokens/valid"]


def test_two_processes_two_micro_batches_equal_one_process_one_micro_batch(results, tmp_path):
    """step_statistics="optimizer_step": thresholds, counts, loss and gradients as if computed at once."""
    batches = [b for rank in results["ranks"] for b in rank["batches"]]  # rank 0's two, then rank 1's two
    whole = {k: torch.cat([b[k] for b in batches]) for k in batches[0] if k != "num_items_in_batch"}
    whole["num_items_in_batch"] = batches[0]["num_items_in_batch"]
    model = tiny_model(sharpen=8.0)
    model.load_state_dict(results["model"])
    trainer = make_trainer(tmp_path, "stapo", model=model)
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(model, whole)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    _, split_grads, split_metrics = results["results"]["exact"]
    # DDP averages the ranks' gradients; each rank's losses carry the factor world_size = 2.
    rank_sums = [rank["losses"]["exact"].sum() for rank in results["ranks"]]
    torch.testing.assert_close((rank_sums[0] + rank_sums[1]) / 2, loss.detach(), rtol=1e-6, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(split_grads[name], grads[name], rtol=1e-6, atol=1e-6, msg=name)
    ours = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert split_metrics["rlstab/mask/s2t/entropy_threshold"] == ours["rlstab/mask/s2t/entropy_threshold"]
    assert split_metrics["rlstab/step/tokens_kept"] == ours["rlstab/step/tokens_kept"]
    assert ours["rlstab/mask/s2t/silenced"] > 0
