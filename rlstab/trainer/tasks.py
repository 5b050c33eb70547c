"""Synthetic, verifiable tasks for the demo: arithmetic with a short chain of thought.

A task is generated in code, so the demo needs no data set, and its reward is exact: the text
after the response's last ``:`` must equal the answer. Each task also writes the response a
careful solver would give (:meth:`Task.demonstration`), which the supervised warm start imitates
before RL begins. The chain of thought gives RL something to shape: a response can get a digit
sum or a carry wrong and so the final answer, and the probability of each such token is what
the token masks (STAPO's S2T, 20-Entropy's quantile) look at.

``add2`` (the default) is ``"47+38="`` -> ``"7+8=15,4+3+1=8:85"``, digit by digit from the right
with the carry written out. ``add3`` is the same with three digits (a longer chain, more places
to go wrong), ``mul2`` multiplies two 2-digit numbers through two partial products
(``"47*38="`` -> ``"47*8=376,47*30=1410:1786"``), which a 1M-parameter model finds much harder.
``add1`` is single-digit addition answered directly (``"7+8="`` -> ``"15"``): the task a small
pretrained LM (``--model smollm2``) partly solves from a few examples, where it fails at ``add2``.
``perm3`` has many right answers: ``"471="`` -> any ordering of the digits 4, 7 and 1 (``"147"``,
``"714"``, ...), the task where a policy's entropy is worth something (``rlstab.trainer.passk``).
``perm3-echo`` is ``perm3`` followed by an echo of the prompt that the reward does not read
(``"471="`` -> ``"147,471"``): tokens predicted with confidence and never scored, where a rare slip in
a rewarded response is what STAPO calls a spurious token.

Held-out problems are a fixed tenth of each task's problem space (by a stable hash of the
prompt), so the held-out accuracy measures problems that neither the warm start nor RL trained on.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass
from typing import Protocol

from rlstab.lazy import torch

# Every character any task writes. One shared alphabet keeps the codec (and so a warm-started
# model's vocabulary) the same for every task.
ALPHABET = "0123456789+*=,:"


@dataclass(frozen=True)
class Problem:
    """One prompt and the exact answer its response must end with (after the last ``:``)."""

    prompt: str
    answer: str


class Task(Protocol):
    """A verifiable task: problems, their exact-match reward and a demonstration response."""

    name: str
    description: str
    max_new_tokens: int
    """Enough tokens for the longest demonstration plus its EOS, with a little room to spare."""

    def problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        """``n`` random problems, drawn only from ``generator`` (so a seed fixes them)."""
        ...

    def reward(self, problem: Problem, response_text: str) -> float:
        """1.0 when the response's final answer is exactly right, else 0.0."""
        ...

    def demonstration(self, problem: Problem) -> str:
        """The response the warm start trains on (without EOS; the codec adds it)."""
        ...


class CharCodec:
    """One token per character of :data:`ALPHABET`, plus padding and end-of-sequence.

    Implements ``rlstab.trainer.policy.Codec``. Ids: ``pad_id = 0``, ``eos_id = 1``, then the
    alphabet in order.
    """

    pad_id = 0
    eos_id = 1

    def __init__(self, alphabet: str = ALPHABET):
        self.alphabet = alphabet
        self._ids = {c: i + 2 for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 2

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} is not in the demo's alphabet {self.alphabet!r}") from None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i - 2] for i in ids if i >= 2)

    def token_text(self, token_id: int) -> str:
        if token_id == self.eos_id:
            return "<eos>"
        if token_id == self.pad_id:
            return "<pad>"
        return self.alphabet[token_id - 2]


def final_answer(response_text: str) -> str | None:
    """The text after the last ``:``, or None when there is none."""
    head, sep, tail = response_text.rpartition(":")
    return tail if sep else None


