"""Goldilocks (sample layer): train on the prompts a teacher predicts the student is about half right on."""

from __future__ import annotations

import copy
import zlib
from collections import deque
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from rlstab.components import Component
from rlstab.lazy import torch
from rlstab.sampling.base import Sampler


def utility(success_rate: torch.Tensor | float) -> torch.Tensor:
    """``sqrt(p (1 - p))``: the std of a Bernoulli(p) reward, so the size of GRPO's gradient on the prompt.

    Zero when the student always or never solves it (a group without signal), largest (0.5) at p = 0.5.
    """
    p = torch.as_tensor(success_rate, dtype=torch.float32).clamp(0.0, 1.0)
    return torch.sqrt(p * (1.0 - p))


def select_prompts(predictions: torch.Tensor, n: int, epsilon: float, generator: torch.Generator) -> list[int]:
    """``n`` distinct indices into the candidate pool, epsilon-greedily by predicted utility.

    Slot by slot: with probability ``epsilon`` a candidate drawn uniformly from those not yet chosen,
    otherwise the one with the highest prediction among them. Equal predictions are ordered at
    random (one random key per candidate), so a pool of equal utilities is chosen from uniformly.
    """
    k = predictions.numel()
    if not 0 < n <= k:
        raise ValueError(f"cannot select {n} prompts from a pool of {k}")
    tie_break = torch.rand(k, generator=generator)
    greedy = sorted(range(k), key=lambda i: (-float(predictions[i]), float(tie_break[i])))
    explore = torch.rand(n, generator=generator) < epsilon
    chosen: list[int] = []
    taken = set()
    for slot in range(n):
        if bool(explore[slot]):
            left = [i for i in range(k) if i not in taken]
            pick = left[int(torch.randint(len(left), (1,), generator=generator))]
        else:
            pick = next(i for i in greedy if i not in taken)
        chosen.append(pick)
        taken.add(pick)
    return chosen


class HashedNgrams(Component):
    """The teacher's features of a prompt: its character n-grams (1 to ``ngram``), hashed into ``dims`` counts, L2-normalised.

    Goldilocks' teacher reads the question with a pretrained language model (a mean-pooled
    embedding under a linear head, per the paper's description); rlstab ships no model weights, so
    the featuriser is a declared, swappable part and this is the one built in: it needs nothing
    downloaded, and on arithmetic prompts it sees the digits and operators the difficulty
    depends on. Hashing is crc32, the same in every process (Python's ``hash`` is salted per run).
    """

    kind: Literal["hashed-ngrams"] = "hashed-ngrams"
    dims: int = Field(256, ge=8, le=1 << 20)
    """Number of hash buckets."""
    ngram: int = Field(3, ge=1, le=8)
    """Longest character n-gram counted."""

    def features(self, texts: Sequence[str]) -> torch.Tensor:
        out = torch.zeros(len(texts), self.dims)
        for row, text in enumerate(texts):
            for n in range(1, self.ngram + 1):
                for start in range(len(text) - n + 1):
                    gram = f"{n}:{text[start:start + n]}".encode()
                    out[row, zlib.crc32(gram) % self.dims] += 1.0
        return out / out.norm(dim=-1, keepdim=True).clamp(min=1e-12)

    def describe(self) -> str:
        return f"hashed-ngrams: character 1..{self.ngram}-grams hashed into {self.dims} counts, L2-normalised"


