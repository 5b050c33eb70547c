"""``Run``: one objective trained by the embedded trainer from a seed, step by step, with its whole state.

``rlstab demo`` drives one ``Run`` per objective; the lab drives one per (objective, regime, seed)
and checkpoints it. Everything a run carries from one step to the next is in ``state_dict()``:

- the trainable weights and Adam's state;
- the compiled objective's state (STARE's controller, BAPO's bounds);
- the three random streams: problems, sampling, and torch's global one;
- the sampler's and the rollout explorer's state (Goldilocks, DEEP-GRPO);
- for **policy lag** (``config.policy_lag = k``), the weights of the last ``k + 1`` steps. The
  rollouts of step ``s`` are sampled by the policy as it was after step ``s - 1 - k`` (the warm
  start while ``s <= k + 1``), as an asynchronous trainer's inference engine lags its trainer. The
  "old" log-probabilities are still recomputed by the current policy (as veRL does), and the
  sampler's own log-probabilities reach the objective as ``rollout_logprobs``: the mismatch that
  TIS, IcePop, rollout rejection and VCPO's ESS scale read.

A run restored from ``state_dict()`` takes the same steps as one never interrupted.
"""

from __future__ import annotations

import collections
import copy
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlstab.lazy import torch
from rlstab.objective import Objective
from rlstab.trainer.config import TrainConfig
from rlstab.trainer.layers import TrainerLayers
from rlstab.trainer.loop import add_sampler_metrics, evaluate, rl_step
from rlstab.trainer.models import load_policy
from rlstab.trainer.passk import measure, sample_seed
from rlstab.trainer.rows import start_row, step_row
from rlstab.trainer.tasks import Task, get_task, held_out_problems

if TYPE_CHECKING:
    from pathlib import Path

    from rlstab.compiled import CompiledObjective
    from rlstab.trainer.policy import Policy

STATE_KEYS = frozenset({
    "step", "weights", "optimizer", "objective_state", "problem_rng", "sample_rng", "torch_rng", "snapshots", "layers",
})
"""The keys of ``Run.state_dict()``."""


@dataclass(frozen=True)
class StepOutcome:
    """One RL step's ``metrics.jsonl`` row, with what the row leaves out.

    Attributes:
        row: the step's row (``rlstab.trainer.rows.step_row``).
        ess_fraction: ESS / N of the rollouts' sequence importance weights pi_old / pi_rollout
            (1.0 on-policy), None when the rollouts carry no log-probabilities of their own.
        seconds: the step's wall time.
    """

    row: dict
    ess_fraction: float | None
    seconds: float


