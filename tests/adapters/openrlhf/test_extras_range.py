"""`pip install rlstab[openrlhf]` next to the installed openrlhf 0.11.2 installs rlstab alone, and the extra admits 0.11's later patches.

openrlhf 0.11.1's ``PolicyLoss`` takes other train/rollout correction arguments
(``enable_vllm_is_correction``, not ``is_correction_level``) than the 0.11.2 the adapter builds, so
the range starts at 0.11.2; no later 0.11 release is published yet to install instead.
"""

from extras_range import installed_trainer_stays


def test_the_installed_openrlhf_is_not_moved_and_patch_releases_are_in_range(tmp_path):
    requirement = installed_trainer_stays("openrlhf", "openrlhf", "0.11.2", "0.11.2", tmp_path, whole_tree=False)
    assert str(requirement.specifier) == "<0.12,>=0.11.2"
    assert requirement.specifier.contains("0.11.5") and not requirement.specifier.contains("0.11.1")
