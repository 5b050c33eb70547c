"""Peak resident memory of one piece of benchmark work, measured in a fresh process.

``--memory`` in the benchmarks: a fresh process builds the inputs, resets its peak (``VmHWM``,
through ``/proc/self/clear_refs``), runs the work once and reports how far the peak rose above
the resident memory it had after building the inputs. glibc is told to return every large block
on free (``MALLOC_MMAP_THRESHOLD_``), so that the resident memory tracks live tensors. Linux only.
"""

from __future__ import annotations

import os
import subprocess
import sys


def rss_kib(field: str) -> int:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def peak_rise_bytes(module: str, setup: str, work: str, args: list[str]) -> int:
    """Bytes the peak RSS rises during ``work``, after ``setup``, both run in a fresh process.

    ``setup`` and ``work`` are Python statements run with the benchmark ``module`` imported as
    ``b`` and the strings ``args`` as ``argv``.
    """
    code = (
        f"import sys; sys.path.insert(0, sys.argv[1]); import peak_memory as m, {module} as b; argv = sys.argv[2:];"
        f"{setup}; open('/proc/self/clear_refs', 'w').write('5'); base = m.rss_kib('VmRSS');"
        f"{work}; print((m.rss_kib('VmHWM') - base) * 1024)"
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", code, here, *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)}: {out.stderr.strip().splitlines()[-1:]}")
    return int(out.stdout.strip().splitlines()[-1])
