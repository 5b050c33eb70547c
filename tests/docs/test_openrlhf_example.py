"""The OpenRLHF single-GPU example's files (examples/openrlhf-arithmetic): what docs/adapters/openrlhf.md says.

The reward function on hand-made responses, the dataset with the keys the page's command names, the
file shown verbatim. OpenRLHF is not installed here: tests/adapters/openrlhf/test_example.py runs the
same files through OpenRLHF 0.11.2's own loader and dataset code, and test_launcher.py the command
through its argument parser.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "openrlhf-arithmetic"
PAGE = (ROOT / "docs" / "adapters" / "openrlhf.md").read_text()


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"openrlhf_example_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def single_gpu_command() -> dict[str, str | None]:
    """The page's single-GPU launcher command, flag -> value (None for a switch)."""
    blocks = re.findall(r"```bash\n(python -m rlstab\.adapters\.openrlhf .*?)```", PAGE, re.S)
    words = shlex.split(blocks[1].replace("\\\n", " "))[3:]
    flags: dict[str, str | None] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            flags[word] = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
    return flags


def example_path(value: str) -> Path:
    """A path of the command (``$PWD/examples/...``, run from the repository's root) in this checkout."""
    assert value.startswith("$PWD/examples/"), value
    return ROOT / value.removeprefix("$PWD/")


# (query, prompt, label, reward): the query is the prompt, then the response, as OpenRLHF decodes it.
PROMPT = "<|im_start|>user\nWhat is 49 * 4? Put the final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
CASES = [
    (PROMPT + "49 * 4 = 196, so the answer is \\boxed{196}.<|im_end|>", PROMPT, "196", 1.0),
    (PROMPT + "\\boxed{195}<|im_end|>", PROMPT, "196", 0.0),  # wrong
    (PROMPT + "The answer is 196.<|im_end|>", PROMPT, "196", 0.0),  # no \boxed{}: the prompt's empty one is not read
    (PROMPT + "First \\boxed{200}, no: \\boxed{196}", PROMPT, "196", 1.0),  # the last one counts
    (PROMPT + "\\boxed{196", PROMPT, "196", 0.0),  # cut off by the length limit
    (PROMPT + "\\boxed{ 1,641. }", PROMPT, "1641", 1.0),  # separators and a final period ignored
    (PROMPT + "\\boxed{1\\,641}", PROMPT, "1641", 1.0),  # LaTeX's thin space
    (PROMPT + "\\boxed{-525}", PROMPT, "-525", 1.0),
    (PROMPT + "\\boxed{\\frac{392}{2}}", PROMPT, "196", 0.0),  # not an integer: no answer
    ("a decoding that changed the prompt \\boxed{196}", PROMPT, "196", 1.0),  # the whole query is read then
]


def test_the_reward_function_scores_hand_made_responses():
    reward = load("reward")
    queries, prompts, labels, expected = map(list, zip(*CASES))
    out = reward.reward_func(queries, prompts, labels)
    assert out["rewards"].dtype == torch.float32 and out["rewards"].tolist() == expected
    assert out["scores"].tolist() == expected
    # answered: a \boxed{} with an integer in it (the third, fifth and ninth have none)
    assert out["extra_logs"]["answered"].tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    # OpenRLHF calls it with one query at a time: a 1-element tensor each
    assert reward.reward_func(queries[:1], prompts[:1], labels[:1])["rewards"].tolist() == [1.0]


def test_the_command_names_the_examples_files_and_their_keys():
    command = single_gpu_command()
    reward, dataset = (example_path(command[f]) for f in ("--reward.remote_url", "--data.prompt_dataset"))
    assert reward == EXAMPLE / "reward.py" and dataset == EXAMPLE / "prompts.jsonl"
    assert "--data.apply_chat_template" in command  # a string prompt becomes the user's message
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    input_key, label_key = command["--data.input_key"], command["--data.label_key"]
    assert all(set(row) == {input_key, label_key} for row in rows)
    assert all(isinstance(row[input_key], str) and "\\boxed{}" in row[input_key] for row in rows)
    assert all(re.fullmatch(r"-?\d+", row[label_key]) for row in rows)
    # each row's label is its question's answer: "What is a + b?", "What is a * b?", "What is a * b - c?"
    for row in rows:
        question = re.fullmatch(r"What is ([\d +*-]+)\? Put the final answer within \\boxed\{\}\.", row[input_key])
        a, *rest = re.split(r" ([+*-]) ", question[1])
        value = int(a)
        for op, number in zip(rest[::2], rest[1::2]):
            value = {"+": value + int(number), "*": value * int(number), "-": value - int(number)}[op]
        assert row[label_key] == str(value), row
    # the page's numbers: 256 prompts in rollouts of --rollout.batch_size 16 make 16 rollouts, each of
    # 16 x 8 = 128 responses in optimizer steps of 64: 2 per rollout, 32 in the one episode
    prompts, per_rollout = len(rows), int(command["--rollout.batch_size"])
    steps = prompts // per_rollout * per_rollout * int(command["--rollout.n_samples_per_prompt"]) // int(
        command["--train.batch_size"])
    assert (command["--train.num_episodes"], prompts // per_rollout, steps) == ("1", 16, 32)
    assert f"the {prompts} prompts make {prompts // per_rollout} rollouts, {steps} optimizer steps, in the one episode" in (
        " ".join(PAGE.split()))


def test_the_dataset_is_what_make_prompts_writes():
    make_prompts = load("make_prompts")
    assert make_prompts.text(make_prompts.questions()) == (EXAMPLE / "prompts.jsonl").read_text()
    shown = re.search(r'`(\{"prompt": .*?\})`', PAGE)[1]  # the page's example line is one of the file's
    assert shown in (EXAMPLE / "prompts.jsonl").read_text().splitlines()


def test_the_page_shows_the_reward_file_verbatim():
    (shown,) = re.findall(r"```python\n# examples/openrlhf-arithmetic/reward\.py\n(.*?)```", PAGE, re.S)
    assert shown == (EXAMPLE / "reward.py").read_text()


@pytest.mark.parametrize("label", ["196", 196], ids=["string", "number"])
def test_a_label_may_be_a_json_number(label):
    """A dataset of one's own may write the label as a number: OpenRLHF passes it as it is."""
    out = load("reward").reward_func([PROMPT + "\\boxed{196}"], [PROMPT], [label])
    assert out["rewards"].tolist() == [1.0]
