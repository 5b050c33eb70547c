"""Overhead of rlstab's compiled loss against a plain hand-written PPO-clip loss.

For each size (total tokens B x T, T = 1024) it builds one realistic random batch and times
forward + backward of three losses, interleaved in the same run (each repeat runs all three in
turn, after a warm-up), reporting medians:

- baseline: the PPO-clip loss a trainer writes without rlstab, in eager autograd:
  ``ratio = exp(logp - old)``, ``max(-A ratio, -A clamp(ratio, 0.8, 1.28))``, masked token mean
  ``sum(loss * mask) / mask.sum()``, ``backward()``.
- stapo: ``rlstab.load("stapo").compile()`` called on the whole batch, which is then its own
  step: input checks, exact entropy quantile, S2T mask, clipped surrogate, metrics (one host
  sync), ``backward()``.
- stapo (frozen step): the same loss with step statistics gathered once beforehand
  (``stats = loss_fn.gather([batch])``), timing ``loss_fn(batch, step=stats)`` + ``backward()``:
  the per-micro-batch cost inside a trainer.

The batch looks like a trained policy's: log-probabilities mostly near 0 with a tail of unlikely
tokens (about 1% below log 0.002), old log-probabilities = current + small noise, one advantage
per response, random response lengths (about 20% padding), a skewed nonnegative entropy.

Absolute times mean little on a shared machine; the ratios are the point. On CPU, a good part of
every loss's time is page faults on freshly allocated [B, T] temporaries (glibc returns large freed
blocks to the OS), so fewer temporaries count twice; running with
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184`` keeps freed memory, as GPU
caching allocators do, and shows the compute alone.

    python benchmarks/loss_overhead.py                      # 64k, 256k, 1M, 4M, 16M tokens
    python benchmarks/loss_overhead.py --sizes 1M --repeats 21
    python benchmarks/loss_overhead.py --memory             # also peak extra RSS per loss
    python benchmarks/loss_overhead.py --sizes 4k --repeats 201 --gpu-path   # host-side cost, mostly
    python benchmarks/loss_overhead.py --sizes 64 --length 64 --repeats 501 --threads 1 --gpu-path

``--memory`` runs each (size, loss) once more in a fresh subprocess and reports the rise of its
peak resident memory (``VmHWM``, reset after the batch is built) over the memory held by the batch.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
from peak_memory import peak_rise_bytes  # benchmarks/ is on sys.path when a benchmark runs as a script

import rlstab

T = 1024
EPS_LOW, EPS_HIGH = 0.2, 0.28


def make_batch(tokens: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random [B, T] tensors shaped like a real RL step (B = tokens / T)."""
    B = max(tokens // T, 1)
    g = torch.Generator().manual_seed(seed)
    # 85% confident tokens (p close to 1), 15% from a broad tail: ~1% of tokens have p < 0.002.
    confident = torch.rand(B, T, generator=g) < 0.85
    scale = torch.where(confident, torch.tensor(0.02), torch.tensor(2.3))
    logprobs = -(torch.empty(B, T).exponential_(generator=g) * scale)
    # The old policy differs a little, unlikely tokens more (so that a few ratios leave the clip range).
    noise = 0.05 * torch.randn(B, T, generator=g) * (1.0 - logprobs)
    old = (logprobs + noise).clamp_(max=0.0)
    advantages = torch.randn(B, generator=g)
    lengths = torch.randint(int(0.6 * T), T + 1, (B,), generator=g)  # mean 0.8 T: ~20% padding
    mask = torch.arange(T) < lengths.unsqueeze(-1)
    entropy = torch.exp(1.2 * torch.randn(B, T, generator=g) - 1.5)  # lognormal: skewed, >= 0
    return dict(
        logprobs=logprobs, old_logprobs=old, advantages=advantages, response_mask=mask, entropy=entropy
    )


def baseline_step(d, logprobs) -> None:
    """What a trainer writes without rlstab: eager PPO-clip, masked token mean."""
    adv = d["advantages_bt"]
    mask = d["response_mask"]
    ratio = torch.exp(logprobs - d["old_logprobs"])
    loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH))
    loss = (loss * mask).sum() / mask.sum()
    loss.backward()


def token_batch(d, logprobs) -> rlstab.TokenBatch:
    return rlstab.TokenBatch(
        logprobs=logprobs,
        old_logprobs=d["old_logprobs"],
        advantages=d["advantages"],  # [B]: one per response
        response_mask=d["response_mask"],
        entropy=d["entropy"],
    )


