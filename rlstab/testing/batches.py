"""Random batches that carry exactly what an objective reads, and the ways the kit reshapes them.

``make_batch`` draws every field from one seeded generator in a fixed order, so a field's values
do not depend on which other fields an objective reads, and a spawned rank that draws the same
batch gets the same tensors bit for bit. It then keeps only the fields the compiled objective
declares it reads (``CompiledObjective.readers``), plus what every loss needs (``logprobs``,
``old_logprobs``, ``response_mask``) and either ``advantages`` or what the advantage estimator
reads: a component that reads a field it does not declare finds it missing.

What the values are made to exercise:

- lengths 1..T, and one row without any response token (a padding row);
- 15% of tokens with probability around 1e-3 (probability masks such as S2T's ``tau_p = 0.002`` fire);
- entropy uniform on [0, 2 * entropy_scale] (quantile masks, and controllers driven by the step's
  mean entropy, see both sides of a target near 1), with gradient, as an entropy bonus needs it
  (components that only read it see it detached): the checks compare gradients with respect to
  ``logprobs`` and ``entropy``;
- every log-probability at most 0: a draw above 0 is reflected (``-|x|``), which keeps it as near
  to the values it was drawn around (a loss refuses a log-prob above 0 on a valid token);
- ``rollout_logprobs`` within 0.05 of ``old_logprobs`` but 10% of tokens up to 4 nats away
  (IcePop, rejection and veto masks fire);
- four prompt groups, binary rewards, group 0 all rewarded (a group dynamic sampling drops);
- ``is_branch`` on whole groups (2 and 3), positive gradient norms;
- three reward dimensions (``reward_components``) on different scales, each of three levels;
- ``sum_pi_squared`` between its bounds given the old policy's probability of the sampled token;
- ``proxy_logprobs`` (Lp-Reg's min-p proxy) at or above the old log-prob and at most 0, 10% filtered out (-1e4);
- ``token_ids`` from a vocabulary of 3 (responses of a group share tokens at the same positions);
- padding positions hold finite random values, not zeros: a component that reads padding sees
  values that differ from the ones the padding check puts there.
"""

from __future__ import annotations

import dataclasses
import math

from rlstab.batch import TokenBatch
from rlstab.lazy import torch

# What the kit knows how to draw, and what every loss needs whatever its components declare.
DRAWN = (
    "old_logprobs", "entropy", "rollout_logprobs", "ref_logprobs", "rewards", "group_ids", "grad_sq_norms",
    "is_branch", "advantages", "reward_components", "sum_pi_squared", "proxy_logprobs", "token_ids",
)
ALWAYS = ("logprobs", "response_mask", "old_logprobs")
DIFFERENTIABLE = ("logprobs", "entropy")  # the fields whose gradients the checks compare
PADDING_ROW = 5  # a row without response tokens (when B > 5)


def read_fields(loss_fn, advantages: bool) -> set[str]:
    """The TokenBatch fields a compiled objective reads: its components' declared ``reads``, and the
    estimator's when the batch carries no advantages."""
    names = {f.name for f in dataclasses.fields(TokenBatch) if loss_fn.readers(f.name)}
    if not advantages:
        names |= set(loss_fn.objective.advantage.reads)
    return names


def wants_advantages(loss_fn) -> bool:
    """Whether the batch must carry advantages (``advantage: given``, or a component that reads them)."""
    return "advantages" in loss_fn.objective.advantage.reads or bool(loss_fn.readers("advantages"))


