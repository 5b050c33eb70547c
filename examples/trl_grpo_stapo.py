"""GRPO with the STAPO objective in TRL 1.16: a complete training script.

Everything is TRL's (generation with vLLM, rewards, advantages, accumulation, DDP/DeepSpeed,
logging) except the policy loss, which is rlstab's ``stapo`` preset: the DAPO surrogate
(clip 0.2 / 0.28, dual-clip 10) with the S2T mask, divided by the number of kept tokens.

    pip install "rlstab[trl]" vllm math-verify
    accelerate launch --num_processes 8 examples/trl_grpo_stapo.py

Every rlstab metric is logged next to TRL's, e.g. ``rlstab/mask/s2t/silenced`` (tokens the mask
silenced per micro-batch) and ``rlstab/mask/s2t/entropy_threshold``.
"""

from __future__ import annotations

from datasets import load_dataset
from trl import GRPOConfig
from trl.rewards import accuracy_reward

from rlstab.adapters.trl import RlstabGRPOTrainer

MODEL = "Qwen/Qwen3-1.7B-Base"
DATASET = "trl-lib/DeepMath-103K"  # columns: prompt (conversational), solution


def make_config(output_dir: str, **overrides) -> GRPOConfig:
    """The GRPOConfig of the run. Flags that shape the loss agree with the objective (no warnings)."""
    fields = dict(
        output_dir=output_dir,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        per_device_train_batch_size=8,
        gradient_accumulation_steps=4,  # optimizer step = 8 x 4 x processes completions
        num_generations=8,
        max_completion_length=4096,
        temperature=1.0,
        top_p=1.0,
        # The policy loss is the objective's. These are its values, stated so that TRL's own
        # bookkeeping and reports agree; rlstab warns where a changed flag contradicts it.
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        delta=10.0,
        beta=0.0,  # no KL (STAPO, DAPO); a kl regulariser in the objective needs beta = its coef
        use_vllm=True,
        vllm_mode="colocate",
        logging_steps=1,
        save_steps=100,
        report_to="none",
    )
    fields.update(overrides)
    return GRPOConfig(**fields)


def build_trainer(
    model, train_dataset, args: GRPOConfig, reward_funcs=accuracy_reward, processing_class=None
):
    """The trainer: TRL's GRPOTrainer arguments plus the objective."""
    return RlstabGRPOTrainer(
        objective="stapo",  # or a YAML path, or {"extends": "stapo", "masks": [...]}
        # S2T's entropy threshold over the whole optimizer step and all processes, at the cost
        # of one extra no-grad forward pass per step; "data_parallel" (the default) skips it.
        step_statistics="optimizer_step",
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=train_dataset,
        processing_class=processing_class,
    )


def main() -> None:
    dataset = load_dataset(DATASET, split="train")
    trainer = build_trainer(MODEL, dataset, make_config("qwen3-1.7b-stapo"))
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
