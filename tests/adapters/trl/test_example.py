"""examples/trl_grpo_stapo.py and its single-GPU variant cannot rot: the docs page shows both verbatim, and
their configs and trainers train a step.

The example's model, dataset and reward need a GPU, the hub and math-verify; here the tiny model,
the in-memory dataset and the reward in code replace them, and the hardware flags of its config
are switched to CPU (no vLLM, no bf16). Everything else is the example's own code.
"""

import importlib.util
import re
import sys
import warnings
from pathlib import Path

from trl_tiny import dataset, length_reward, tiny_model, tokenizer

ROOT = Path(__file__).parents[3]
EXAMPLE = ROOT / "examples" / "trl_grpo_stapo.py"
SINGLE_GPU = ROOT / "examples" / "trl_grpo_stapo_1gpu.py"
PAGE = ROOT / "docs" / "adapters" / "trl.md"
CPU = dict(
    use_vllm=False,
    use_cpu=True,
    bf16=False,
    activation_checkpointing=False,
    per_device_train_batch_size=4,
    num_generations=4,
    gradient_accumulation_steps=2,
    max_completion_length=8,
    max_steps=1,
    save_strategy="no",
    learning_rate=1e-2,
    disable_tqdm=True,
)


def load_example(path=EXAMPLE):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_page_shows_the_example_verbatim():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert EXAMPLE.read_text() in blocks
    assert SINGLE_GPU.read_text() in blocks


def test_the_single_gpu_example_trains(tmp_path, monkeypatch):
    """``python examples/trl_grpo_stapo_1gpu.py`` puts examples/ first on sys.path, where it finds the main example."""
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    monkeypatch.delitem(sys.modules, "trl_grpo_stapo", raising=False)
    example = load_example(SINGLE_GPU)
    assert example.MODEL == "Qwen/Qwen2.5-0.5B-Instruct"
    args = example.make_single_gpu_config(str(tmp_path), use_cpu=True, bf16=False)  # bf16 needs the GPU
    # one process: 8 prompts x 8 completions per optimizer step, vLLM colocated; the loss flags are the main example's
    assert (args.per_device_train_batch_size * args.gradient_accumulation_steps, args.num_generations) == (64, 8)
    assert (args.use_vllm, args.vllm_mode, args.loss_type, args.delta) == (True, "colocate", "dapo", 10.0)
    cpu = {**CPU, "gradient_accumulation_steps": 2}
    args = example.make_single_gpu_config(str(tmp_path), **cpu)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="RlstabGRPOTrainer")
        trainer = example.build_trainer(
            tiny_model(sharpen=8.0), dataset(), args, reward_funcs=length_reward, processing_class=tokenizer()
        )
    assert trainer.rlstab_objective.name == "stapo"
    trainer.train()
    assert "rlstab/mask/s2t/silenced" in trainer.state.log_history[0]


def test_the_example_config_agrees_with_the_objective_and_trains(tmp_path):
    example = load_example()
    args = example.make_config(str(tmp_path), **CPU)
    assert (args.loss_type, args.epsilon, args.epsilon_high, args.delta, args.beta) == (
        "dapo",
        0.2,
        0.28,
        10.0,
        0.0,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="RlstabGRPOTrainer")  # no flag contradicts the objective
        trainer = example.build_trainer(
            tiny_model(sharpen=8.0), dataset(), args, reward_funcs=length_reward, processing_class=tokenizer()
        )
    assert trainer.rlstab_objective.name == "stapo"
    assert trainer.rlstab_step_statistics == "optimizer_step"
    trainer.train()
    logged = trainer.state.log_history[0]
    assert "rlstab/mask/s2t/silenced" in logged and "rlstab/mask/s2t/entropy_threshold" in logged
