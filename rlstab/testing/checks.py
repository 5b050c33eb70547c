"""Which checks apply to which component, and ``check_component``, which runs them.

- every family: YAML round trip, ``describe``/``explain``, JSON Schema;
- families the compiled objective runs (scope ``loss`` or ``step``): declared reads, padding, no
  valid token, micro-batches == whole step, two ranks == one process;
- masks: silenced tokens get zero gradient;
- components with state (a ``state_model`` or an ``initial_state()``; a trainer component whose
  runtime has ``state_dict``): the state round trip;
- trainer-executed families (``sampler``, ``rollout``) have no loss: only the first three and the state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rlstab.registry import FAMILIES
from rlstab.testing.hosting import family_name
from rlstab.testing.main_guard import require_main_guard
from rlstab.testing.masks import check_silenced_tokens_get_zero_gradient
from rlstab.testing.padding import check_no_valid_token_gives_zero_loss, check_padding_changes_nothing
from rlstab.testing.ranks import check_two_ranks_equal_one_process
from rlstab.testing.reads import check_reads_are_declared
from rlstab.testing.report import label
from rlstab.testing.state import check_state_round_trip, is_stateful
from rlstab.testing.static import check_describe_and_explain, check_json_schema, check_yaml_round_trip
from rlstab.testing.steps import check_micro_batches_equal_whole_step


def _always(component) -> bool:
    return True


def _runs_in_loss(component) -> bool:
    return FAMILIES[family_name(component)].scope != "trainer"


def _is_mask(component) -> bool:
    return family_name(component) == "masks"


# name -> (check, applies to)
CHECKS: dict[str, tuple[Callable, Callable]] = {
    "yaml_round_trip": (check_yaml_round_trip, _always),
    "describe_and_explain": (check_describe_and_explain, _always),
    "json_schema": (check_json_schema, _always),
    "reads_are_declared": (check_reads_are_declared, _runs_in_loss),
    "padding_changes_nothing": (check_padding_changes_nothing, _runs_in_loss),
    "no_valid_token_gives_zero_loss": (check_no_valid_token_gives_zero_loss, _runs_in_loss),
    "silenced_tokens_get_zero_gradient": (check_silenced_tokens_get_zero_gradient, _is_mask),
    "micro_batches_equal_whole_step": (check_micro_batches_equal_whole_step, _runs_in_loss),
    "two_ranks_equal_one_process": (check_two_ranks_equal_one_process, _runs_in_loss),
    "state_round_trip": (check_state_round_trip, is_stateful),
}


def applicable_checks(component) -> list[str]:
    """The names of the checks that apply to ``component`` (by its family, and whether it keeps state)."""
    family_name(component)  # an AssertionError for a class of no family
    return [name for name, (_, applies) in CHECKS.items() if applies(component)]


def check_component(component, *, checks: Iterable[str] | None = None, host=None) -> None:
    """Run every check that applies to ``component`` (or only ``checks``, by name); AssertionError listing
    each failed check, each message naming the component and the check.

    ``host``: an objective (anything ``rlstab.load`` accepts) to put the component into, for a
    component that needs companions; default a minimal one (``rlstab.testing.hosting``).

    The two-rank check spawns processes, which re-run a script's top level: from a script, call this
    under ``if __name__ == "__main__":`` (a call outside it raises
    [`MainGuardError`][rlstab.testing.main_guard.MainGuardError] before any check runs).
    """
    names = applicable_checks(component) if checks is None else list(checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}; the checks are {', '.join(CHECKS)}")
    if "two_ranks_equal_one_process" in names:
        require_main_guard()  # before the other checks: the spawned ranks would re-run an unguarded script
    failures = []
    for name in names:
        check, _ = CHECKS[name]
        try:
            check(component, host=host)
        except AssertionError as err:
            failures.append(str(err))
    if failures:
        raise AssertionError(f"{label(component)} fails {len(failures)} check(s):\n" + "\n".join(failures))
