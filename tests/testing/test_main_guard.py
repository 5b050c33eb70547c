"""A script that calls check_component at its top level, without ``if __name__ == "__main__":``, is told
so before any process starts, instead of failing with "rank 0 died" (each spawned rank re-runs it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_script(tmp_path, text: str) -> subprocess.CompletedProcess:
    script = tmp_path / "my_checks.py"
    script.write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_an_unguarded_script_gets_one_clear_error_and_starts_no_rank(tmp_path):
    result = run_script(tmp_path, """\
        from rlstab.masks import S2T
        from rlstab.testing import check_component

        check_component(S2T())
        print("checked")
    """)
    assert result.returncode == 1
    assert "checked" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "rlstab.testing.main_guard.MainGuardError: rlstab.testing.check_component runs two ranks in spawned "
        "processes, and each re-runs my_checks.py from the top: put the call (line 4) under "
        '`if __name__ == "__main__":` at the end of the script, or run the checks from pytest'
    )
    assert "died" not in result.stderr and "bootstrapping" not in result.stderr


def test_the_guard_is_found_through_functions_and_either_way_round(tmp_path):
    result = run_script(tmp_path, """\
        import sys

        from rlstab.testing.main_guard import unguarded_call_site


        def site():
            return unguarded_call_site(sys._getframe())


        def nested():
            return site()


        print("top|", site())
        print("function|", nested())
        if __name__ == "__main__":
            print("guarded|", site())
            print("guarded function|", nested())
        if "__main__" == __name__:
            print("reversed|", site())
        else:
            pass
    """)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("| ", 1) for line in result.stdout.splitlines())
    path = str(tmp_path / "my_checks.py")
    assert lines["top"] == repr((path, 14))
    assert lines["function"] == repr((path, 15))
    assert lines["guarded"] == lines["guarded function"] == lines["reversed"] == "None"


def test_without_a_main_script_nothing_is_refused():
    code = "import sys; from rlstab.testing.main_guard import unguarded_call_site; print(unguarded_call_site(sys._getframe()))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "None", result.stderr
