"""Knowing when a new optimizer step begins, so stateful components advance once per step.

verl and OpenRLHF call the policy loss once per micro-batch and give it no step index. Stateful components
(STARE's controller, BAPO's bounds) must advance once per optimizer step, so the adapter counts
optimizer steps with torch's global optimizer post-step hook (a public torch API that sees every
``optimizer.step()`` in the process, including FSDP's and DeepSpeed's inner optimizer) and advances state on the first loss call
after each one.
"""

from __future__ import annotations

_steps = 0
_handle = None


def _count(optimizer, args, kwargs) -> None:
    global _steps
    _steps += 1


def steps_taken() -> int:
    """Optimizer steps taken in this process since the hook was installed (installs it on first use)."""
    global _handle
    if _handle is None:
        # A submodule torch.optim does not expose as an attribute: imported by name, here, at first use.
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _handle = register_optimizer_step_post_hook(_count)
    return _steps


class StepTracker:
    """True on the first call after each optimizer step (and on the very first call)."""

    def __init__(self) -> None:
        self._seen: int | None = None

    def first_call_of_step(self) -> bool:
        now = steps_taken()
        first = now != self._seen
        self._seen = now
        return first
