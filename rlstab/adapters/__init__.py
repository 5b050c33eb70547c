"""Trainer adapters (veRL, OpenRLHF, TRL).

Each adapter maps its trainer's tensors onto [`TokenBatch`][rlstab.TokenBatch] in exactly one place and
imports its trainer lazily, so ``import rlstab`` never pulls a trainer in.
"""
