"""The embedded trainer's knobs, declared once: ``rlstab demo``'s flags, the lab's regimes and ``Run`` read them here.

``TrainerSettings`` are the knobs of how the trainer runs (a lab regime sets any of them);
``TrainConfig`` adds the run's length and seed. Defaults are the default ``rlstab demo`` run,
tuned on ``add2`` so that held-out accuracy rises under grpo on every seed tried (0-3: from
20-31% to 46-83% in 100 steps) within a few minutes on two cores. Adam at 3e-4 undoes the warm
start within 15 steps; temperature 0.8 rather than 1 gives more groups with a correct sample.

Imports pydantic only: ``rlstab``'s parser reads the defaults without loading torch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_STEPS = 100_000
"""The most RL steps of a run (``TrainConfig.steps``; also the widest ``eval_every``): days on the embedded trainer."""
MAX_SEED = 999_999
"""The largest seed (``TrainConfig.seed``): below a million a run's generators stay apart (``rlstab.trainer.passk.sample_seed``)."""


class TrainerSettings(BaseModel):
    """How the embedded trainer runs: every knob but the run's length and seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(3e-5, gt=0, le=1, allow_inf_nan=False)
    """Adam's learning rate."""
    updates_per_step: int = Field(2, ge=1, le=64)
    """Optimizer updates per rollout batch (mini-batches of whole groups): more is further off-policy."""
    policy_lag: int = Field(0, ge=0, le=64)
    """Rollouts are sampled by the policy this many steps behind (an asynchronous trainer's staleness)."""
    temperature: float = Field(0.8, gt=0, le=10, allow_inf_nan=False)
    """Sampling temperature."""
    group_size: int = Field(8, ge=2, le=256)
    """Responses per prompt (one GRPO group)."""
    prompts_per_step: int = Field(16, ge=1, le=1024)
    """Prompts (groups) per RL step."""
    micro_batch_size: int = Field(32, ge=1, le=4096)
    """Responses per micro-batch."""
    max_grad_norm: float = Field(1.0, gt=0, le=1e9, allow_inf_nan=False)
    """Gradient clipping: the largest gradient norm (1e9: in effect none)."""
    eval_every: int = Field(5, ge=1, le=100_000)
    """Held-out accuracy every this many steps, and at the last."""
    eval_size: int = Field(256, ge=1, le=4096)
    """Held-out problems for accuracy."""
    warmup_steps: int | None = Field(None, ge=0, le=100_000)
    """Supervised warm-start steps of the tiny model (None: the task's default); with ``warm_start_band``, the most."""
    warm_start_band: tuple[float, float] | None = None
    """``(low, high)``: warm-start each seed until its held-out accuracy lies in this band
    (``rlstab.trainer.calibration``'s band rule); None: a fixed number of steps."""
    pass_k: int = Field(0, ge=0, le=1024)
    """Held-out pass@k besides greedy accuracy at every evaluation (``rlstab.trainer.passk``); 0: off."""
    pass_samples: int = Field(16, ge=1, le=1024)
    """Samples per held-out problem for pass@k (``n`` of the estimator; at least ``pass_k``)."""
    instruments: bool = False
    """Measure each step's mechanism (``rlstab.trainer.mechanism``: gradient shares of the masks, logit-gradient
    norms against p and H) into its row's ``mechanism`` field, without changing training; off by default."""

    @model_validator(mode="after")
    def _pass_and_band(self):
        if self.pass_k > self.pass_samples:
            raise ValueError(f"pass_k ({self.pass_k}) needs at least as many pass_samples ({self.pass_samples})")
        band = self.warm_start_band
        if band is not None and not 0.0 <= band[0] <= band[1] <= 1.0:
            raise ValueError(f"warm_start_band is (low, high) with 0 <= low <= high <= 1, not {list(band)}")
        return self


class TrainConfig(TrainerSettings):
    """One run's settings: the trainer's knobs, its number of RL steps and its seed."""

    steps: int = Field(100, ge=1, le=100_000)
    """RL steps."""
    seed: int = Field(0, ge=0, le=999_999)
    """Seed of the warm start, the problems, the sampling and torch's global stream."""
