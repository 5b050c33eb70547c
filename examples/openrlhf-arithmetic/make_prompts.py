"""Writes prompts.jsonl, the dataset of the OpenRLHF single-GPU example: 256 arithmetic questions.

    python examples/openrlhf-arithmetic/make_prompts.py

Each line is ``{"prompt": ..., "label": ...}`` (the command's ``--data.input_key prompt
--data.label_key label``): a question that asks for the answer in ``\\boxed{}``, and the answer,
an integer, as reward.py reads it. Three kinds in turn: a sum of two 3-digit numbers, a 2-digit
number times a digit, and that product less a 3-digit number (negative answers included). Seeded:
the same file each time.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PROMPTS = Path(__file__).with_name("prompts.jsonl")
COUNT = 256
SEED = 0
INSTRUCTION = "Put the final answer within \\boxed{}."


def questions(count: int = COUNT, seed: int = SEED) -> list[dict[str, str]]:
    """``count`` rows, from ``random.Random(seed).random()`` alone (the one sequence Python keeps across versions)."""
    rng = random.Random(seed)

    def pick(low: int, high: int) -> int:
        return low + int(rng.random() * (high - low + 1))

    rows = []
    for i in range(count):
        if i % 3 == 0:
            a, b = pick(100, 999), pick(100, 999)
            question, answer = f"What is {a} + {b}?", a + b
        elif i % 3 == 1:
            a, b = pick(12, 99), pick(3, 9)
            question, answer = f"What is {a} * {b}?", a * b
        else:
            a, b, c = pick(12, 99), pick(3, 9), pick(100, 999)
            question, answer = f"What is {a} * {b} - {c}?", a * b - c
        rows.append({"prompt": f"{question} {INSTRUCTION}", "label": str(answer)})
    return rows


def text(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    PROMPTS.write_text(text(questions()))
    print(f"{PROMPTS}: {COUNT} prompts")
