"""The aten operations one loss call + backward dispatches: the host-side cost of a loss, counted.

On a GPU every loss of ``benchmarks/loss_overhead.py`` is bound by host-side work at any size a
trainer uses (Python and the dispatch of each torch operation: the time barely grows from 1M to
16M tokens), so the number of operations a call dispatches is what to lower. This counts them,
with a ``TorchDispatchMode`` around the call and its backward (the operations that reach the
kernels' dispatch, after autograd; a composite operation counts as the operations it runs), and
those of them that launch a kernel on a GPU (all but views, allocations and the CPU tensors that
wrap a Python number: ``NO_KERNEL``), for:

- ``hand-written``: loss_overhead's baseline (eager PPO-clip, masked token mean);
- ``stapo whole``: ``loss_fn(batch)``, the micro-batch its own step;
- ``stapo frozen``, ``grpo frozen`` (advantages from binary rewards, groups of 8), ``stare frozen``:
  ``loss_fn(batch, step=stats)`` with ``stats = loss_fn.gather([batch])`` taken beforehand.

Each call builds its ``TokenBatch`` inside the count, as a trainer does. By default the compiled
losses run the path they take on a GPU (``defer_checks = True``: nothing read on the host in a
frozen step; ``Population.ON_DEVICE``: the step quantile's selection on the device); ``--cpu-path``
counts the CPU's (its checks and metrics read in the call). A frozen step's count does not depend on
the size; a whole step's quantile sorts a population of at most 8,192 tokens and selects by radix
above, as at any size a GPU benchmark measures: the default 16k tokens take that path.
``--by-site`` adds, per loss, where the operations come from (the innermost rlstab function).

    python benchmarks/loss_ops.py
    python benchmarks/loss_ops.py --by-site stapo-frozen

Counts only; no time is measured and nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import traceback
import warnings

import torch
from loss_overhead import baseline_step, make_batch, token_batch  # benchmarks/ is on sys.path as a script
from torch.utils._python_dispatch import TorchDispatchMode

import rlstab
from rlstab.quantile import Population

GROUP = 8  # responses per prompt for the GRPO row (as benchmarks/gpu.py)
LOSSES = ("hand-written", "stapo whole", "stapo frozen", "grpo frozen", "stare frozen")


# Operations that launch no kernel on a GPU: views and other aliases, allocations, and the CPU tensors that hold
# a Python number an operation takes (``torch.where(c, x, 0.0)``). They still cost their dispatch on the host.
NO_KERNEL = {
    "alias", "as_strided", "detach", "expand", "permute", "select", "slice", "squeeze", "t", "transpose", "unbind",
    "unsqueeze", "view", "_reshape_alias", "_unsafe_view", "empty", "empty_like", "scalar_tensor",
}


class _Count(TorchDispatchMode):
    """Counts every aten operation dispatched within it; with ``sites``, also by innermost rlstab function."""

    def __init__(self, sites: bool = False):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.sites: collections.Counter | None = collections.Counter() if sites else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        if self.sites is not None:
            self.sites[_site()] += 1
        return func(*args, **(kwargs or {}))

    def kernels(self) -> int:
        """The operations that would launch a kernel on a GPU (every one but ``NO_KERNEL``'s)."""
        return sum(n for op, n in self.ops.items() if op.split(".")[1] not in NO_KERNEL)


def _site() -> str:
    package = os.path.dirname(os.path.abspath(rlstab.__file__)) + os.sep
    for frame in reversed(traceback.extract_stack()[:-3]):
        if frame.filename.startswith(package):
            return f"{frame.filename[len(package):]}:{frame.name}"
    return "(outside rlstab: autograd, the caller)"


def steps(tokens: int, cpu_path: bool = False) -> dict:
    """name -> zero-argument callable running one call + backward (each builds its batch).

    Unless ``cpu_path``, sets ``Population.ON_DEVICE`` for the process (the GPU's quantile path)."""
    Population.ON_DEVICE = None if cpu_path else True
    d = make_batch(tokens)
    d["advantages_bt"] = d["advantages"].unsqueeze(-1).expand_as(d["logprobs"]).contiguous()
    B = d["logprobs"].shape[0]
    g = torch.Generator().manual_seed(1)
    d["rewards"] = (torch.rand(B, generator=g) < 0.5).float()  # binary outcome rewards
    d["group_ids"] = torch.arange(B) // GROUP
    lp = d["logprobs"].clone().requires_grad_(True)

    def grpo_batch(logprobs):
        return rlstab.TokenBatch(logprobs=logprobs, old_logprobs=d["old_logprobs"], response_mask=d["response_mask"],
                                 rewards=d["rewards"], group_ids=d["group_ids"])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stapo, grpo, stare = (rlstab.load(name).compile() for name in ("stapo", "grpo", "stare"))
        for loss_fn in (stapo, grpo, stare):
            loss_fn.defer_checks = not cpu_path
        stapo_stats = stapo.gather([token_batch(d, d["logprobs"])])
        grpo_stats = grpo.gather([grpo_batch(d["logprobs"])])
        stare_stats = stare.gather([token_batch(d, d["logprobs"])])

    def run(fn):
        def step():
            lp.grad = None
            fn()

        return step

    return {
        "hand-written": run(lambda: baseline_step(d, lp)),
        "stapo whole": run(lambda: stapo(token_batch(d, lp)).loss.backward()),
        "stapo frozen": run(lambda: stapo(token_batch(d, lp), step=stapo_stats).loss.backward()),
        "grpo frozen": run(lambda: grpo(grpo_batch(lp), step=grpo_stats).loss.backward()),
        "stare frozen": run(lambda: stare(token_batch(d, lp), step=stare_stats).loss.backward()),
    }


def count(step, sites: bool = False) -> _Count:
    step()  # warm-up: lazy imports, first-call caches
    with _Count(sites) as counter:
        step()
    return counter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=16384, help="tokens per batch (B x 1024)")
    p.add_argument("--cpu-path", action="store_true", help="count the CPU's path (checks read in the call)")
    p.add_argument("--by-site", nargs="*", metavar="LOSS", default=None,
                   help="also list the operations by rlstab function for these losses (stapo-frozen, ...; none: all)")
    p.add_argument("--by-op", action="store_true", help="also list the operations by name")
    args = p.parse_args()
    run = steps(args.tokens, args.cpu_path)
    path = "the CPU's path" if args.cpu_path else "the GPU's path (defer_checks)"
    print(f"torch {torch.__version__}, {args.tokens} tokens, compiled losses on {path}\n")
    print("| loss | aten ops per call + backward | of which launch a kernel on a GPU |")
    print("|---|---|---|")
    wanted = None if args.by_site is None else {s.replace("-", " ") for s in args.by_site} or set(LOSSES)
    details = {}
    for name in LOSSES:
        counter = count(run[name], sites=wanted is not None and name in wanted)
        print(f"| {name} | {sum(counter.ops.values())} | {counter.kernels()} |", flush=True)
        details[name] = counter
    for name, counter in details.items():
        if counter.sites is not None:
            print(f"\n{name}, by rlstab function:")
            for site, n in counter.sites.most_common():
                print(f"  {n:4d}  {site}")
        if args.by_op:
            print(f"\n{name}, by operation:")
            for op, n in counter.ops.most_common():
                print(f"  {n:4d}  {op}")


if __name__ == "__main__":
    sys.exit(main())
