"""Two data-parallel ranks give the step statistics, loss and gradients of one process.

Under torch.distributed every step statistic is reduced over the ranks, and the aggregation
multiplies by the world size because DDP and FSDP average gradients: so two gloo ranks, each
with two micro-batches of the kit's batch (rank 1's first one empty, as a rank with less data
has), must give what one process gives for the whole batch: the same ``StepStats`` (counts,
thresholds, the estimator's table, the hooks' step values, dropped groups), the same step
metrics on every micro-batch, the mean over ranks of each rank's summed loss equal to the whole
loss, and the rank-averaged gradient equal to the whole gradient.

A component declared per micro-batch (``selection: micro_batch``) is compared with one process
running the same four micro-batches in one step instead of the whole batch: its selection must
depend on the micro-batch only, not on the rank it runs on.

The ranks are spawned processes, so they rebuild each objective from its YAML: every component
class in it must be importable (``module.qualname``; a class defined inside a function is not)
and is registered with ``rlstab.register`` in the rank when its kind is not registered there
already. Many components are checked with one pair of processes (``two_rank_failures``), since
starting them (importing torch twice) costs far more than the checks.
"""

from __future__ import annotations

import importlib
import traceback
from datetime import timedelta

import rlstab
from rlstab.lazy import torch
from rlstab.registry import family_of, registrations
from rlstab.testing.batches import leaves, make_batch, take
from rlstab.testing.compare import assert_close, assert_grads_close, assert_same, step_metrics, summary
from rlstab.testing.hosting import components_of, host_objective
from rlstab.testing.main_guard import require_main_guard
from rlstab.testing.report import checking
from rlstab.testing.running import gradients, loss_and_grad, run_step
from rlstab.testing.spawned_ranks import RankFailure, run_ranks
from rlstab.testing.steps import declares_per_micro_batch

WORLD = 2
RANK_SPLITS = (((0, 3), (3, 8)), ((8, 8), (8, 16)))  # rows of the kit's 16-row batch; rank 1 starts empty
SEED = 11
COLLECTIVE_TIMEOUT_S = 60  # a rank whose peer failed gives up after this long
STARTUP_S = 120
CHECK = "check_two_ranks_equal_one_process"


def check_two_ranks_equal_one_process(component, *more, host=None) -> None:
    """Two gloo ranks (two micro-batches each) equal one process; several components share one pair of ranks."""
    failures = two_rank_failures([component, *more], host=host)
    if failures:
        raise AssertionError("\n".join(failures.values()))


def two_rank_failures(components, *, host=None) -> dict[int, str]:
    """``{index: message}`` for each of ``components`` that fails the two-rank check (empty: all pass)."""
    components = list(components)
    failures, cases, order = {}, [], []
    for i, component in enumerate(components):
        try:
            with checking(component, CHECK):
                cases.append(case_of(component, host))
                order.append(i)
        except AssertionError as err:
            failures[i] = str(err)
    results = _spawn(cases) if cases else []
    for i, case, per_rank in zip(order, cases, results):
        try:
            with checking(components[i], CHECK):
                _compare(components[i], case, per_rank, host)
        except AssertionError as err:
            failures[i] = str(err)
    return failures


# ---------------------------------------------------------------- what a rank is given


def case_of(component, host=None) -> dict:
    """What a spawned rank needs to rebuild the objective hosting ``component``: its YAML and its classes."""
    _importable(type(component))
    objective = host_objective(component, host)
    classes = sorted({(type(c).__module__, type(c).__qualname__) for c in components_of(objective)})
    for cls in map(type, components_of(objective)):
        _importable(cls)
    return {"classes": classes, "yaml": objective.to_yaml()}


def _importable(cls) -> None:
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        raise AssertionError(
            f"{cls.__module__}.{cls.__qualname__} cannot be imported by a spawned rank: define the class at the top "
            "level of an importable module"
        )


def rebuild(case: dict):
    """The case's objective, in a process that may not know its classes yet (they are imported and registered)."""
    for module, qualname in case["classes"]:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        family = family_of(cls)
        if family is not None and not any(r.cls is cls for r in registrations(family.name)):
            rlstab.register(cls)
    return rlstab.load(case["yaml"])


