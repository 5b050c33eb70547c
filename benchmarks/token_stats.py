"""Per-token log-probabilities and entropy: rlstab.stats against the naive path and veRL's functions.

For each size (N tokens, hidden size H = 1024, vocabulary V) it builds random last hidden states,
an LM head and labels, and times forward + backward (the gradient of ``sum(g * logprobs)`` with
respect to the hidden states and the LM head; entropy detached) of each path, interleaved in the
same run (each repeat runs every path in turn, alternating the order, after a warm-up), reporting
medians and ratios against the naive path:

- naive: ``logits = h @ W.T``, ``log_softmax``, ``gather``; entropy ``-(p * log p).sum(-1)`` under
  no_grad; autograd backward.
- verl: ``logits = h @ W.T``, then veRL's ``logprobs_from_logits`` and ``entropy_from_logits``
  as its FSDP engine calls them on the un-padded ``[N, V]`` logits (entropy in the graph, unused
  by the loss: what ``calculate_entropy=True`` costs without an entropy bonus). Only when verl is
  installed (run this script with verl's interpreter).
- verl + rlstab entropy: as verl, with the entropy from ``rlstab.adapters.verl.entropy`` (what
  the veRL adapter gives an actor whose loss is rlstab's). Only when verl is installed.
- rlstab (logits): ``logits = h @ W.T``, then ``rlstab.stats.token_stats_from_logits``: one pass
  over logits a trainer already has.
- rlstab: ``rlstab.stats.token_stats(h, W, labels)``: the logits never exist.

``--frozen-head`` takes no gradient for the LM head (LoRA, frozen or tied-and-frozen heads).
``--active 0.2`` gives a non-zero upstream gradient to a random 20% of the tokens only (the others
masked, as under a 20%-entropy mask or in zero-advantage groups): ``token_stats`` leaves the
masked tokens out of its backward, the other paths do not.
Paths that materialise ``[N, V]`` logits are skipped where they would not fit in the memory the
machine has free (``--skip-above``).

``--memory`` also runs each (size, path) once in a fresh process and reports the rise of its peak
resident memory (``VmHWM``, reset after the inputs are built) over the inputs, with glibc told to
return freed blocks at once (``MALLOC_MMAP_THRESHOLD_``) so that the peak tracks live tensors.
The extra memory includes the gradients of the hidden states and of the LM head, which every path
allocates. From the measured extra memory per token, a second table estimates the largest N each
path fits in 24 GiB (inputs, gradients and extra memory, for this V; linear in N for every path).

Absolute times mean little on a shared machine; the ratios are the point. Record the load
(printed before and after) with the table.

    python benchmarks/token_stats.py                                 # N = 4k..64k x V = 32k, 64k, 152k
    python benchmarks/token_stats.py --tokens 8k --vocab 64k --memory --repeats 3
    /tmp/venv-verl/bin/python benchmarks/token_stats.py --tokens 4k 8k --vocab 32k 64k --memory
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from peak_memory import peak_rise_bytes  # benchmarks/ is on sys.path when a benchmark runs as a script

from rlstab.stats import token_stats, token_stats_from_logits

H = 1024
VOCABS = {"32k": 32768, "64k": 65536, "152k": 151936}  # 152k: Qwen2/Qwen3's vocabulary
GIB = 1 << 30

try:  # verl is optional: its paths run only where it is installed
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    from rlstab.adapters.verl.entropy import entropy_from_logits as rlstab_engine_entropy
except Exception:  # noqa: BLE001 - any import failure means "no verl"
    entropy_from_logits = logprobs_from_logits = None


def make_inputs(n: int, vocab: int, frozen_head: bool = False, active: float = 1.0, seed: int = 0) -> dict:
    """Hidden states, an LM head scaled like a trained one (logits of a few units), labels, upstream grad.

    ``active``: the share of tokens whose upstream gradient is not zero (the others are masked).
    """
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=g).requires_grad_()
    weight = (torch.randn(vocab, H, generator=g) * (3.0 / H**0.5)).requires_grad_(not frozen_head)
    labels = torch.randint(0, vocab, (n,), generator=g)
    grad = torch.randn(n, generator=g) * (torch.rand(n, generator=g) < active)
    return dict(hidden=hidden, weight=weight, labels=labels, grad=grad)


def naive(d):
    logits = d["hidden"] @ d["weight"].T
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(1, d["labels"].unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    return lp, entropy


def verl(d):
    logits = d["hidden"] @ d["weight"].T
    lp = logprobs_from_logits(logits, d["labels"])
    entropy = entropy_from_logits(logits)  # in the graph, as veRL's engine computes it
    return lp, entropy


def verl_rlstab_entropy(d):
    logits = d["hidden"] @ d["weight"].T
    lp = logprobs_from_logits(logits, d["labels"])
    return lp, rlstab_engine_entropy(logits)


def rlstab_logits(d):
    logits = d["hidden"] @ d["weight"].T
    return token_stats_from_logits(logits, d["labels"])


def rlstab(d):
    return token_stats(d["hidden"], d["weight"], d["labels"])


PATHS = {
    "naive": naive,
    "verl": verl,
    "verl + rlstab entropy": verl_rlstab_entropy,
    "rlstab (logits)": rlstab_logits,
    "rlstab": rlstab,
}
VERL_PATHS = {"verl", "verl + rlstab entropy"}
MATERIALISES = {"naive", "verl", "verl + rlstab entropy", "rlstab (logits)"}  # paths that hold [N, V] logits


def available_paths() -> list[str]:
    return [p for p in PATHS if p not in VERL_PATHS or logprobs_from_logits is not None]


def step(path: str, d) -> None:
    """One forward + backward."""
    d["hidden"].grad = None
    d["weight"].grad = None
    lp, entropy = PATHS[path](d)
    lp.backward(d["grad"])
    del entropy


def logits_bytes(n: int, vocab: int) -> int:
    return n * vocab * 4


def free_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


def fits(path: str, n: int, vocab: int, limit: float) -> bool:
    """Whether a path is worth trying: the logits paths hold about 4 [N, V] float32 tensors at peak."""
    if path not in MATERIALISES:
        return True
    return 4 * logits_bytes(n, vocab) + 2 * vocab * H * 4 <= limit


def time_size(n: int, vocab: int, paths: list[str], repeats: int, warmup: int, frozen_head: bool, active: float) -> dict:
    """Median seconds of each path, interleaved repeat by repeat."""
    d = make_inputs(n, vocab, frozen_head, active)
    for _ in range(warmup):
        for p in paths:
            step(p, d)
    times = {p: [] for p in paths}
    for i in range(repeats):
        order = paths if i % 2 == 0 else paths[::-1]  # neither path always runs on a warm cache
        for p in order:
            t0 = time.perf_counter()
            step(p, d)
            times[p].append(time.perf_counter() - t0)
        print(f"  N={fmt(n)} V={fmt(vocab)}: repeat {i + 1}/{repeats}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    return {p: statistics.median(ts) for p, ts in times.items()}


def peak_extra_bytes(n: int, vocab: int, path: str, frozen_head: bool, active: float) -> int:
    """Rise of peak RSS over the inputs during one forward + backward of ``path``, in a fresh process."""
    setup = "d = b.make_inputs(int(argv[0]), int(argv[1]), argv[3] == '1', float(argv[4]))"
    argv = [str(n), str(vocab), path, str(int(frozen_head)), str(active)]
    return peak_rise_bytes("token_stats", setup, "b.step(argv[2], d)", argv)


def largest_n(extra: int, n: int, vocab: int, frozen_head: bool, budget: int = 24 * GIB) -> int:
    """Largest N whose inputs + gradients + extra memory fit in ``budget``, from ``extra`` measured at ``n``.

    Everything but the LM head and its gradient is linear in N: per token, the hidden state, its
    label and upstream gradient, and ``(extra - grad_W) / n`` (which holds the gradient of the
    hidden state and, for the logits paths, the [N, V] tensors).
    """
    head = vocab * H * 4
    grad_head = 0 if frozen_head else head
    per_token = H * 4 + 8 + 4 + max(0, extra - grad_head) / n
    return max(0, int((budget - head - grad_head) // per_token))


def fmt(x: int) -> str:
    for name, v in VOCABS.items():
        if x == v:
            return name
    if x >= 1024 and x % 1024 == 0:
        return f"{x // 1024}k"
    return str(x)


def parse_size(s: str) -> int:
    if s in VOCABS:
        return VOCABS[s]
    mult = {"k": 1024, "m": 1 << 20}.get(s[-1].lower(), 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", nargs="+", type=parse_size, default=[4096, 8192, 16384, 32768, 65536])
    p.add_argument("--vocab", nargs="+", type=parse_size, default=list(VOCABS.values()))
    p.add_argument("--paths", nargs="+", choices=list(PATHS), default=None, help="default: every available path")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per size (median reported)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--frozen-head", action="store_true", help="no gradient for the LM head")
    p.add_argument("--active", type=float, default=1.0, help="share of tokens with a non-zero upstream gradient")
    p.add_argument("--memory", action="store_true", help="also measure peak extra RSS (a process per path)")
    p.add_argument("--no-time", action="store_true", help="memory only (with --memory)")
    p.add_argument(
        "--skip-above", type=float, default=None,
        help="GiB: skip logits paths whose estimated peak exceeds this (default: 90%% of free memory)",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = [q for q in (args.paths or available_paths()) if q in available_paths()]
    limit = args.skip_above * GIB if args.skip_above else 0.9 * free_bytes()

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, H = {H}, float32, "
        f"{'frozen LM head' if args.frozen_head else 'gradients to hidden states and LM head'}, "
        f"{args.active:.0%} of tokens with a non-zero upstream gradient, "
        f"median of {args.repeats} repeats; load average at start: {loadavg()}"
        + ("" if logprobs_from_logits is not None else "; verl not installed")
        + "\n"
    )
    cols = [q for q in paths if q != "naive"]
    header = "| N | V |" + ("" if args.no_time else " naive s |" + "".join(f" {q} s | ratio |" for q in cols))
    if args.memory:
        header += "".join(f" {q} extra GiB |" for q in paths) + "".join(f" {q} mem ratio |" for q in cols)
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    extras: dict[tuple[str, int], tuple[int, int]] = {}  # (path, V) -> (N, extra) at the largest N measured
    for vocab in args.vocab:
        for n in args.tokens:
            run = [q for q in paths if fits(q, n, vocab, limit)]
            row = f"| {fmt(n)} | {fmt(vocab)} |"
            if not args.no_time:
                sec = time_size(n, vocab, run, args.repeats, args.warmup, args.frozen_head, args.active)
                base = sec.get("naive")
                row += f" {base:.2f} |" if base else " (skipped) |"
                for q in cols:
                    if q not in sec:
                        row += " (skipped) | |"
                    else:
                        row += f" {sec[q]:.2f} | {sec[q] / base:.2f} |" if base else f" {sec[q]:.2f} | |"
            if args.memory:
                mem = {q: peak_extra_bytes(n, vocab, q, args.frozen_head, args.active) for q in run}
                for q, extra in mem.items():
                    extras[q, vocab] = (n, extra)
                row += "".join(f" {mem[q] / GIB:.2f} |" if q in mem else " (skipped) |" for q in paths)
                base = mem.get("naive")
                row += "".join(f" {mem[q] / base:.3f} |" if (q in mem and base) else " |" for q in cols)
            print(row, flush=True)
    if args.memory:
        print("\nLargest N in 24 GiB (estimated from the extra memory per token measured at the largest N run):\n")
        print("| V |" + "".join(f" {q} |" for q in paths))
        print("|" + "---|" * (len(paths) + 1))
        for vocab in args.vocab:
            cells = []
            for q in paths:
                if (q, vocab) in extras:
                    n, extra = extras[q, vocab]
                    cells.append(f" {largest_n(extra, n, vocab, args.frozen_head):,} |")
                else:
                    cells.append(" |")
            print(f"| {fmt(vocab)} |" + "".join(cells))
    print(f"\nload average at end: {loadavg()}")


if __name__ == "__main__":
    main()