def _digits_right_to_left(x: int, n: int) -> list[int]:
    return [(x // 10**i) % 10 for i in range(n)]


@dataclass(frozen=True)
class Addition:
    """``digits``-digit addition, worked digit by digit from the right with the carry written out."""

    digits: int = 2

    @property
    def name(self) -> str:
        return f"add{self.digits}"

    @property
    def description(self) -> str:
        return f"{self.digits}-digit addition with a digit-by-digit chain of thought"

    @property
    def max_new_tokens(self) -> int:
        # Per digit "9+9+1=19," (9 characters, the first has no carry), then ":" and the sum.
        return 9 * self.digits - 2 + 1 + (self.digits + 1) + 1 + 3

    def problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        low, high = 10 ** (self.digits - 1), 10**self.digits
        operands = torch.randint(low, high, (n, 2), generator=generator).tolist()
        return [Problem(f"{a}+{b}=", str(a + b)) for a, b in operands]

    def reward(self, problem: Problem, response_text: str) -> float:
        return float(final_answer(response_text) == problem.answer)

    def demonstration(self, problem: Problem) -> str:
        a, b = (int(x) for x in problem.prompt.rstrip("=").split("+"))
        steps, carry = [], 0
        for i, (da, db) in enumerate(zip(_digits_right_to_left(a, self.digits), _digits_right_to_left(b, self.digits))):
            total = da + db + carry
            steps.append(f"{da}+{db}={total}" if i == 0 else f"{da}+{db}+{carry}={total}")
            carry = total // 10
        return ",".join(steps) + f":{a + b}"


@dataclass(frozen=True)
class Multiplication:
    """2-digit by 2-digit multiplication through two partial products: ``47*8=376,47*30=1410:1786``."""

    name: str = "mul2"
    description: str = "2-digit multiplication through two partial products"
    max_new_tokens: int = 30  # "99*9=891,99*90=8910:9801" is 24 characters, then EOS

    def problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        operands = torch.randint(10, 100, (n, 2), generator=generator).tolist()
        return [Problem(f"{a}*{b}=", str(a * b)) for a, b in operands]

    def reward(self, problem: Problem, response_text: str) -> float:
        return float(final_answer(response_text) == problem.answer)

    def demonstration(self, problem: Problem) -> str:
        a, b = (int(x) for x in problem.prompt.rstrip("=").split("*"))
        units, tens = b % 10, b // 10 * 10
        return f"{a}*{units}={a * units},{a}*{tens}={a * tens}:{a * b}"


@dataclass(frozen=True)
class DirectAddition:
    """Single-digit addition answered directly, with no chain of thought: ``"7+8="`` -> ``"15"``.

    The task for a small *pretrained* LM. SmolLM2-135M-Instruct, shown three solved examples in its
    chat prompt (``rlstab.trainer.smollm2``), answers a fifth to a quarter of these problems (measured
    on 64 random problems: 22% sampled at temperature 0.8, 30% greedy), while it gets 0-1% of
    ``add2`` and 0% of 2-digit sums answered directly. RL needs groups with both right and wrong
    answers, and only this task gives it many. The reward is exact match of the whole response,
    surrounding whitespace ignored (a tokenizer may put a space before the digits). The problem
    space is small (operands 1-9: 81 problems), so the held-out tenth is 13 problems.
    """

    name: str = "add1"
    description: str = "single-digit addition, the answer alone"
    max_new_tokens: int = 5  # "18", EOS, and room for a leading space token or two

    def problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        operands = torch.randint(1, 10, (n, 2), generator=generator).tolist()
        return [Problem(f"{a}+{b}=", str(a + b)) for a, b in operands]

    def reward(self, problem: Problem, response_text: str) -> float:
        return float(response_text.strip() == problem.answer)

    def demonstration(self, problem: Problem) -> str:
        return problem.answer


@dataclass(frozen=True)
class Permutation:
    """Any ordering of a 3-digit number's digits: ``"471="`` -> ``"147"``, ``"714"``, ``"471"``, ...

    A task with several right answers, where low entropy is not convergence but lost diversity: a
    prompt of three distinct digits has 3! = 6 right answers, one with a repeated digit 3, one of
    one digit thrice 1. A policy that collapses onto one ordering per prompt keeps its greedy
    accuracy and loses what pass@k over samples and the distinct right answers per prompt measure
    (``rlstab.trainer.passk``). The reward is 1.0 when the whole response (surrounding whitespace
    ignored) is the prompt's three digits in any order, else 0.0; ``Problem.answer`` holds the
    prompt's digits sorted (one right answer, for the record). Problems are the numbers 100-999
    (900 prompts, 90-odd held out). The warm start's demonstrations are drawn uniformly over the
    orderings each time a problem is drawn (:meth:`random_demonstration`), so the warm-started
    policy has entropy to lose.
    """

    name: str = "perm3"
    description: str = "any ordering of a 3-digit number's digits"
    max_new_tokens: int = 5  # 3 digits, EOS, and one more

    def problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        numbers = torch.randint(100, 1000, (n,), generator=generator).tolist()
        return [Problem(f"{x}=", "".join(sorted(str(x)))) for x in numbers]

    def reward(self, problem: Problem, response_text: str) -> float:
        return float("".join(sorted(response_text.strip())) == problem.answer)

    def answers(self, problem: Problem) -> frozenset[str]:
        """Every right answer to ``problem``: the distinct orderings of its digits."""
        return frozenset("".join(p) for p in itertools.permutations(problem.answer))

    def demonstration(self, problem: Problem) -> str:
        """The digits in the prompt's order (one right answer; the warm start draws :meth:`random_demonstration`)."""
        return problem.prompt.rstrip("=")

    def random_demonstration(self, problem: Problem, generator: torch.Generator) -> str:
        """One of the distinct orderings, uniformly (each with probability 1 / their number), drawn from ``generator``."""
        ordered = sorted(self.answers(problem))
        return ordered[int(torch.randint(len(ordered), (1,), generator=generator))]


@dataclass(frozen=True)
class PermutationEcho:
    """``perm3``, then an echo of the prompt that the reward does not read: ``"471="`` -> ``"147,471"``.

    The response is an ordering of the prompt's digits (the answer, as in :class:`Permutation`), a
    comma, and the prompt's three digits copied in their order (the echo). The reward is 1.0 when the
    text before the first comma (the whole response when it has none), surrounding whitespace
    ignored, is the prompt's digits in some order, else 0.0: the echo, and anything else after the
    comma, is never read, so ``"147,999"`` and ``"147"`` earn 1.0 and ``"14,471"`` earns 0.0.

    Why: spurious tokens by design. STAPO (arXiv 2602.15620) calls a token spurious when it has a
    low probability at a position of low entropy and a positive advantage, and its S2T mask
    silences those (``tau_p``, the entropy quantile). ``perm3``'s answer leaves little room for
    them: its first two digits are uncertain by design (high entropy) and a slip in the third makes
    the response wrong (negative advantage). The echo adds three positions the warm start learns
    to predict with confidence (a copy: low entropy) that no reward checks; sampled at temperature
    1.0, an occasional slip there (a digit of low probability) in a response whose answer is right
    gets the group's positive advantage, and is a spurious token by STAPO's definition. The answer
    comes before the echo, so a slip in the echo cannot change the reward.

    ``Problem.answer`` holds the prompt's digits sorted (as ``perm3``); problems, and the held-out
    split (98 of the 900 prompts), are ``perm3``'s. The warm start's demonstrations draw the
    ordering uniformly (:meth:`random_demonstration`), followed by the echo.
    """

    name: str = "perm3-echo"
    description: str = "any ordering of a 3-digit number's digits, then an unscored echo of the number"
    max_new_tokens: int = 9  # 3 digits, ",", 3 digits, EOS, and one more

    def problems(self, n: int, generator: torch.Generator) -> list[Problem]:
        return Permutation().problems(n, generator)

    def scored(self, response_text: str) -> str:
        """The part of a response the reward reads: the text before the first comma, whitespace stripped."""
        return response_text.partition(",")[0].strip()

    def reward(self, problem: Problem, response_text: str) -> float:
        return float("".join(sorted(self.scored(response_text))) == problem.answer)

    def answers(self, problem: Problem) -> frozenset[str]:
        """Every right answer (the part the reward reads): the distinct orderings of the prompt's digits."""
        return Permutation().answers(problem)

    def demonstration(self, problem: Problem) -> str:
        """The digits in the prompt's order, then the echo (the warm start draws :meth:`random_demonstration`)."""
        digits = problem.prompt.rstrip("=")
        return f"{digits},{digits}"

    def random_demonstration(self, problem: Problem, generator: torch.Generator) -> str:
        """One of the distinct orderings, uniformly (drawn from ``generator`` as ``perm3``'s), then the echo."""
        return f"{Permutation().random_demonstration(problem, generator)},{problem.prompt.rstrip('=')}"


def scored_text(task: Task, response_text: str) -> str:
    """What ``task``'s reward reads of a response: its ``scored`` part where it has one (``perm3-echo``'s answer,
    without the echo), else the whole response with surrounding whitespace stripped."""
    scored = getattr(task, "scored", None)
    return scored(response_text) if scored is not None else response_text.strip()


TASKS: dict[str, Task] = {
    t.name: t
    for t in (Addition(2), Addition(3), Multiplication(), DirectAddition(), Permutation(), PermutationEcho())
}


def task_names() -> tuple[str, ...]:
    return tuple(TASKS)


def get_task(name: str) -> Task:
    """The task called ``name`` (``add2``, ``add3``, ``mul2``, ``add1``, ``perm3``, ``perm3-echo``)."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}") from None


# ----------------------------------------------------------------------------- held-out split

HELD_OUT_MODULUS = 10  # one problem in ten is held out


def is_held_out(problem: Problem) -> bool:
    """Whether ``problem`` belongs to the held-out tenth of its task (a stable hash of the prompt)."""
    return zlib.crc32(problem.prompt.encode()) % HELD_OUT_MODULUS == 0


def training_problems(task: Task, n: int, generator: torch.Generator) -> list[Problem]:
    """``n`` problems for training (warm start or RL): the task's draws with held-out ones skipped."""
    out: list[Problem] = []
    while len(out) < n:
        out += [p for p in task.problems(n - len(out), generator) if not is_held_out(p)]
    return out


def held_out_problems(task: Task, n: int, seed: int = 1234) -> list[Problem]:
    """A fixed set of ``n`` distinct held-out problems (the same for every run of the task).

    Fewer than ``n`` only when the task has fewer distinct held-out problems (``add2`` has 800-odd).
    """
    generator = torch.Generator().manual_seed(seed)
    seen: dict[str, Problem] = {}
    for _ in range(200):
        for p in task.problems(max(n, 64), generator):
            if is_held_out(p) and p.prompt not in seen and len(seen) < n:
                seen[p.prompt] = p
        if len(seen) >= n:
            break
    return list(seen.values())