# ---------------------------------------------------------------- the ranks


def run_rank(rank: int, world: int, cases: list[dict]) -> list:
    """One gloo rank (spawned by ``run_ranks``): every case in turn, its result dict; after the first that
    raises, only that case's message (the peer times out in its next collective)."""
    from rlstab.lazy import distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    outcomes: list = []
    for case in cases:
        try:
            outcomes.append(_rank_case(rank, world, case))
        except Exception:  # noqa: BLE001 - reported to the parent as this case's failure
            outcomes.append(f"rank {rank} raised:\n{traceback.format_exc()}")
            break
    return outcomes


def _rank_case(rank: int, world: int, case: dict) -> dict:
    from rlstab.lazy import distributed as dist

    objective = rebuild(case)
    loss_fn = objective.compile()
    batch = make_batch(loss_fn, seed=SEED)
    leaf = leaves(batch)
    micro = [take(batch, lo, hi, leaf) for lo, hi in RANK_SPLITS[rank]]
    stats = loss_fn.gather(micro)
    total = torch.zeros((), dtype=torch.float64)
    metrics = []
    for mb in micro:
        out = loss_fn(mb, step=stats)
        out.loss.backward()
        total += out.loss.detach().to(torch.float64)
        metrics.append(step_metrics(out.metrics))
    grads = gradients(leaf)
    for grad in grads.values():  # DDP averages gradients over ranks
        dist.all_reduce(grad)
        grad /= world
    dist.all_reduce(total)
    return {
        "loss": (total / world).item(),
        "grad": grads,
        "stats": summary(stats, world_size=False),
        "world_size": stats.counts.world_size,
        "metrics": metrics,
    }


def _spawn(cases: list[dict]) -> list[dict[int, object]]:
    """Run ``cases`` on two spawned gloo ranks: per case, ``{rank: result dict, or an error message}``."""
    require_main_guard()  # an unguarded script would be re-run by each rank, which then dies
    timeout_s = STARTUP_S + 2 * COLLECTIVE_TIMEOUT_S + 5 * len(cases)
    try:
        per_rank = run_ranks(run_rank, cases, world=WORLD, timeout_s=timeout_s)
    except RankFailure as err:  # a rank died or went silent: every case fails with its message
        return [{rank: str(err) for rank in range(WORLD)} for _ in cases]
    return [{rank: per_rank[rank][i] for rank in range(WORLD) if i < len(per_rank[rank])} for i in range(len(cases))]


# ---------------------------------------------------------------- the comparison


def _compare(component, case: dict, per_rank: dict[int, object], host) -> None:
    for rank in range(WORLD):
        got = per_rank.get(rank)
        if got is None:
            raise AssertionError(f"rank {rank} did not run it (a rank failed on an earlier component, or timed out)")
        if isinstance(got, str):
            raise AssertionError(got)
    objective = host_objective(component, host)
    declared = declares_per_micro_batch(objective, component)
    batch = make_batch(objective.compile(), seed=SEED)
    if declared:
        bounds = [b for rank in RANK_SPLITS for b in rank]
        stats, loss, grad, outs = run_step(objective.compile(), batch, bounds)
        reference = "one process running the same four micro-batches"
        metrics = step_metrics(outs[0].metrics)
    else:
        own, grad = loss_and_grad(objective.compile(), batch)
        loss = own.loss.item()
        stats = objective.compile().gather([batch])
        reference = "one process on the whole batch"
        metrics = step_metrics(own.metrics)
    expected = summary(stats, world_size=False)
    for rank in range(WORLD):
        got = per_rank[rank]
        assert got["world_size"] == WORLD, f"rank {rank}'s StepStats say world_size {got['world_size']}, not {WORLD}"
        assert_same(got["stats"], expected, f"rank {rank}'s step statistics and those of {reference}")
        for (lo, hi), m in zip(RANK_SPLITS[rank], got["metrics"]):
            assert_same(m, metrics, f"rank {rank}'s micro-batch {lo}:{hi} step metrics and those of {reference}")
        assert_grads_close(got["grad"], grad, f"the rank-averaged gradients (rank {rank}) vs {reference}")
        assert_close(got["loss"], loss, f"the mean of the ranks' summed losses vs the loss of {reference}")
