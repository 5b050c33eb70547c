"""The trainer's tests: one torch thread (``torch_threads``) and the shared warm-start cache (``quick_regimes``)."""

from torch_threads import one_torch_thread  # noqa: F401  (autouse)

from quick_regimes import cache  # noqa: F401  (a fixture)