def make_batch(
    loss_fn,
    *,
    seed: int = 0,
    B: int = 16,
    T: int = 24,
    advantages: str | None = "auto",
    entropy_scale: float = 1.0,
    response_mask: torch.Tensor | None = None,
) -> TokenBatch:
    """A random batch for ``loss_fn`` (a compiled objective).

    ``advantages``: ``"auto"`` (``"sequence"`` when the objective must be given advantages, else
    None: estimated from rewards and group ids), None, ``"sequence"`` ([B]) or ``"token"`` ([B, T]).
    ``response_mask``: replaces the drawn one (the padding-free and all-padding variants).
    """
    if advantages == "auto":
        advantages = "sequence" if wants_advantages(loss_fn) else None
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(B, T, generator=g).pow(3) * 3.0
    low = torch.rand(B, T, generator=g) < 0.15
    logprobs = torch.where(low, math.log(1e-3) + torch.rand(B, T, generator=g), logprobs)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    if B > PADDING_ROW:
        lengths[PADDING_ROW] = 0
    mask = torch.arange(T) < lengths[:, None]
    old = (logprobs + 0.3 * torch.randn(B, T, generator=g)).abs().neg()  # reflected at 0: a log-prob is at most 0
    far = torch.rand(B, T, generator=g) < 0.1
    rollout = (old + 0.05 * torch.randn(B, T, generator=g) + far * (torch.rand(B, T, generator=g) - 0.5) * 8.0).abs().neg()
    group_ids = torch.randperm(B, generator=g) % 4
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    rewards = torch.where(group_ids == 0, 1.0, rewards)
    drawn = {
        "old_logprobs": old,
        "entropy": (torch.rand(B, T, generator=g) * 2.0 * entropy_scale).requires_grad_(),
        "rollout_logprobs": rollout,
        "ref_logprobs": (logprobs + 0.1 * torch.randn(B, T, generator=g)).abs().neg(),
        "rewards": rewards,
        "group_ids": group_ids,
        "grad_sq_norms": torch.rand(B, generator=g) * 10.0 + 0.1,
        "is_branch": group_ids >= 2,
    }
    sequence_advantages = torch.randn(B, generator=g)
    token_advantages = torch.randn(B, T, generator=g)
    # drawn last, so that adding it changed no other field's values: three reward dimensions on different scales
    drawn["reward_components"] = torch.randint(0, 3, (B, 3), generator=g).float() * torch.tensor([1.0, 0.5, 10.0])
    # drawn after it, likewise: sum_v pi(v)^2 >= pi(y)^2 (the sampled token's own term) and <= pi(y)^2 + (1 - pi(y))^2
    p_old = old.exp()
    drawn["sum_pi_squared"] = p_old**2 + torch.rand(B, T, generator=g) * (1.0 - p_old) ** 2
    # drawn after it, likewise: Lp-Reg's min-p proxy, the old log-prob renormalised over a kept mass in [e^-0.5, 1]
    # (at most 0: the sampled token's probability is part of that mass), and 10% of tokens filtered out (about -1e4,
    # as the authors' -1e4 logit gives)
    kept_mass = torch.rand(B, T, generator=g) * 0.5
    filtered = torch.rand(B, T, generator=g) < 0.1
    drawn["proxy_logprobs"] = torch.where(filtered, -1e4, (old + kept_mass).clamp(max=0.0))
    # drawn after it, likewise: token ids from a vocabulary of 3, so that responses of a group share tokens at the
    # same positions (GTPO's conflict tokens)
    drawn["token_ids"] = torch.randint(0, 3, (B, T), generator=g)
    if advantages == "sequence":
        drawn["advantages"] = sequence_advantages
    elif advantages == "token":
        drawn["advantages"] = token_advantages
    elif advantages is not None:
        raise ValueError(f"advantages must be 'auto', None, 'sequence' or 'token', not {advantages!r}")

    wanted = read_fields(loss_fn, advantages is not None) | set(ALWAYS)
    if advantages is not None:
        wanted.add("advantages")
    unknown = wanted - set(DRAWN) - {"logprobs", "response_mask"}
    if unknown:
        raise AssertionError(f"the objective reads TokenBatch fields the kit cannot draw: {sorted(unknown)}")
    fields = {name: value for name, value in drawn.items() if name in wanted}
    return TokenBatch(
        logprobs=logprobs.requires_grad_(),
        response_mask=mask if response_mask is None else response_mask,
        **fields,
    )


def advantage_modes(family: str) -> tuple[str, ...]:
    """The advantage layouts a loss check runs: as the objective needs them (``"auto"``: estimated, or
    per response for ``given``), and per token, whose padding positions the padding check fills too.
    Estimators and reward shaping act only when advantages are estimated: ``"auto"`` alone."""
    return ("auto",) if family in ("advantage", "reward_shaping") else ("auto", "token")


def tensors(batch: TokenBatch) -> dict[str, torch.Tensor | None]:
    """The batch's fields, by name."""
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(TokenBatch)}


def leaves(batch: TokenBatch) -> dict[str, torch.Tensor]:
    """Fresh leaves that require grad for the batch's differentiable fields (``logprobs``, ``entropy``)."""
    return {
        name: getattr(batch, name).detach().clone().requires_grad_()
        for name in DIFFERENTIABLE
        if getattr(batch, name) is not None
    }


def on_device(batch: TokenBatch, device) -> TokenBatch:
    """A copy of ``batch`` on ``device``, its differentiable fields leaves there (requiring grad as they did)."""
    return TokenBatch(**{
        name: v.detach().to(device).requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
        for name, v in tensors(batch).items()
    })


def take(batch: TokenBatch, lo: int, hi: int, leaves: dict[str, torch.Tensor]) -> TokenBatch:
    """Rows ``lo:hi`` of ``batch`` as a micro-batch whose differentiable fields are slices of ``leaves``
    (so the gradients of every micro-batch land in one tensor each, as the whole batch's do)."""
    fields = {k: (v[lo:hi] if isinstance(v, torch.Tensor) else v) for k, v in tensors(batch).items()}
    fields.update({name: leaf[lo:hi] for name, leaf in leaves.items()})
    return TokenBatch(**fields)
