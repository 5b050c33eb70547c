"""`pip install rlstab[trl]` next to the installed trl 1.16.0 installs rlstab alone, and the extra admits 1.16's patches.

The adapter overrides TRL internals that move between minor releases (``rlstab.adapters.trl.compat``):
in the 1.16 test environment trl 1.15.0's own trainer forward fails, so the adapter could not be
shown to work there, and the range is 1.16's patch releases. No other one is published yet, so this
check cannot install another in-range release as the veRL one does.
"""

from extras_range import installed_trainer_stays


def test_the_installed_trl_is_not_moved_and_patch_releases_are_in_range(tmp_path):
    requirement = installed_trainer_stays("trl", "trl", "1.16.0", "1.16.0", tmp_path)
    assert str(requirement.specifier) == "<1.17,>=1.16"
    assert requirement.specifier.contains("1.16.3") and not requirement.specifier.contains("1.15.0")
