"""examples/trl_grpo_stapo.py cannot rot: the docs page shows it verbatim, and its config and trainer train a step.

The example's model, dataset and reward need a GPU, the hub and math-verify; here the tiny model,
the in-memory dataset and the reward in code replace them, and the hardware flags of its config
are switched to CPU (no vLLM, no bf16). Everything else is the example's own code.
"""

import importlib.util
import re
import warnings
from pathlib import Path

from trl_tiny import dataset, length_reward, tiny_model, tokenizer

ROOT = Path(__file__).parents[3]
EXAMPLE = ROOT / "examples" / "trl_grpo_stapo.py"
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


def load_example():
    spec = importlib.util.spec_from_file_location("trl_grpo_stapo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_page_shows_the_example_verbatim():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert EXAMPLE.read_text() in blocks


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