class Run:
    """One objective trained from a seed: ``start()`` once, then ``step()`` until ``done``.

    Args:
        objective: an [`Objective`][rlstab.Objective] or its compiled loss.
        config: the run's knobs, seed and length.
        task: a task or its name (``add2``, ``add3``, ``mul2``, ``add1``).
        label: the run's name in its rows (the objective's name by default).
        policy: the starting policy, used in place (the demo hands each objective a copy of one
            warm start); None loads ``model`` warm-started on ``task`` from ``config.seed``.
        model: the model ``load_policy`` loads when ``policy`` is None (``tiny`` or ``smollm2``).
        cache_dir: where ``load_policy`` caches the warm-started ``tiny`` model, when ``policy`` is None.
        progress (Callable[[str], None] | bool | None): ``load_policy``'s progress lines, when
            ``policy`` is None: a callable taking one line, True (lines to stderr), or False or
            None (silent).
    """

    def __init__(
        self,
        objective: Objective | CompiledObjective,
        config: TrainConfig,
        task: Task | str,
        *,
        label: str | None = None,
        policy: Policy | None = None,
        model: str = "tiny",
        cache_dir: Path | str | None = None,
        progress=None,
    ):
        self.config = config
        self.task = get_task(task) if isinstance(task, str) else task
        if policy is None:
            policy = load_policy(model, self.task, seed=config.seed, cache_dir=cache_dir, progress=progress,
                                 warm_start_steps=config.warmup_steps, warm_start_band=config.warm_start_band,
                                 eval_size=config.eval_size)
        self.policy = policy
        self.loss_fn = objective.compile() if isinstance(objective, Objective) else objective
        self.label = label or self.loss_fn.objective.name or "custom"
        self.eval_problems = held_out_problems(self.task, config.eval_size)
        self.sampler = copy.deepcopy(policy) if config.policy_lag else None

        torch.manual_seed(config.seed)
        self.problem_generator = torch.Generator().manual_seed(config.seed)
        self.sample_generator = torch.Generator().manual_seed(config.seed + 1)
        self.optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=config.lr)
        self.layers = TrainerLayers(self.loss_fn.objective, config.seed)
        self.snapshots: collections.deque[list[torch.Tensor]] = collections.deque(maxlen=config.policy_lag + 1)
        self.snapshots.append(_weights(policy))
        self.steps_done = 0

    @property
    def done(self) -> bool:
        return self.steps_done >= self.config.steps

    def start(self) -> dict:
        """Step 0's row: the starting policy's held-out accuracy (nothing is trained)."""
        return self._with_pass_at_k(start_row(self.label, self.accuracy()), 0)

    def accuracy(self) -> float:
        """Greedy exact-match accuracy on the held-out problems."""
        return evaluate(self.policy, self.task, self.eval_problems)

    def pass_at_k(self, step: int) -> dict[str, float]:
        """Held-out pass@k and distinct right answers per prompt (``rlstab.trainer.passk``) at ``step``, from
        ``pass_samples`` samples per problem at the run's temperature, by a generator of their own."""
        generator = torch.Generator().manual_seed(sample_seed(self.config.seed, step))
        return measure(self.policy, self.task, self.eval_problems, k=self.config.pass_k, n=self.config.pass_samples,
                       temperature=self.config.temperature, generator=generator)

    def _with_pass_at_k(self, row: dict, step: int) -> dict:
        """``row`` with ``pass_at_k`` added when the config asks for it (``pass_k > 0``), else ``row`` as it is."""
        if self.config.pass_k:
            row["pass_at_k"] = self.pass_at_k(step)
        return row

    def step(self) -> StepOutcome:
        """Sample, score and train one RL step; held-out accuracy every ``eval_every`` steps and at the last."""
        if self.done:
            raise RuntimeError(f"run {self.label!r} has taken its {self.config.steps} steps")
        started = time.perf_counter()
        step = self.steps_done + 1
        if self.sampler is not None:
            _set_weights(self.sampler, self.snapshots[0])
        problems = self.layers.problems(self.task, self.config.prompts_per_step, self.problem_generator)
        metrics = rl_step(self.policy, self.optimizer, self.loss_fn, self.task, problems, self.sample_generator,
                          self.config, sampler=self.sampler, explorer=self.layers.explorer)
        add_sampler_metrics(metrics, self.layers.observe(problems, metrics["prompt_rates"]))
        evaluate_now = step % self.config.eval_every == 0 or step == self.config.steps
        accuracy = self.accuracy() if evaluate_now else None
        row = step_row(self.label, step, metrics, accuracy, self.loss_fn.mask_labels)
        if evaluate_now:
            row = self._with_pass_at_k(row, step)
        if self.sampler is not None:
            self.snapshots.append(_weights(self.policy))
        self.steps_done = step
        return StepOutcome(row, metrics["ess_fraction"], time.perf_counter() - started)

    def state_dict(self) -> dict:
        """Everything the next step depends on (``STATE_KEYS``), for ``torch.save(..., weights_only=True)``."""
        return {
            "step": self.steps_done, "weights": _weights(self.policy), "optimizer": self.optimizer.state_dict(),
            "objective_state": self.loss_fn.state_dict(), "problem_rng": self.problem_generator.get_state(),
            "sample_rng": self.sample_generator.get_state(), "torch_rng": torch.get_rng_state(),
            "snapshots": list(self.snapshots), "layers": self.layers.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``: the next ``step()`` is the one the saved run would have taken."""
        missing = STATE_KEYS - state.keys()
        if missing:
            raise KeyError(f"not a Run's state: it lacks {sorted(missing)}")
        _set_weights(self.policy, state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.loss_fn.load_state_dict(state["objective_state"])
        self.problem_generator.set_state(state["problem_rng"])
        self.sample_generator.set_state(state["sample_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.snapshots.clear()
        self.snapshots.extend(state["snapshots"])
        self.layers.load_state_dict(state["layers"])
        self.steps_done = state["step"]


def _weights(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.trainable_parameters()]


def _set_weights(policy, weights: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, w in zip(policy.trainable_parameters(), weights, strict=True):
            p.copy_(w)
