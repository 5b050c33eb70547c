"""The parts of an objective that only a trainer can execute, and what each adapter says when its trainer cannot.

The loss (masks, reweighters, surrogate, aggregation, regularisers) runs wherever the compiled
objective is called. The rest needs the trainer: the step's learning rate (``lr_scale``), each
response's own gradient (``advantage: opob``), which prompts are drawn (``sampler:``), how rollouts
are generated (``rollout:``), and branch rows in the batch (``dual_stream:``). rlstab's embedded
trainer executes all of them; an adapter refuses, at start-up, each one its trainer cannot.
"""

from __future__ import annotations

VERL_SAMPLER = (
    "trainer.use_v1=False data.custom_cls.path=pkg://rlstab.adapters.verl.sampler "
    "data.custom_cls.name=GoldilocksDataset data.dataloader_num_workers=0"
)


def unexecutable(objective, trainer: str, *, sampler_hook: bool = False) -> list[str]:
    """One problem line per part of ``objective`` that the adapter of ``trainer`` cannot execute."""
    problems = []
    if objective.lr_scale is not None:
        problems.append(
            f"lr_scale ({objective.lr_scale.kind}): the {trainer} adapter does not rescale the learning rate per step; "
            "remove lr_scale from the objective (rlstab's embedded trainer executes it)"
        )
    if objective.advantage.kind == "opob":
        problems.append(
            f"advantage (opob): needs each response's own gradient norm (TokenBatch.grad_sq_norms), which {trainer} "
            "does not compute (it backpropagates micro-batches, not single responses); use grpo here, or rlstab's "
            "embedded trainer"
        )
    if objective.sampler is not None and not sampler_hook:
        problems.append(
            f"sampler ({objective.sampler.kind}): {trainer} has no per-step data hook rlstab can fill; choose the "
            f"prompts before the trainer sees them, or use rlstab's embedded trainer or veRL ({VERL_SAMPLER})"
        )
    if objective.rollout is not None:
        problems.append(
            f"rollout ({objective.rollout.kind}): the {trainer} adapter cannot branch rollouts from pivots; use rlstab's "
            "embedded trainer, or veRL with the authors' agent loop (github AgentCombo/DEEP-GRPO, recipe/deep_grpo) "
            "feeding rlstab's loss through the Python API (TokenBatch.is_branch)"
        )
    if objective.dual_stream is not None:
        problems.append(
            f"dual_stream ({objective.dual_stream.kind}): {trainer}'s batches carry no branch rows "
            "(TokenBatch.is_branch); call the compiled objective from an agent loop that makes them, or use rlstab's "
            "embedded trainer"
        )
    return problems
