"""DEEP-GRPO (exploration layer): resample K continuations from a deep, recoverable pivot of each failed response."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from rlstab.exploration.base import Rollout
from rlstab.lazy import torch


def segment_ends(token_texts: Sequence[str], segmentation: str = "sentence", tokens_per_segment: int = 50) -> list[int]:
    """End offsets (exclusive) of a response's segments; the last one is its length.

    ``sentence``: a segment ends after every token whose text ends with ``"."`` (the authors'
    ``sp``, which splits at the ``"."`` token); ``tokens``: every ``tokens_per_segment`` tokens (their ``tp``).
    """
    n = len(token_texts)
    if segmentation == "tokens":
        ends = list(range(tokens_per_segment, n, tokens_per_segment))
    else:
        ends = [i + 1 for i, text in enumerate(token_texts[:-1]) if text.endswith(".")]
    return ends + [n] if n else []


def candidate_pivots(ends: Sequence[int]) -> tuple[list[int], list[float]]:
    """``(prefix lengths, relative depths)`` of a response's candidate pivots.

    The chain is ``[root, seg_1, ..., seg_N]`` with ``T = N + 1``; candidate i (0 = the root, the
    prompt alone) continues after segments 1..i and has depth ``(i + 1) / T``; the last segment is
    never a candidate (nothing follows it), as in the authors' ``UtilitySamplingStrategy``.
    """
    T = len(ends) + 1
    prefixes = [0] + list(ends[:-1])
    return prefixes, [(i + 1) / T for i in range(len(prefixes))]


class RecoverabilityModel:
    """P_phi(success | depth): logistic regression of "some branch from this pivot succeeded" on relative depth.

    As the authors' code: a sliding window of the last ``window`` (depth, label) pairs, refitted
    from scratch (L2-penalised, C = 1, intercept not penalised: scikit-learn's
    ``LogisticRegression`` defaults, here solved by Newton's method in float64) once it holds more
    than ``min_samples`` pairs of both labels; until then P = 1, so pivots follow depth alone.
    """

    def __init__(self, window: int = 10_000, min_samples: int = 10):
        self.pairs: deque[tuple[float, float]] = deque(maxlen=window)
        self.min_samples = min_samples
        self.coef: tuple[float, float] | None = None  # (w, b)

    def add(self, depth: float, success: bool) -> None:
        self.pairs.append((float(depth), float(success)))

    def refit(self) -> None:
        if len(self.pairs) <= self.min_samples or len({y for _, y in self.pairs}) < 2:
            self.coef = None
            return
        data = torch.tensor(list(self.pairs), dtype=torch.float64)
        x = torch.stack([data[:, 0], torch.ones(len(data), dtype=torch.float64)], -1)
        y = data[:, 1]
        theta = torch.zeros(2, dtype=torch.float64)
        penalty = torch.diag(torch.tensor([1.0, 0.0], dtype=torch.float64))  # 0.5 w^2, intercept free
        for _ in range(50):
            p = torch.sigmoid(x @ theta)
            grad = x.T @ (p - y) + penalty @ theta
            hess = x.T @ (x * (p * (1 - p)).unsqueeze(-1)) + penalty + 1e-12 * torch.eye(2, dtype=torch.float64)
            step = torch.linalg.solve(hess, grad)
            theta = theta - step
            if float(step.abs().max()) < 1e-12:
                break
        self.coef = (float(theta[0]), float(theta[1]))

    def predict(self, depths: torch.Tensor) -> torch.Tensor:
        if self.coef is None:
            return torch.ones_like(depths)
        w, b = self.coef
        return torch.sigmoid(w * depths + b)


def pivot_probabilities(depths: Sequence[float], model: RecoverabilityModel, depth_bias: float) -> torch.Tensor:
    """``Q(t) / sum Q``, ``Q(t) = P_phi(success | t/T) (t/T)^gamma`` over a response's candidate pivots (no softmax)."""
    d = torch.tensor(list(depths), dtype=torch.float64)
    q = model.predict(d) * d**depth_bias
    return q / q.sum()


class DeepGRPO(Rollout):
    r"""DEEP-GRPO's pivot-driven resampling (``rollout:``): dense local branches where failures are recoverable.

    $$Q(t) \propto P_\phi(\text{success} \mid s_{<t})\,\Bigl(\frac{t}{T}\Bigr)^{\gamma},\qquad
      P_\phi = \sigma(w\,t/T + b)$$

    "Deep Dense Exploration for LLM Reinforcement Learning via Pivot-Driven Resampling" (DEEP-GRPO,
    arXiv 2602.14169; code github AgentCombo/DEEP-GRPO, ``recipe/deep_grpo``, its "branch expansion"
    variant): root-only GRPO keeps resampling high-probability openings; DEEP-GRPO instead takes
    each failed response (reward <= ``failure_threshold``), splits it into segments, samples
    ``pivots`` of its candidate pivots (the root and the end of every segment but the last, at depth
    t/T = (i + 1) / (N + 1)) without replacement with probability Q / sum Q, and resamples ``branches``
    continuations from each, at the rollout's temperature. P_phi is refitted on whether any branch
    of a pivot succeeded ([`RecoverabilityModel`][rlstab.exploration.RecoverabilityModel]). The
    branches are extra rollouts (the G root samples are not reduced); each pivot's branches form one
    group, whose advantages are local to it; their rows train through ``dual_stream`` with the
    prefix in the prompt (gradient-masked). Defaults are the authors' paper runs: K = 8, one pivot,
    gamma = 2, a window of 10,000, sentence segments (their ``sp``); ``segmentation: tokens`` is their
    ``tp`` (50 tokens per segment), for responses without sentences (short arithmetic answers).
    The refit happens once per step, before its pivots are chosen (the authors refit at every
    choice, within an asynchronous agent loop).

    Executed by the trainer: rlstab's embedded trainer runs it; in veRL it needs an agent loop
    (the authors' recipe has one), and the rlstab adapters refuse it.
    """

    kind: Literal["deep-grpo"] = "deep-grpo"
    branches: int = Field(8, ge=1, le=256)
    """K: continuations resampled from each pivot."""
    pivots: int = Field(1, ge=1, le=64)
    """Pivots chosen per failed response."""
    depth_bias: float = Field(2.0, ge=-100.0, le=100.0)
    """gamma: the exponent on relative depth (2 in the paper's main runs; 0.1, 1, 3 in its ablations)."""
    failure_threshold: float = 0.0
    """A response whose reward is at most this is failed, and branched."""
    segmentation: Literal["sentence", "tokens"] = "sentence"
    """Where segments end: after a token ending with "." (``sp``), or every ``tokens_per_segment`` tokens (``tp``)."""
    tokens_per_segment: int = Field(50, ge=1, le=100_000)
    """Segment length for ``segmentation: tokens`` (the authors' 50)."""
    window: int = Field(10_000, ge=1, le=10_000_000)
    """P_phi's sliding window of (depth, success) pairs."""
    min_samples: int = Field(10, ge=0, le=1_000_000)
    """P_phi is fitted once the window holds more pairs than this, of both labels (P = 1 before)."""

    def explorer(self, seed: int) -> PivotExplorer:
        return PivotExplorer(self, seed)

    def describe(self) -> str:
        seg = "sentences" if self.segmentation == "sentence" else f"{self.tokens_per_segment}-token segments"
        return (
            f"deep-grpo: {self.branches} branches from {self.pivots} pivot(s) of each response with reward <= "
            f"{self.failure_threshold:g}, pivots ~ P_phi(success | t/T) (t/T)^{self.depth_bias:g} over {seg}; "
            f"P_phi logistic on depth, window {self.window}"
        )


@dataclass(frozen=True)
class Pivot:
    """A chosen pivot: the response's row, the prefix length (tokens kept), and its relative depth."""

    row: int
    prefix: int
    depth: float


class PivotExplorer:
    """A running DEEP-GRPO explorer: choose pivots of failed responses, learn P_phi from their branches' outcomes."""

    def __init__(self, config: DeepGRPO, seed: int = 0):
        self.config = config
        self.model = RecoverabilityModel(config.window, config.min_samples)
        self.generator = torch.Generator().manual_seed(seed)

    def choose(self, responses: Sequence[Sequence[str]], rewards: Sequence[float]) -> list[Pivot]:
        """Pivots of the failed responses (each a list of token texts), ``pivots`` per response at most."""
        cfg = self.config
        self.model.refit()
        chosen = []
        for row, (tokens, reward) in enumerate(zip(responses, rewards)):
            if reward > cfg.failure_threshold or not tokens:
                continue
            prefixes, depths = candidate_pivots(segment_ends(tokens, cfg.segmentation, cfg.tokens_per_segment))
            p = pivot_probabilities(depths, self.model, cfg.depth_bias)
            picks = torch.multinomial(p, min(cfg.pivots, len(prefixes)), replacement=False, generator=self.generator)
            chosen += [Pivot(row, prefixes[i], depths[i]) for i in picks.tolist()]
        return chosen

    def observe(self, pivots: Sequence[Pivot], branch_rewards: torch.Tensor) -> dict[str, float]:
        """Feed each pivot's outcome (``[P, K]`` rewards of its branches) to P_phi; the step's metrics."""
        success = branch_rewards > self.config.failure_threshold
        for pivot, ok in zip(pivots, success.any(-1).tolist()):
            self.model.add(pivot.depth, ok)
        if not pivots:
            return {"pivots": 0.0}
        return {
            "pivots": float(len(pivots)),
            "pivot_depth": sum(p.depth for p in pivots) / len(pivots),
            "branch_success": float(success.float().mean()),
            "pivot_recovered": float(success.any(-1).float().mean()),
            "p_phi_fitted": float(self.model.coef is not None),
        }

    def state_dict(self) -> dict:
        return {"pairs": list(self.model.pairs), "coef": self.model.coef, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.model.pairs = deque(((float(d), float(y)) for d, y in state["pairs"]), maxlen=self.config.window)
        self.model.coef = None if state["coef"] is None else tuple(state["coef"])
        self.generator.set_state(state["generator"])
