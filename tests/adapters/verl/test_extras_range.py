"""`pip install rlstab[verl]` next to verl 0.9.0 (in the declared range, not the tested 0.9.1) leaves verl alone."""

from extras_range import installed_trainer_stays


def test_an_in_range_verl_is_not_moved(tmp_path):
    requirement = installed_trainer_stays("verl", "verl", "0.9.0", "0.9.1", tmp_path)
    assert str(requirement.specifier) == "<0.10,>=0.9.0"