class Goldilocks(Sampler):
    r"""Goldilocks' teacher-driven prompt selection (``sampler:``).

    $$y_q = \sqrt{\hat p_q (1 - \hat p_q)},\qquad f_\phi(q) = \tfrac12\,\sigma\bigl(w^\top \phi(q) + b\bigr),\qquad
      \min_{w,b} \sum_{(q, y_q) \in \text{window}} \bigl(f_\phi(q) - y_q\bigr)^2$$

    "Goldilocks RL: Tuning Task Difficulty to Escape Sparse Rewards for Reasoning" (arXiv
    2602.14868): GRPO's gradient on a prompt is proportional to the std of its Bernoulli reward,
    sqrt(p (1 - p)), so prompts the student always or never solves are wasted compute. Each step
    the trainer draws a pool of ``candidates`` x (prompts per step) prompts; the teacher predicts
    each one's utility and the step trains on the highest, epsilon-greedily
    ([`select_prompts`][rlstab.sampling.select_prompts]); once the step's rollouts are scored, each
    trained prompt's empirical success rate over its G responses gives its target ``y_q``, which
    enters a sliding replay window of the last ``window`` (prompt, target) pairs, and the teacher
    takes ``teacher_steps`` Adam steps on the mean squared error over the window.

    What is the paper's and what is rlstab's choice: the target, the 0.5-scaled sigmoid head, MSE,
    the candidate pool, epsilon-greedy selection and the sliding window are the paper's. Its
    teacher is a pretrained LM (mean-pooled embeddings) trained asynchronously on separate GPUs;
    here the features come from ``featuriser`` (built in: [`HashedNgrams`][rlstab.sampling.HashedNgrams])
    and the head is updated synchronously after each step. The paper's values of epsilon, the pool
    size, the window and the teacher's learning rate were not available to us: the defaults
    (0.1, 4x, 512, Adam 0.01 x 4 steps) are rlstab's, chosen so the teacher tracks a 16-prompt step
    on the embedded trainer, and every one is a field. The head starts at w = 0, b = 0 (every
    prediction 0.25, so the first step's choice is uniform). Rewards must lie in [0, 1] (p is
    their mean over the group).
    """

    kind: Literal["goldilocks"] = "goldilocks"
    candidates: int = Field(4, ge=1, le=1024)
    """The candidate pool, as a multiple of the prompts a step trains on."""
    epsilon: float = Field(0.1, ge=0.0, le=1.0)
    """Probability that a slot takes a uniformly random candidate instead of the best predicted."""
    window: int = Field(512, ge=1, le=1_000_000)
    """Sliding replay window: the teacher trains on the last ``window`` (prompt, target) pairs."""
    teacher_lr: float = Field(0.01, gt=0.0, le=10.0)
    """The teacher head's Adam learning rate."""
    teacher_steps: int = Field(4, ge=0, le=1000)
    """Adam steps on the window after each student step."""
    featuriser: HashedNgrams = Field(default_factory=HashedNgrams)
    """How a prompt becomes the teacher's input."""

    def curriculum(self, seed: int) -> GoldilocksCurriculum:
        return GoldilocksCurriculum(self, seed)

    def describe(self) -> str:
        return (
            f"goldilocks: train on the best 1/{self.candidates} of a candidate pool, epsilon-greedy ({self.epsilon:g}) by "
            f"predicted utility sqrt(p (1 - p)); teacher 0.5 sigmoid(w . phi(q) + b), {self.featuriser.describe()}; "
            f"MSE over the last {self.window} prompts, {self.teacher_steps} Adam steps at {self.teacher_lr:g} per step"
        )