def stapo_step(loss_fn, d, logprobs, step=None) -> None:
    loss_fn(token_batch(d, logprobs), step=step).loss.backward()


def runners(d, gpu_path: bool = False):
    """name -> zero-argument callable running one forward + backward.

    ``gpu_path``: the compiled loss takes the path it takes on a GPU (``defer_checks``: a frozen
    step reads nothing on the host, its checks ride on the metrics' read) on these CPU tensors.
    """
    loss_fn = rlstab.load("stapo").compile()
    if gpu_path:
        loss_fn.defer_checks = True
    logprobs = d["logprobs"].clone().requires_grad_(True)
    d["advantages_bt"] = d["advantages"].unsqueeze(-1).expand_as(d["logprobs"]).contiguous()
    stats = loss_fn.gather([token_batch(d, d["logprobs"])])  # once, outside the timing

    def wrap(fn):
        def run():
            logprobs.grad = None
            fn()

        return run

    return {
        "baseline": wrap(lambda: baseline_step(d, logprobs)),
        "stapo": wrap(lambda: stapo_step(loss_fn, d, logprobs)),
        "frozen": wrap(lambda: stapo_step(loss_fn, d, logprobs, stats)),
    }


def time_size(tokens: int, repeats: int, warmup: int, gpu_path: bool = False) -> dict[str, float]:
    """Median ms of each loss, interleaved repeat by repeat."""
    run = runners(make_batch(tokens), gpu_path)
    for _ in range(warmup):
        for fn in run.values():
            fn()
    times = {name: [] for name in run}
    for i in range(repeats):
        order = list(run.items())
        if i % 2:  # alternate which loss goes first, so neither always runs on a warm cache
            order.reverse()
        for name, fn in order:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        print(f"  {fmt(tokens)}: repeat {i + 1}/{repeats}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def peak_extra_mib(tokens: int, name: str) -> float:
    """Rise of peak RSS over one forward + backward of ``name`` in a fresh process (MiB)."""
    setup = "run = b.runners(b.make_batch(int(argv[0])))[argv[1]]"
    return peak_rise_bytes("loss_overhead", setup, "run()", [str(tokens), name]) / (1 << 20)


def fmt(tokens: int) -> str:
    for unit, n in (("M", 1 << 20), ("k", 1 << 10)):
        if tokens >= n and tokens % n == 0:
            return f"{tokens // n}{unit}"
    return str(tokens)


def parse_size(s: str) -> int:
    mult = {"k": 1 << 10, "m": 1 << 20}.get(s[-1].lower(), 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def main() -> None:
    global T
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
    p.add_argument(
        "--sizes", nargs="+", type=parse_size, default=sizes, help="total tokens per batch: 64k 1M ..."
    )
    p.add_argument("--repeats", type=int, default=11, help="timed repeats per size (median reported)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument(
        "--memory", action="store_true", help="also measure peak extra RSS (a subprocess per loss)"
    )
    p.add_argument(
        "--length", type=int, default=T, help="T, the padded response length (default 1024): B = tokens / T"
    )
    p.add_argument(
        "--gpu-path",
        action="store_true",
        help="the compiled loss takes its GPU path (defer_checks) on the CPU: with small --sizes (4k), "
        "where tensor work is negligible, the host-side cost that bounds a GPU's loss call",
    )
    args = p.parse_args()
    T = args.length
    if args.threads:
        torch.set_num_threads(args.threads)

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, T = {T}, "
        f"median of {args.repeats} repeats (fewer above 4M tokens)\n"
    )
    header = "| tokens | baseline ms | stapo ms | ratio | stapo (frozen step) ms | ratio |"
    if args.memory:
        header += " baseline peak MiB | stapo peak MiB | frozen peak MiB |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for tokens in args.sizes:
        # Big batches: fewer repeats keep the run short (a 16M-token step takes seconds).
        repeats = max(5, min(args.repeats, math.ceil(args.repeats * (4 << 20) / tokens)))
        ms = time_size(tokens, repeats, args.warmup, args.gpu_path)
        base = ms["baseline"]
        digits = 3 if base < 10 else 1  # small sizes: the host-side cost, a fraction of a millisecond
        row = (
            f"| {fmt(tokens)} | {base:.{digits}f} | {ms['stapo']:.{digits}f} | {ms['stapo'] / base:.2f} "
            f"| {ms['frozen']:.{digits}f} | {ms['frozen'] / base:.2f} |"
        )
        if args.memory:
            row += "".join(f" {peak_extra_mib(tokens, n):.0f} |" for n in ("baseline", "stapo", "frozen"))
        print(row, flush=True)


if __name__ == "__main__":
    main()
