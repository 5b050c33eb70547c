"""Fixtures shared by the tests, and the ``--fuzz-long`` option of the fuzz campaigns."""

import os

import pytest
import torch

import fuzzing
from batches import random_batch

if not torch.cuda.is_available():  # before anything imports Triton: its kernels then run in its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        default=False,
        help=f"run every fuzz campaign (tests/fuzzing.py's fuzz_settings) with {fuzzing.LONG} times as many examples",
    )


def pytest_configure(config):
    # Before any test module is imported: the campaigns read fuzzing.scale when they are defined.
    if config.getoption("--fuzz-long"):
        fuzzing.scale = fuzzing.LONG


@pytest.fixture
def make_batch():
    return random_batch
