"""One gloo rank of test_optimal_token_baseline.py's two-rank test (a module of its own so that spawn can import it).

The step: 10 responses in 3 groups spread over both ranks. Rank 0 holds rows 0-4 (7 columns, in two
micro-batches); rank 1 rows 5-6 at 4 columns and rows 7-9 at 3 columns (its responses are shorter, so
its micro-batches are narrower): the step's baselines must still be those of one process.
"""

import torch
import torch.distributed as dist

import rlstab

T = 7
RANK_PARTS = {0: [(0, 2, T), (2, 5, T)], 1: [(5, 7, 4), (7, 10, 3)]}  # (first row, end row, columns)


def whole_batch(kind: str) -> rlstab.TokenBatch:
    g = torch.Generator().manual_seed(3)
    widths = torch.tensor([T] * 5 + [4] * 2 + [3] * 3)
    lengths = torch.minimum(torch.randint(1, T + 1, (10,), generator=g), widths)
    lengths[0] = T  # one full row, and one padding row
    lengths[8] = 0
    mask = torch.arange(T) < lengths[:, None]
    if kind == "tir_optimal_token_baseline":  # holes in the middle of responses (a tool's output)
        mask &= ~((torch.rand(10, T, generator=g) < 0.25) & (torch.arange(T) > 0))
    old = -torch.rand(10, T, generator=g) * 3.0
    p = old.exp()
    return rlstab.TokenBatch(
        logprobs=old.clone(), old_logprobs=old, response_mask=mask,
        rewards=torch.randint(0, 2, (10,), generator=g).float(), group_ids=torch.arange(10) % 3,
        sum_pi_squared=p**2 + torch.rand(10, T, generator=g) * (1 - p) ** 2,
    )


def part(batch: rlstab.TokenBatch, lo: int, hi: int, width: int) -> rlstab.TokenBatch:
    fields = {}
    for name in batch.__dataclass_fields__:
        value = getattr(batch, name)
        if isinstance(value, torch.Tensor):
            value = value[lo:hi, :width] if value.dim() == 2 else value[lo:hi]
        fields[name] = value
    return rlstab.TokenBatch(**fields)


def compiled(kind: str):
    return rlstab.load({"extends": "grpo", "advantage": {"kind": kind}}).compile()


def advantages_of(kind: str, parts: list[tuple[int, int, int]]) -> dict:
    """Gather the step from ``parts`` (collectively when distributed); each part's advantages padded to T columns."""
    loss_fn, batch = compiled(kind), whole_batch(kind)
    micro = [part(batch, lo, hi, width) for lo, hi, width in parts]
    stats = loss_fn.gather(micro)
    out = [loss_fn._micro_batch_tokens(m, stats).advantages for m in micro]
    padded = torch.cat([torch.nn.functional.pad(a, (0, T - a.shape[1])) for a in out])
    return {"baseline": stats.advantage.baseline, "width": stats.advantage.baseline.shape[1], "advantages": padded}


def one_process(kind: str):
    """The whole step in one process, and each rank's rows of its advantages."""
    whole = advantages_of(kind, [(0, 10, T)])
    rows = {r: torch.cat([whole["advantages"][lo:hi] for lo, hi, _ in parts]) for r, parts in RANK_PARTS.items()}
    return whole, rows


def run_rank(rank: int, world: int, kind: str) -> dict:
    """This rank's ``advantages_of`` its parts, as lists (``rlstab.testing.spawned_ranks.run_ranks``)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = advantages_of(kind, RANK_PARTS[rank])
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