class GoldilocksCurriculum:
    """A running Goldilocks teacher: ``choose`` a step's prompts from a pool, ``observe`` their outcomes.

    Its state (the head, Adam's state, the window, the random stream) is ``state_dict()``, so a
    checkpointed run resumes choosing exactly as it would have.
    """

    def __init__(self, config: Goldilocks, seed: int = 0):
        self.config = config
        self.weight = torch.zeros(config.featuriser.dims, requires_grad=True)
        self.bias = torch.zeros((), requires_grad=True)
        self.optimizer = torch.optim.Adam([self.weight, self.bias], lr=config.teacher_lr)
        self.window: deque[tuple[str, float]] = deque(maxlen=config.window)
        self.generator = torch.Generator().manual_seed(seed)
        self._chosen: dict[str, float] = {}  # prompt -> predicted utility, for the metrics of the step
        self._features: dict[str, torch.Tensor] = {}  # featurised prompts (a prompt's features never change)
        self.last_metrics: dict[str, float] = {}

    def predict(self, prompts: Sequence[str]) -> torch.Tensor:
        """``[N]`` predicted utilities in (0, 0.5)."""
        with torch.no_grad():
            return self._predict(self.features(prompts))

    def features(self, prompts: Sequence[str]) -> torch.Tensor:
        """``[N, dims]`` features, each prompt featurised once (the window revisits the same prompts every step)."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self._features]
        if len(self._features) + len(missing) > 4 * self.config.window + 65_536:  # bounded on an endless stream
            self._features.clear()
            missing = list(dict.fromkeys(prompts))
        if missing:
            self._features.update(zip(missing, self.config.featuriser.features(missing)))
        return torch.stack([self._features[p] for p in prompts]) if prompts else torch.zeros(0, self.config.featuriser.dims)

    def _predict(self, features: torch.Tensor) -> torch.Tensor:
        return 0.5 * torch.sigmoid(features @ self.weight + self.bias)

    def pool_size(self, n: int) -> int:
        return self.config.candidates * n

    def choose(self, prompts: Sequence[str], n: int) -> list[int]:
        """Indices of the ``n`` prompts to train on, out of the candidate pool ``prompts``."""
        predictions = self.predict(prompts)
        chosen = select_prompts(predictions, n, self.config.epsilon, self.generator)
        self._chosen = {prompts[i]: float(predictions[i]) for i in chosen}
        self.last_metrics = {"pool_predicted_utility": float(predictions.mean())}
        return chosen

    def observe(self, prompts: Sequence[str], success_rates: Sequence[float]) -> dict[str, float]:
        """Record the step's outcomes (each trained prompt's success rate over its group), train the teacher.

        Returns the step's metrics: the selected prompts' predicted and realised utility, the
        teacher's squared error on them before this update, the share of them without signal
        (p = 0 or 1) and the window's size.
        """
        rates = torch.as_tensor(list(success_rates), dtype=torch.float32)
        if not bool(((rates >= 0) & (rates <= 1)).all()):
            raise ValueError(f"goldilocks: success rates must lie in [0, 1] (rewards in [0, 1]), got {rates.tolist()}")
        targets = utility(rates)
        predicted = torch.tensor([self._chosen.get(p, float("nan")) for p in prompts])
        known = ~torch.isnan(predicted)
        metrics = dict(self.last_metrics)
        metrics["selected_utility"] = float(targets.mean()) if targets.numel() else 0.0
        if bool(known.any()):
            metrics["selected_predicted_utility"] = float(predicted[known].mean())
            metrics["teacher_mse"] = float(((predicted[known] - targets[known]) ** 2).mean())
        metrics["selected_without_signal"] = float(((rates == 0) | (rates == 1)).float().mean()) if rates.numel() else 0.0
        self.window.extend(zip(prompts, targets.tolist()))
        self._train()
        metrics["window"] = float(len(self.window))
        return metrics

    def _train(self) -> None:
        if not self.window or self.config.teacher_steps == 0:
            return
        features = self.features([p for p, _ in self.window])
        targets = torch.tensor([y for _, y in self.window])
        for _ in range(self.config.teacher_steps):
            self.optimizer.zero_grad()
            loss = ((self._predict(features) - targets) ** 2).mean()
            loss.backward()
            self.optimizer.step()

    def state_dict(self) -> dict:
        return {
            "weight": self.weight.detach().clone(), "bias": self.bias.detach().clone(),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()), "window": list(self.window),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.weight.copy_(state["weight"])
            self.bias.copy_(state["bias"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # Adam would share the saved buffers
        self.window = deque(((str(p), float(y)) for p, y in state["window"]), maxlen=self.config.window)
        self.generator.set_state(state["generator"])

