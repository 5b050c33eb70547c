"""The sections of ``benchmarks/gpu.py``, one module each, and what they share.

``benchmarks/gpu.py`` is the command; nothing here is run alone. ``common`` needs nothing but the
standard library (the command imports it before it checks that torch and rlstab's requirements
import); every other module imports torch and rlstab at its top, so the command imports them only
after that check (and, for ``--dry``, after setting ``TRITON_INTERPRET``).
"""
