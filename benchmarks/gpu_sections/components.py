"""Whether rlstab's own components are registered, which the loss, profile and presets sections need.

rlstab registers its components (advantages, masks, ...) from the ``rlstab.components`` entry
points of its installed distribution. A checkout put first on ``sys.path`` but never installed has
none: every objective then fails to validate ("no advantage kind is registered"). The command asks
once, before those sections, and marks each of them failed with ``NOT_INSTALLED`` rather than
letting every row fail with the same error.
"""

from __future__ import annotations

from rlstab.registry import registrations

SECTIONS = ("loss", "profile", "presets")  # the sections that build rlstab objectives
NOT_INSTALLED = (
    "failed: rlstab's components are not registered (its entry points are missing): install the checkout "
    "first, `pip install --no-deps -e .` in its root (or pip install its wheel)"
)


def registered() -> bool:
    """Whether any component of the ``rlstab`` distribution is registered."""
    return any(r.distribution == "rlstab" for r in registrations())
