"""Settings of the fuzz campaigns: the CI default, or ``LONG`` times as many examples with ``pytest --fuzz-long``.

Hypothesis writes nothing to disk (``database=None``) and has no deadline: the campaigns check
outcomes, never time. ``scale`` is set by tests/conftest.py before any test module is imported.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

LONG = 25
scale = 1


def fuzz_settings(max_examples: int, **kwargs) -> settings:
    """Hypothesis settings for a campaign of ``max_examples`` examples (times ``scale``)."""
    return settings(
        max_examples=max_examples * scale,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        **kwargs,
    )
