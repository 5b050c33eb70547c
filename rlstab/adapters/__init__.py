"""Trainer adapters (veRL, OpenRLHF, TRL), one skeleton each.

Every adapter folder has the same parts under the same names: ``inputs`` (the one place the
trainer's tensors become a [`TokenBatch`][rlstab.TokenBatch]), ``counts`` (the trainer's counts as
the step's denominators), ``step_scope`` (step-wide statistics), ``loss``, ``config`` (start-up
checks, torch-free), ``checkpoint`` and ``metrics``. What all three do is written once here:
``global_counts``, ``prepared_step``, ``trainers`` (what each trainer supplies: read by the start-up checks
and by ``rlstab validate --trainer``), ``trainer_parts``, ``placement`` (``rlstab explain``'s "where each part
runs"), ``state_file``, ``optimizer_steps`` and ``post_import``. Each adapter imports its trainer lazily, so ``import rlstab`` never pulls a
trainer in. The docs page "Writing an adapter" describes each part.
"""
