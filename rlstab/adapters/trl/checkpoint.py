"""The objective's state in TRL's checkpoints (``rlstab_state.pt``), saved and restored with them.

Stateful components (STARE's controller, BAPO's bounds) keep their state in the compiled
objective. ``Trainer._save_checkpoint`` writes the model, the optimizer, the scheduler and the RNG
into ``<output_dir>/checkpoint-<step>``; the state file goes beside them
([`write_state`][rlstab.adapters.state_file.write_state], as the veRL adapter writes it), from the
process that saves (``args.should_save``). On resume, ``Trainer._load_optimizer_and_scheduler``
reads the optimizer and scheduler from that folder, and the state is read back with them. A
checkpoint without the file (saved by a run without rlstab's loss, or an objective without state)
leaves the components' state as it is.
"""

from __future__ import annotations

import os

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from rlstab.adapters.state_file import read_state, state_path, write_state


def save_state(trainer, trial) -> None:
    """Write the objective's state into the checkpoint folder TRL has just saved."""
    if not trainer.args.should_save:
        return
    folder = os.path.join(trainer._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
    write_state(trainer.rlstab_compiled.state_dict(), folder)


def load_state(trainer, checkpoint: str | None) -> None:
    """Restore the objective's state saved in ``checkpoint`` (a checkpoint folder), if it holds one."""
    if checkpoint is not None and os.path.exists(state_path(checkpoint)):
        trainer.rlstab_compiled.load_state_dict(read_state(state_path(checkpoint)))


class ComponentStateCheckpoints:
    """Mixed into a TRL trainer (before it): its checkpoints carry the objective's state, and a resume restores it."""

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint, plus the state of stateful components (``rlstab_state.pt``), if any."""
        super()._save_checkpoint(model, trial)
        save_state(self, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """Resuming: TRL's optimizer and scheduler, then the components' state saved beside them."""
        super()._load_optimizer_and_scheduler(checkpoint)
        load_state(self, checkpoint)
