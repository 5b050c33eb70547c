"""Fixtures shared by the tests."""

import pytest

from batches import random_batch


@pytest.fixture
def make_batch():
    return random_batch
