"""The demo's tests: one torch thread (``torch_threads``)."""

from torch_threads import one_torch_thread  # noqa: F401  (autouse)
