"""GRPO with the STAPO objective in TRL 1.16 on one GPU: Qwen2.5-0.5B-Instruct, vLLM in the same process.

The loss, the data and the reward are those of trl_grpo_stapo.py (next to this file, imported from
it); only the model and the batch sizes change, for a single process:

    pip install "rlstab[trl]" vllm math-verify
    python examples/trl_grpo_stapo_1gpu.py
"""

from __future__ import annotations

from datasets import load_dataset
from trl import GRPOConfig
from trl_grpo_stapo import DATASET, build_trainer, make_config

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def make_single_gpu_config(output_dir: str, **overrides) -> GRPOConfig:
    """trl_grpo_stapo's config on one process: 8 prompts x 8 completions per optimizer step."""
    fields = dict(
        per_device_train_batch_size=8,
        gradient_accumulation_steps=8,  # optimizer step = 8 x 8 completions
        num_generations=8,
        max_completion_length=1024,
        vllm_gpu_memory_utilization=0.3,  # vLLM colocated: a third of the GPU, the rest for training
    )
    fields.update(overrides)
    return make_config(output_dir, **fields)


def main() -> None:
    dataset = load_dataset(DATASET, split="train")
    trainer = build_trainer(MODEL, dataset, make_single_gpu_config("qwen2.5-0.5b-stapo"))
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
