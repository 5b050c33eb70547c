"""The conformance kit: what every component, built in or from a plugin, must pass.

    from rlstab.testing import check_component
    check_component(MyMask(threshold=0.3))  # AssertionError naming the kind and each failed check

rlstab's promises are properties of the compiled objective, not of any one method: padding
changes nothing, a step split into micro-batches and ranks is the whole step, silenced tokens
get no gradient, a checkpoint resumes exactly, a configuration survives its YAML and matches the
published schema. A component can break each of them on its own (a row mean that counts padding,
a statistic of the micro-batch it happens to be given, a soft "mask", a state restored in part),
and none of that shows in its own unit tests. So every built-in kind runs through this kit
(``tests/testing``), and a plugin's test suite calls the same functions on its components.

Each check hosts the component in the smallest objective that runs it (``hosting``), on random
batches carrying only the fields that objective declares it reads (``batches``), and raises
``AssertionError`` naming the component (family, kind, class) and the check. The checks:

- ``check_yaml_round_trip``, ``check_describe_and_explain``, ``check_json_schema``: every family;
- ``check_reads_are_declared``, ``check_padding_changes_nothing``, ``check_no_valid_token_gives_zero_loss``,
  ``check_micro_batches_equal_whole_step``, ``check_two_ranks_equal_one_process``: families the
  compiled objective runs (not ``sampler``/``rollout``, which a trainer executes);
- ``check_silenced_tokens_get_zero_gradient``: masks;
- ``check_state_round_trip``: components with state.

``check_component`` runs those that apply (``applicable_checks``); each module's docstring says
what its check computes and why. ``builtin_components()`` gives example instances of rlstab's own
kinds; ``rlstab.testing.pytest_plugin`` helps parametrize a plugin's tests.
"""

from rlstab.testing.batches import make_batch
from rlstab.testing.checks import CHECKS, applicable_checks, check_component
from rlstab.testing.examples import builtin_components, builtin_kinds, missing_examples
from rlstab.testing.hosting import host_objective
from rlstab.testing.masks import check_silenced_tokens_get_zero_gradient
from rlstab.testing.padding import check_no_valid_token_gives_zero_loss, check_padding_changes_nothing
from rlstab.testing.ranks import check_two_ranks_equal_one_process, two_rank_failures
from rlstab.testing.reads import check_reads_are_declared
from rlstab.testing.state import check_state_round_trip
from rlstab.testing.static import check_describe_and_explain, check_json_schema, check_yaml_round_trip
from rlstab.testing.steps import check_micro_batches_equal_whole_step

__all__ = [
    "CHECKS",
    "applicable_checks",
    "builtin_components",
    "builtin_kinds",
    "check_component",
    "check_describe_and_explain",
    "check_json_schema",
    "check_micro_batches_equal_whole_step",
    "check_no_valid_token_gives_zero_loss",
    "check_padding_changes_nothing",
    "check_reads_are_declared",
    "check_silenced_tokens_get_zero_gradient",
    "check_state_round_trip",
    "check_two_ranks_equal_one_process",
    "check_yaml_round_trip",
    "host_objective",
    "make_batch",
    "missing_examples",
    "two_rank_failures",
]
