"""The single-GPU example's reward file and dataset (examples/openrlhf-arithmetic) through OpenRLHF 0.11.2's own code.

The reward file is loaded by ``SingleTurnAgentExecutor``, as each vLLM engine loads a
``--reward.remote_url`` ending in ``.py``, and a response runs through its ``execute`` (with a
stand-in for the vLLM engine and a character tokenizer), so the reward reaches OpenRLHF's output
as OpenRLHF reads it: an exception in ``reward_func`` would be logged and leave the reward None.
The dataset's rows go through ``preprocess_data``, with the page's command's keys and chat template
switch. tests/docs/test_openrlhf_example.py checks the same files without OpenRLHF; test_launcher.py
runs the page's command through OpenRLHF's argument parser.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import openrlhf
import torch
from openrlhf.utils.agent import SingleTurnAgentExecutor

ROOT = Path(__file__).parents[3]
EXAMPLE = ROOT / "examples" / "openrlhf-arithmetic"
PAGE = ROOT / "docs" / "adapters" / "openrlhf.md"


def single_gpu_command() -> list[str]:
    blocks = re.findall(r"```bash\n(python -m rlstab\.adapters\.openrlhf .*?)```", PAGE.read_text(), re.S)
    return shlex.split(blocks[1].replace("\\\n", " "))[3:]


def option(arguments: list[str], name: str) -> str:
    return arguments[arguments.index(name) + 1]


def in_checkout(value: str) -> str:
    """``$PWD/examples/...`` (the command runs from the repository's root) in this checkout."""
    assert value.startswith("$PWD/"), value
    return str(ROOT / value.removeprefix("$PWD/"))


class CharTokenizer:
    """One token per character: what ``execute`` calls of a Hugging Face tokenizer."""

    def __call__(self, text, add_special_tokens=False, return_tensors="pt"):
        return {"input_ids": torch.tensor([[ord(c) for c in text]])}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(map(chr, ids))


class Engine:
    """Stands in for vLLM's engine: answers every prompt with ``response``."""

    def __init__(self, response: str):
        self.response = response

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        tokens = [ord(c) for c in self.response]
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, finish_reason="stop", logprobs=None)])


def test_openrlhfs_executor_loads_the_reward_file_and_rewards_responses():
    command = single_gpu_command()
    remote_url = in_checkout(option(command, "--reward.remote_url"))
    executor = SingleTurnAgentExecutor(remote_url.split(","))  # as train_ppo_ray splits the flag's value
    assert executor.reward_func is not None  # a .py file: loaded as a Python file, not called over HTTP
    prompt = "<|im_start|>user\nWhat is 49 * 4? Put the final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
    params = SimpleNamespace(max_tokens=64, logprobs=None)
    for response, reward in [("49 * 4 = 196: \\boxed{196}", 1.0), ("\\boxed{195}", 0.0), ("196", 0.0)]:
        output = asyncio.run(executor.execute(prompt, "196", params, max_length=1024, hf_tokenizer=CharTokenizer(),
                                              llm_engine=Engine(response)))
        # samples_generator: info["reward"] = torch.tensor([reward]); the scores, for dynamic filtering
        assert torch.tensor([output["reward"]]).tolist() == [reward], response
        assert torch.tensor([output["scores"]]).tolist() == [reward], response
        assert output["extra_logs"]["answered"].tolist() == [float(response != "196")]


def test_openrlhfs_preprocessing_reads_every_row_with_the_commands_keys():
    # openrlhf.datasets' __init__ imports Hugging Face's datasets, which this environment does not
    # install: its prompts_dataset module (OpenRLHF's own code, which imports neither) is loaded alone.
    path = Path(openrlhf.__file__).parent / "datasets" / "prompts_dataset.py"
    spec = importlib.util.spec_from_file_location("openrlhf_prompts_dataset", path)
    prompts_dataset = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prompts_dataset)

    command = single_gpu_command()
    assert "--data.apply_chat_template" in command
    chats = []

    def apply_chat_template(chat, tokenize, add_generation_prompt):  # the tokenizer's, recorded
        chats.append(chat)
        return f"<user>{chat[0]['content']}<assistant>"

    dataset = Path(in_checkout(option(command, "--data.prompt_dataset")))
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    assert len(rows) == 256
    for row in rows:
        prompt, label = prompts_dataset.preprocess_data(
            row, None, option(command, "--data.input_key"), option(command, "--data.label_key"), apply_chat_template)
        assert chats[-1] == [{"role": "user", "content": row["prompt"]}]  # a string prompt: the user's message
        assert (prompt, label) == (f"<user>{row['prompt']}<assistant>", row["label"])
