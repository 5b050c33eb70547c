"""The launcher: objectives validated before Ray starts; OpenRLHF's own entry point and ray.init, with rlstab's hook."""

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlstab.adapters.openrlhf.config import OBJECTIVE_ENV, STEP_STATISTICS_ENV, objective_from_env
from rlstab.adapters.openrlhf.hook import SETUP_HOOK
from rlstab.adapters.openrlhf.launcher import runtime_env_with_rlstab

from openrlhf_gpu_stubs import subprocess_env, write_stubs

PAGE = Path(__file__).parents[3] / "docs" / "adapters" / "openrlhf.md"
OPENRLHF_ARGS = ["--actor.model_name_or_path", "Qwen/Qwen3-8B-Base", "--reward.remote_url", "/r.py"]


def launch(args, tmp_path, timeout=120):
    """``python -X importtime -m rlstab.adapters.openrlhf ARGS``: rc, stderr, modules imported, seconds."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlstab.adapters.openrlhf", *args],
                          env=subprocess_env(), cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    messages = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    return proc.returncode, messages, imported, time.monotonic() - start


def assert_stopped_before_ray(imported):
    assert "rlstab.adapters.openrlhf.launcher" in imported
    assert not {m for m in imported if m == "ray" or m.startswith(("ray.", "openrlhf", "deepspeed"))}


def test_bad_yaml_fails_before_ray_starts_with_path_and_value(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("extends: stapo\nsurrogate: {kind: ppo_clip, eps_hgh: 0.3}\n")
    rc, messages, imported, seconds = launch(["--objective", str(bad), *OPENRLHF_ARGS], tmp_path)
    assert rc == 2
    assert f"--objective -> {bad}: surrogate.eps_hgh: unknown field (value 0.3)" in messages
    assert_stopped_before_ray(imported)
    assert seconds < 60  # seconds on two shared cores; far less than a cluster start


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--objective", "stapoo"], "--objective: 'stapoo': neither a preset"),
        (["--objective", "stapo", "--objective-overrides", "{masks: [{kind: s2t, tau_p: -1}]}"],
         "masks[0].tau_p = -1"),
        (["--objective", "grpo", "--objective-overrides", "{aggregation: {kind: token-sum, count: valid}}"],
         "aggregation.kind = 'token-sum': not available in OpenRLHF"),
        (["--objective", "grpo", "--objective-overrides", "{regularisers: [{kind: kl, coef: 0.1}]}"],
         "regularisers[0] (kl): not available in OpenRLHF; OpenRLHF adds the KL loss itself: use --algo.kl.use_loss"),
        (["--objective", "stapo", "--step-statistics", "step"], "argument --step-statistics: invalid choice: 'step'"),
        (["--objective", "stapo", "--train.dynamic_batch_enable"],
         "rlstab: --step-statistics optimizer_step (the default) does not support --train.dynamic_batch_enable"),
    ],
    ids=["unknown-preset", "bad-override-value", "token-sum", "kl-regulariser", "bad-step-statistics",
         "dynamic-batch-step-wide"],
)
def test_unusable_objectives_fail_before_ray_starts(tmp_path, args, message):
    rc, messages, imported, _ = launch([*args, *OPENRLHF_ARGS], tmp_path)
    assert rc == 2
    assert message in messages
    assert_stopped_before_ray(imported)


def test_runtime_env_keeps_openrlhf_entries_and_adds_the_hook():
    theirs = {"env_vars": {"NCCL_DEBUG": "WARN"}, "working_dir": "."}
    env = runtime_env_with_rlstab(theirs, "name: x\n")
    assert env == {"env_vars": {"NCCL_DEBUG": "WARN", OBJECTIVE_ENV: "name: x\n"}, "working_dir": ".",
                   "worker_process_setup_hook": SETUP_HOOK}
    assert theirs == {"env_vars": {"NCCL_DEBUG": "WARN"}, "working_dir": "."}  # not modified
    local = runtime_env_with_rlstab(theirs, "name: x\n", "local")
    assert local["env_vars"] == {"NCCL_DEBUG": "WARN", OBJECTIVE_ENV: "name: x\n", STEP_STATISTICS_ENV: "local"}
    with pytest.raises(ValueError, match="already has worker_process_setup_hook='my.hook'"):
        runtime_env_with_rlstab({"worker_process_setup_hook": "my.hook"}, "name: x\n")


def documented_commands() -> list[list[str]]:
    """The page's launcher commands (the two-node run and the single-GPU one), after ``python -m rlstab.adapters.openrlhf``."""
    blocks = re.findall(r"```bash\n(python -m rlstab\.adapters\.openrlhf .*?)```", PAGE.read_text(), re.S)
    return [shlex.split(block.replace("\\\n", " "))[3:] for block in blocks]


def option(arguments: list[str], name: str) -> str:
    return arguments[arguments.index(name) + 1]


def test_the_single_gpu_command_is_one_gpu_and_its_steps_are_what_the_page_says():
    commands = documented_commands()
    assert len(commands) == 2
    single = commands[1]
    sizes = {name: option(single, name) for name in (
        "--actor.num_nodes", "--actor.num_gpus_per_node", "--vllm.num_engines", "--vllm.tensor_parallel_size")}
    assert set(sizes.values()) == {"1"} and "--train.colocate_all" in single
    assert option(single, "--actor.model_name_or_path") == "Qwen/Qwen2.5-0.5B-Instruct"
    prompts, n = int(option(single, "--rollout.batch_size")), int(option(single, "--rollout.n_samples_per_prompt"))
    step, micro = int(option(single, "--train.batch_size")), int(option(single, "--train.micro_batch_size"))
    said = (f"Each rollout is {prompts} prompts x {n} responses, trained in {prompts * n // step} optimizer steps of "
            f"{step} responses (micro-batches\nof {micro})")
    assert said in PAGE.read_text()


RECORD_RAY_INIT = """
import json, sys, ray
OUT = sys.argv[1]
def record(*args, **kwargs):  # stands in for starting a cluster: record the call, stop the run
    json.dump(kwargs, open(OUT, "w"))
    raise SystemExit(0)
ray.init = record
from rlstab.adapters.openrlhf.launcher import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize("which", [0, 1], ids=["two-nodes", "single-gpu"])
def test_documented_command_passes_openrlhfs_parser_and_starts_ray_with_the_hook(tmp_path, which):
    """The docs page's commands, through the real launcher and OpenRLHF's real train_ppo_ray __main__."""
    arguments = documented_commands()[which]
    assert arguments[:2] == ["--objective", "stapo"]
    out = tmp_path / "ray_init.json"
    env = subprocess_env(write_stubs(tmp_path / "stubs"))
    proc = subprocess.run([sys.executable, "-c", RECORD_RAY_INIT, str(out), *arguments], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # OpenRLHF parsed every flag and passed its own validation: it reached train() and its ray.init
    runtime_env = json.loads(out.read_text())["runtime_env"]
    assert runtime_env["worker_process_setup_hook"] == SETUP_HOOK
    env_vars = runtime_env["env_vars"]
    assert {"TOKENIZERS_PARALLELISM", "NCCL_DEBUG", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS"} <= set(env_vars)
    assert objective_from_env(env_vars).name == "stapo"
    assert env_vars[STEP_STATISTICS_ENV] == "optimizer_step"  # the default, carried to every worker

