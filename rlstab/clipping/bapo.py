"""BAPO: PPO clip bounds chosen every step so that positive-advantage tokens carry a target share of the loss."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from rlstab.clipping.base import SurrogateResult
from rlstab.clipping.bounded import clip_between
from rlstab.clipping.clip_range import DualClipped
from rlstab.components import ComponentState, configured
from rlstab.lazy import torch
from rlstab.tokens import Tokens


def _grid(start: float, stop: float, step: float, last_exact: bool) -> list[float]:
    """``start, start + step, ...``: up to ``stop`` (``last_exact``: then ``stop`` itself as the last value).

    Values are ``start + k * step`` (not accumulated sums), and ``k`` counts whole steps with a
    1e-9 tolerance, so 1.2 + 36 * 0.05 reaches 3.0 despite float rounding.
    """
    n = math.floor((stop - start) / step + 1e-9)
    values = [start + k * step for k in range(n + 1)]
    if last_exact and stop - values[-1] > 1e-9:
        values.append(stop)
    return values


class BAPOState(ComponentState):
    """BAPO's record between steps, as ``state_dict()`` saves it: the last step's bounds and the step count.

    A bound must lie between the first and the last candidate the search visits (``candidates()``:
    from ``lower_start``/``upper_start`` up to ``lower_max``/``upper_max``, the last one possibly a
    rounding above it, ``0.8 + 3 * 0.05 = 0.9500000000000001``); ``steps`` is a count.
    """

    clip_low: float
    """The lower ratio bound chosen at the last step."""
    clip_high: float
    """The upper ratio bound chosen at the last step."""
    steps: int = Field(ge=0)
    """How many steps have chosen bounds."""

    @field_validator("clip_low", "clip_high")
    @classmethod
    def _a_bound_the_search_visits(cls, value: float, info: ValidationInfo) -> float:
        bapo = configured(info)
        if bapo is not None:
            uppers, lowers = bapo.candidates()
            grid = lowers if info.field_name == "clip_low" else uppers
            if not grid[0] <= value <= grid[-1]:
                first, last = ("lower_start", "lower_max") if info.field_name == "clip_low" else ("upper_start", "upper_max")
                raise ValueError(
                    f"must lie within [{grid[0]!r}, {grid[-1]!r}], the bounds the search visits ({first} to {last})"
                )
        return value


class BAPO(DualClipped):
    r"""Balanced Policy Optimization with Adaptive Clipping (Xi et al., arXiv 2510.18927, eq. 8, Algorithm 1).

    The PPO clip $\max(-Ar, -A\,\mathrm{clip}(r, c_{low}, c_{high}))$ with the ratio bounds
    $c_{low}, c_{high}$ chosen once per step. Off-policy, negative-advantage tokens dominate the
    loss and entropy collapses; raising $c_{high}$ lets more low-probability positive tokens
    train, raising $c_{low}$ drops more low-probability negative ones. With, over the step's
    valid tokens,

    $$P(c_{high}) = \sum_{A_t > 0} A_t \min(r_t, c_{high}), \qquad
    N(c_{low}) = \sum_{A_t < 0} |A_t| \max(r_t, c_{low})$$

    (the magnitudes of the clipped objective's positive and negative parts, eq. 8, which also
    writes a factor $\pi_{rollout}(y_t)$ in each term; the authors' code sums the sampled tokens
    without it, and so does rlstab), BAPO starts from $c_{low} = a^-$, $c_{high} = a^+$ and,
    while $\rho < \rho_0$, steps the bounds up:

    - ``search: paper`` (Algorithm 1): $\rho = P/(P + N)$, the positive tokens' share of the
      loss (eq. 8; 1 when there is no contribution at all); while $\rho < \rho_0$ and
      $c_{low} + \delta_2 \le b^-$: raise $c_{high}$ by $\delta_1$ if $c_{high} + \delta_1 \le b^+$,
      else raise $c_{low}$ by $\delta_2$.
    - ``search: authors_code`` (github WooooDyy/BAPO, ``recipe/bapo/policy_loss.py``):
      $\rho = P/(N + 10^{-8})$ ($\infty$ when $N = 0$); raise $c_{low}$ by $\delta_2$ (the last
      step capped at $b^-$) until $\rho \ge \rho_0$ or $c_{low} = b^-$, then $c_{high}$ likewise
      up to $b^+$.

    **State across steps and ranks.** Bounds are chosen from totals over every micro-batch of
    the step and every data-parallel rank (the step hook sums $P$ and $N$ for every candidate
    bound, so one all-reduce of a few dozen numbers suffices), hence every rank and micro-batch
    of a step uses the same bounds, as the authors' latest code all-reduces. The search restarts
    from $(a^-, a^+)$ each step (Algorithm 1, line 9); the compiled objective's state holds the
    bounds chosen at the last step and the number of steps (``state_dict()``), so a checkpoint
    records them. The sums count valid tokens unweighted, whatever the aggregation, masks or
    ``is_weights`` (as the authors' code). Through the veRL adapter, which gathers each
    micro-batch as its own step, the bounds are chosen per micro-batch (across data-parallel
    ranks with ``step_statistics: data_parallel``), which is what the authors' veRL recipe does.

    **Defaults and their source.** $\rho_0 = 0.4$, $[a^-, b^-] = [0.6, 0.9]$,
    $[a^+, b^+] = [1.2, 3.0]$, $\delta_1 = 0.05$ (upper), $\delta_2 = 0.02$ (lower): the paper
    (section 5, implementation details). The authors' repository runs $\rho_0 = 0.5$,
    $[0.8, 0.95]$ step 0.05, $[1.2, 2.0]$ step 0.1 and veRL's dual-clip $c = 3$
    (``run_bapo_example.sh``); ``dual_clip: null`` follows the paper's objective (Algorithm 1,
    line 20). $r$ uses the objective's clamped log-ratio, as the authors' code.

    Metrics (``surrogate/...``): ``clip_low``, ``clip_high`` (the step's bounds) and
    ``positive_share`` ($P/(P+N)$ at those bounds; 0 without contribution); and
    ``clip/high_fraction``, ``clip/low_fraction``, ``clip/dual_fraction`` as for PPO clip.
    """

    kind: Literal["bapo"] = "bapo"
    state_model: ClassVar[type[BAPOState]] = BAPOState
    target: float = Field(0.4, ge=0.0, le=1e6)
    """rho_0: the positive contribution to reach (paper: 0.4 as a share; authors' code: 0.5 as P/N)."""
    lower_start: float = Field(0.6, gt=0.0, le=1.0)
    """a-: the lower ratio bound at the start of each step's search (paper: 0.6)."""
    lower_max: float = Field(0.9, gt=0.0, le=1.0)
    """b-: the highest lower bound the search may reach (paper: 0.9)."""
    lower_step: float = Field(0.02, gt=0.0, le=1.0)
    """delta_2: increment of the lower bound (paper: 0.02)."""
    upper_start: float = Field(1.2, ge=1.0, le=100.0)
    """a+: the upper ratio bound at the start of each step's search (paper: 1.2)."""
    upper_max: float = Field(3.0, ge=1.0, le=100.0)
    """b+: the highest upper bound the search may reach (paper: 3.0)."""
    upper_step: float = Field(0.05, gt=0.0, le=100.0)
    """delta_1: increment of the upper bound (paper: 0.05)."""
    search: Literal["paper", "authors_code"] = "paper"
    """Which search: the paper's Algorithm 1 (share, upper bound first) or the authors' code (P/N, lower first)."""
    dual_clip: float | None = Field(None, gt=1.0)
    """Dual-clip constant c for negative advantages (must exceed upper_max); null: none (paper)."""

    def _check_ranges(self) -> None:
        if self.lower_start > self.lower_max:
            raise ValueError(f"lower_start ({self.lower_start}) must not exceed lower_max ({self.lower_max})")
        if self.upper_start > self.upper_max:
            raise ValueError(f"upper_start ({self.upper_start}) must not exceed upper_max ({self.upper_max})")

    def _highest_upper(self) -> tuple[str, float]:
        return "upper_max", self.upper_max

    def candidates(self) -> tuple[list[float], list[float]]:
        """The upper and lower bounds the search can visit, in the order it visits them."""
        exact = self.search == "authors_code"
        return (
            _grid(self.upper_start, self.upper_max, self.upper_step, exact),
            _grid(self.lower_start, self.lower_max, self.lower_step, exact),
        )

    # ------------------------------------------------------------------ step hook

    def step_sums(self, t: Tokens) -> torch.Tensor:
        """``[P(c) for every upper candidate c] + [N(c) for every lower candidate c]``, float64."""
        uppers, lowers = self.candidates()
        valid = t.valid_bool
        adv = t.advantages
        r = t.ratio.to(torch.float64)
        a = torch.where(valid, adv, 0.0).to(torch.float64)
        pos, neg = a.clamp(min=0.0).reshape(-1), a.clamp(max=0.0).neg().reshape(-1)
        r = torch.where(valid, r, 1.0).reshape(-1)
        up = torch.tensor(uppers, dtype=torch.float64, device=r.device)
        low = torch.tensor(lowers, dtype=torch.float64, device=r.device)
        return torch.cat([_sum_min(pos, r, up), _sum_max(neg, r, low)])

    def initial_state(self) -> dict[str, Any]:
        return {"clip_low": self.lower_start, "clip_high": self.upper_start, "steps": 0}

    def begin_step(self, sums, state):
        uppers, lowers = self.candidates()
        if sums is None:
            value = (self.lower_start, self.upper_start, 0.0)
        else:
            totals = sums.tolist()  # host sync: the bounds are searched, and kept, on the host
            positive, negative = totals[: len(uppers)], totals[len(uppers) :]
            i, j = self._search(positive, negative)
            p, n = positive[i], negative[j]
            value = (lowers[j], uppers[i], p / (p + n) if p + n > 0 else 0.0)
        steps = (state or {}).get("steps", 0) + 1
        return value, {"clip_low": value[0], "clip_high": value[1], "steps": steps}

    def _search(self, positive: list[float], negative: list[float]) -> tuple[int, int]:
        """Indices (upper, lower) into ``candidates()`` chosen by the configured search."""
        last_i, last_j = len(positive) - 1, len(negative) - 1
        i = j = 0
        if self.search == "paper":

            def reached(i, j):
                p, n = positive[i], negative[j]
                return p + n <= 0 or p / (p + n) >= self.target

            while not reached(i, j) and j < last_j:
                if i < last_i:
                    i += 1
                else:
                    j += 1
            return i, j

        def reached(i, j):
            p, n = positive[i], negative[j]
            return (math.inf if n <= 0 else p / (n + 1e-8)) >= self.target

        while not reached(i, j) and j < last_j:
            j += 1
        while not reached(i, j) and i < last_i:
            i += 1
        return i, j

    def step_metrics(self, step_value) -> dict[str, float]:
        low, high, share = step_value
        return {"clip_low": low, "clip_high": high, "positive_share": share}

    # ------------------------------------------------------------------ loss

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        low, high, _ = step if step is not None else (self.lower_start, self.upper_start, 0.0)
        return clip_between(t, weight, low, high, self.dual_clip)

    def describe(self) -> str:
        s = (
            f"bapo: l = max(-A r, -A clip(r, c_low, c_high)), bounds chosen each step from c_low in "
            f"[{self.lower_start:g}, {self.lower_max:g}] (step {self.lower_step:g}), c_high in "
            f"[{self.upper_start:g}, {self.upper_max:g}] (step {self.upper_step:g}) until the positive "
            f"contribution reaches {self.target:g} ({self.search} search)"
        )
        return s + self.dual_clip_text()


def _prefix_sums(weight: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sorted r, [0, cumsum w], [0, cumsum w r])`` in ascending order of r (a stable sort)."""
    r_sorted, order = torch.sort(r, stable=True)
    w = weight[order]
    zero = torch.zeros(1, dtype=w.dtype, device=w.device)
    return r_sorted, torch.cat([zero, w.cumsum(0)]), torch.cat([zero, (w * r_sorted).cumsum(0)])


def _sum_min(weight: torch.Tensor, r: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    r"""$\sum_t w_t \min(r_t, b)$ for every b of ``bounds``: $\sum_{r < b} w r + b \sum_{r \ge b} w$.

    One sort and two prefix sums over the tokens, then a lookup per bound: no [tokens x bounds]
    intermediate, and deterministic on GPUs (unlike ``bincount`` or ``scatter_add`` with weights).
    """
    r_sorted, cw, cwr = _prefix_sums(weight, r)
    k = torch.searchsorted(r_sorted, bounds, right=False)  # tokens with r < b
    return cwr[k] + bounds * (cw[-1] - cw[k])


def _sum_max(weight: torch.Tensor, r: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    r"""$\sum_t w_t \max(r_t, b)$ for every b of ``bounds``: $b \sum_{r \le b} w + \sum_{r > b} w r$."""
    r_sorted, cw, cwr = _prefix_sums(weight, r)
    k = torch.searchsorted(r_sorted, bounds, right=True)  # tokens with r <= b
    return bounds * cw[k] + (cwr[-1] - cwr[k])
