import pytest


@pytest.fixture
def cache(tmp_path_factory):
    """One warm-start cache for every lab test of the session (the quick regimes' warm starts)."""
    return tmp_path_factory.getbasetemp() / "lab-warmstart-cache"
