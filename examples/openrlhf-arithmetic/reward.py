"""Reward of the OpenRLHF single-GPU example: 1.0 for the right final answer, else 0.0.

OpenRLHF 0.11.2 loads this file in each vLLM engine when ``--reward.remote_url`` names a ``.py``
file, and calls ``reward_func(queries, prompts, labels)`` for each response: ``queries`` holds the
prompt and the response decoded together (special tokens kept), ``prompts`` the prompt as the chat
template wrote it, ``labels`` the dataset's ``--data.label_key`` value (here the answer, an integer).

The final answer is the content of the response's last ``\\boxed{...}`` (the prompts ask for one).
The reward is 1.0 when it is the label's integer (spaces, thousands separators and a final period
ignored: ``\\boxed{1,234.}`` is 1234), and 0.0 otherwise, or without a ``\\boxed{}``.
"""

from __future__ import annotations

import re

import torch

BOXED = "\\boxed{"
INTEGER = re.compile(r"[+-]?\d+")


def final_answer(response: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``response``, or None (none, or never closed)."""
    start = response.rfind(BOXED)
    if start < 0:
        return None
    depth = 1
    for i in range(start + len(BOXED), len(response)):
        depth += {"{": 1, "}": -1}.get(response[i], 0)
        if depth == 0:
            return response[start + len(BOXED) : i]
    return None  # cut off by the length limit


def as_integer(answer: str | None) -> int | None:
    """``answer`` as an integer: ``" 1,234."`` is 1234, ``"-7"`` is -7; None if it is not one."""
    if answer is None:
        return None
    text = re.sub(r"\s|\\,|,", "", answer).removesuffix(".")
    return int(text) if INTEGER.fullmatch(text) else None


def answer_of(query: str, prompt: str) -> int | None:
    """The final answer of the response in ``query`` (the prompt, then the response), as an integer."""
    response = query[len(prompt) :] if query.startswith(prompt) else query  # the prompt's \boxed{} is empty
    return as_integer(final_answer(response))


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict:
    """OpenRLHF's entry point: a reward per query (1.0 if its final answer is the label), as a float
    tensor; also the score ``--algo.dynamic_filtering`` reads, and the share of responses with an
    integer answer, logged as ``answered``."""
    answers = [answer_of(query, prompt) for query, prompt in zip(queries, prompts)]
    rewards = torch.tensor([float(a is not None and a == int(label)) for a, label in zip(answers, labels)])
    answered = torch.tensor([float(a is not None) for a in answers])
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"answered": answered}}
