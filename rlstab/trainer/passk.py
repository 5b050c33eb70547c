"""Held-out pass@k and distinct right answers per prompt: what an entropy collapse destroys.

Greedy accuracy cannot see a collapse on a task with several right answers (``perm3``): a policy
that always writes one ordering per prompt keeps it. Sampling ``n`` responses per held-out prompt
(at the run's temperature) sees it twice:

- **pass@k**, the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models
  Trained on Code"): with ``c`` of the ``n`` samples right,
  ``pass@k = 1 - C(n - c, k) / C(n, k)`` (1 when ``n - c < k``), the probability that ``k``
  samples drawn without replacement from the ``n`` hold a right one; averaged over the prompts;
- **distinct_correct**: the number of different right responses among the ``n``, averaged over
  the prompts (at most the prompt's number of right answers, ``perm3``'s 6; 1 after a collapse).
  Responses are told apart by what the reward reads (``rlstab.trainer.tasks.scored_text``): two
  ``perm3-echo`` responses with the same answer and different echoes are one right answer.

The samples come from a generator of their own, seeded from the run's seed and the step
(:func:`sample_seed`), so measuring changes none of the run's random streams.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlstab.lazy import torch
from rlstab.trainer.loop import response_texts
from rlstab.trainer.policy import Policy
from rlstab.trainer.tasks import Problem, Task, scored_text


def pass_at_k(n: int, c: int, k: int) -> float:
    """``1 - C(n - c, k) / C(n, k)``: the chance that ``k`` of ``n`` samples, ``c`` of them right, hold a right one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, not n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def sample_seed(seed: int, step: int) -> int:
    """The pass@k generator's seed at ``step`` of a run from ``seed``: ``1_000_003 * (seed + 1) + step``
    (apart from the run's own streams, seeded ``seed`` and ``seed + 1``, for any seed below a million)."""
    return 1_000_003 * (seed + 1) + step


def measure(policy: Policy, task: Task, problems: Sequence[Problem], *, k: int, n: int, temperature: float,
            generator: torch.Generator, batch_size: int = 256) -> dict[str, float]:
    """``{"k", "n", "pass_at_k", "distinct_correct"}`` over ``problems``, from ``n`` samples of each."""
    if not problems:
        return {"k": k, "n": n, "pass_at_k": float("nan"), "distinct_correct": float("nan")}
    prompts = [p for p in problems for _ in range(n)]
    texts: list[str] = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            part = prompts[start : start + batch_size]
            rollout = policy.sample([policy.codec.encode(p.prompt) for p in part], max_new_tokens=task.max_new_tokens,
                                    temperature=temperature, generator=generator)
            texts += response_texts(policy, rollout)
    passes, distinct = [], []
    for i, problem in enumerate(problems):
        right = [t for t in texts[i * n : (i + 1) * n] if task.reward(problem, t) == 1.0]
        passes.append(pass_at_k(n, len(right), k))
        distinct.append(len({scored_text(task, t) for t in right}))
    return {"k": k, "n": n, "pass_at_k": sum(passes) / len(problems), "distinct_correct": sum(distinct) / len(problems)}
