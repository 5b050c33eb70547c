"""The two-rank check spawns processes, which re-run a script's top level: refuse an unguarded call.

A spawned process starts by importing the parent's main script (as ``__mp_main__``). A script that
calls ``check_component`` at its top level, not under ``if __name__ == "__main__":``, calls it
again in each rank, which tries to start processes of its own while it is still starting, and
dies: the parent sees only "rank 0 died" and multiprocessing's own message in between. So before
any process starts, [`require_main_guard`][rlstab.testing.main_guard.require_main_guard] finds the
line of the main script that led to the call and refuses, naming it, when no such guard holds it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import FrameType


class MainGuardError(RuntimeError):
    """The conformance kit was called from a script's top level without ``if __name__ == "__main__":``."""


def require_main_guard(what: str = "rlstab.testing.check_component") -> None:
    """Raise [`MainGuardError`][rlstab.testing.main_guard.MainGuardError] when the running main script
    calls ``what`` outside an ``if __name__ == "__main__":`` block (where a spawned process would
    call it again); nothing when there is no script (an interactive session, ``python -c``, pytest)."""
    site = unguarded_call_site(sys._getframe(1))
    if site is not None:
        path, line = site
        raise MainGuardError(
            f"{what} runs two ranks in spawned processes, and each re-runs {Path(path).name} from the top: "
            f'put the call (line {line}) under `if __name__ == "__main__":` at the end of the script, '
            "or run the checks from pytest"
        )


def unguarded_call_site(frame: FrameType | None) -> tuple[str, int] | None:
    """``(script, line)`` of the main script's top-level line above ``frame`` when no ``__main__`` guard
    holds it; None when guarded, when there is no main script, or when its source cannot be read."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            if node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
                return None
    return path, line


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    texts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(texts) == 1
