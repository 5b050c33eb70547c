"""Random batches shared by the tests (importable: tests/ is on pytest's pythonpath)."""

import dataclasses
import math

import torch

import rlstab
from rlstab.compiler.plan import Plan


def random_batch(
    B: int = 16,
    T: int = 20,
    *,
    seed: int = 0,
    groups: int = 4,
    advantages: str | None = None,
    dtype: torch.dtype = torch.float32,
    rewards: bool | None = None,
) -> rlstab.TokenBatch:
    """A batch with padding, a tail of low-probability tokens (so S2T fires), entropy, rollout log-probs and rewards.

    Every log-probability is at most 0 (a loss refuses one above 0 on a valid token): a draw above 0 is
    reflected (``-|x|``), which keeps it as near to the values it was drawn around.

    ``advantages``: None (estimated from rewards and group_ids), "sequence" ([B]) or "token" ([B, T]).
    ``rewards``: whether the batch carries rewards and group ids; None: only when it has no advantages
    (advantages take precedence, and a compiled objective warns about rewards nothing reads).
    """
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(B, T, generator=g).pow(3) * 3.0
    low = torch.rand(B, T, generator=g) < 0.15
    logprobs[low] = math.log(1e-3) + torch.rand(int(low.sum()), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T) < lengths[:, None]
    fields = dict(
        logprobs=logprobs.to(dtype).requires_grad_(),
        old_logprobs=(logprobs + 0.3 * torch.randn(B, T, generator=g)).abs().neg().to(dtype),
        response_mask=mask,
        entropy=(torch.rand(B, T, generator=g) * 2.0).to(dtype).requires_grad_(),  # with grad: an entropy bonus needs it
        ref_logprobs=(logprobs + 0.1 * torch.randn(B, T, generator=g)).abs().neg().to(dtype),
        rewards=torch.randint(0, 2, (B,), generator=g).float(),
        group_ids=torch.randperm(B, generator=g) % groups,
    )
    # The inference engine's log-probs: near the trainer's old ones. Own stream, so the other fields keep their values.
    noise = torch.Generator().manual_seed(10_000 + seed)
    fields["rollout_logprobs"] = (fields["old_logprobs"].float() + 0.05 * torch.randn(B, T, generator=noise)).abs().neg().to(dtype)
    # Per-response fields some components read: VCPO's gradient norms, DEEP-GRPO's branch rows (whole groups).
    fields["grad_sq_norms"] = torch.rand(B, generator=noise) * 10.0 + 0.1
    fields["is_branch"] = fields["group_ids"] >= (groups + 1) // 2
    # Lp-Reg's min-p proxy of the old policy, 0.3 above its log-probabilities, at most 0 (drawn from no stream).
    fields["proxy_logprobs"] = (fields["old_logprobs"].float() + 0.3).clamp(max=0.0).to(dtype)
    # GTPO's conflict tokens: response token ids from a vocabulary of 3 (its own stream, so nothing else moves).
    fields["token_ids"] = torch.randint(0, 3, (B, T), generator=torch.Generator().manual_seed(20_000 + seed))
    if advantages == "sequence":
        fields["advantages"] = torch.randn(B, generator=g).to(dtype)
    elif advantages == "token":
        fields["advantages"] = torch.randn(B, T, generator=g).to(dtype)
    if not (advantages is None if rewards is None else rewards):  # drawn all the same: the other fields keep their values
        del fields["rewards"], fields["group_ids"], fields["grad_sq_norms"]
    return rlstab.TokenBatch(**fields)


def column_major(x: torch.Tensor) -> torch.Tensor:
    """The same values, laid out column-major (a transposed buffer): a dense non-contiguous tensor.

    A 1-D tensor has no column-major layout: it gets ``stepped``'s instead."""
    return x.t().contiguous().t() if x.dim() == 2 else stepped(x)


def stepped(x: torch.Tensor) -> torch.Tensor:
    """The same values, as every other element of a buffer twice as wide (a slice with a step)."""
    if x.dim() == 2:
        buffer = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype)
        buffer[:, ::2] = x
        return buffer[:, ::2]
    buffer = torch.zeros(2 * x.shape[0], dtype=x.dtype)
    buffer[::2] = x
    return buffer[::2]


def draw_response_mask(draw, B: int, T: int) -> torch.Tensor:
    """``[B, T]`` bool, drawn row by row (hypothesis ``draw``): empty rows, full rows, prefixes and arbitrary rows."""
    from hypothesis import strategies as st

    rows = []
    for _ in range(B):
        kind = draw(st.sampled_from(["empty", "full", "prefix", "random"]))
        if kind == "empty" or T == 0:
            rows.append([False] * T)
        elif kind == "full":
            rows.append([True] * T)
        elif kind == "prefix":
            n = draw(st.integers(0, T))
            rows.append([True] * n + [False] * (T - n))
        else:
            rows.append(draw(st.lists(st.booleans(), min_size=T, max_size=T)))
    return torch.tensor(rows, dtype=torch.bool).reshape(B, T)


def with_trainer_fields(objective: rlstab.Objective, batch: rlstab.TokenBatch | dict):
    """``batch`` (a TokenBatch or its fields) plus what ``objective`` reads beyond the loss's usual inputs, when absent.

    The inputs a trainer running the objective's other layers supplies: rewards and group ids for a
    group filter when the batch carries advantages (each response its own group, so nothing is
    dropped and the loss is the filter-free one), branch marks for ``dual_stream`` (every other row),
    each response's gradient norm for ``opob``, Lp-Reg's proxy log-probabilities (0.3 above the old
    ones, at most 0), GTPO's token ids (one group, rewards alternating 0 and 1), and group ids for a
    surrogate that reads them (Target PO: pairs of rows). Rows appended later (padding) leave these
    values of the first rows unchanged.
    """
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)} if isinstance(batch, rlstab.TokenBatch) else dict(batch)
    B = fields["logprobs"].shape[0]
    rows = torch.arange(B)
    if objective.group_filter is not None and fields.get("rewards") is None:
        fields["rewards"], fields["group_ids"] = torch.zeros(B), rows
    if objective.dual_stream is not None and fields.get("is_branch") is None:
        fields["is_branch"] = rows % 2 == 1
    if "grad_sq_norms" in objective.advantage.reads and fields.get("grad_sq_norms") is None:
        fields["grad_sq_norms"] = 1.0 + (rows % 3).float()
    if Plan.of(objective).readers("proxy_logprobs") and fields.get("proxy_logprobs") is None:  # Lp-Reg's min-p proxy
        old = fields.get("old_logprobs")
        fields["proxy_logprobs"] = ((fields["logprobs"] if old is None else old).detach() + 0.3).clamp(max=0.0)
    plan = Plan.of(objective)
    if plan.readers("token_ids"):  # GTPO's conflict tokens: one group, binary rewards, token ids that rows of
        T = fields["logprobs"].shape[1]  # both signs share at some positions
        if fields.get("token_ids") is None:
            fields["token_ids"] = (torch.arange(T)[None, :] + rows[:, None] % 2) % 3
        if fields.get("group_ids") is None:
            fields["group_ids"] = torch.zeros(B, dtype=torch.int64)
        if plan.readers("rewards") and fields.get("rewards") is None:
            fields["rewards"] = (rows % 2).float()
    if plan.readers("group_ids") and fields.get("group_ids") is None:  # Target PO's group softmax: pairs of rows
        fields["group_ids"] = rows // 2
    return rlstab.TokenBatch(**fields) if isinstance(batch, rlstab.TokenBatch) else fields
