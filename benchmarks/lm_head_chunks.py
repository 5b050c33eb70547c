"""The LM head's GPU path (rlstab.stats.lm_head_gpu) at several chunk sizes: forward and backward times and
working memory on one card, to choose ``CHUNK_BYTES``.

    python benchmarks/lm_head_chunks.py                          # N = 4,096 and 16,384, H = 4,096, V = 151,936
    python benchmarks/lm_head_chunks.py --tokens 4096 --mib 32 64 128

Per (N, chunk): medians of ``--repeats`` calls of forward, then backward of ``sum(g * logprob)`` to the
hidden states and the head (every token with a gradient), timed with CUDA events; working memory is the
peak allocated during the call less what was allocated before it and less the gradients it returns.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from rlstab.stats import lm_head_gpu


def measure(n: int, width: int, vocab: int, chunk: int, repeats: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(n)
    hidden = torch.randn(n, width, generator=g, device="cuda").to(torch.bfloat16)
    weight = (torch.randn(vocab, width, generator=g, device="cuda") * (2.0 / width**0.5)).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (n,), generator=g, device="cuda")
    up = torch.randn(n, generator=g, device="cuda")
    fwd, bwd, working = [], [], 0.0
    for i in range(repeats + 1):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        lp, _ = lm_head_gpu.token_stats_gpu(h, w, labels, temperature=1.0, entropy_grad=False, ignore_index=-100,
                                            use_triton=True, chunk_bytes=chunk)
        middle.record()
        (lp * up).sum().backward()
        end.record()
        torch.cuda.synchronize()
        if i:  # the first call warms up
            fwd.append(start.elapsed_time(middle))
            bwd.append(middle.elapsed_time(end))
        grads = h.grad.numel() * h.grad.element_size() + w.grad.numel() * w.grad.element_size()
        working = max(working, (torch.cuda.max_memory_allocated() - base - grads) / 2**30)
        del h, w, lp
    return {"tokens": n, "chunk_mib": chunk >> 20, "forward_ms": statistics.median(fwd),
            "backward_ms": statistics.median(bwd), "working_gib": working}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--mib", type=int, nargs="+", default=[32, 48, 64, 128, 256])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; H = {args.hidden:,}, V = {args.vocab:,}, bf16\n")
    print("| N | chunk MiB | forward ms | backward ms | total ms | working GiB |")
    print("|---|---|---|---|---|---|")
    for n in args.tokens:
        for mib in args.mib:
            r = measure(n, args.hidden, args.vocab, mib << 20, args.repeats)
            print(f"| {n:,} | {mib} | {r['forward_ms']:.2f} | {r['backward_ms']:.2f} | "
                  f"{r['forward_ms'] + r['backward_ms']:.2f} | {r['working_gib']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
