"""rlstab.testing.report: a failed check is one AssertionError naming the component and the check."""

import pytest

from rlstab.masks.s2t import S2T
from rlstab.testing.report import checking, label


def test_label_names_family_kind_and_class():
    assert label(S2T()) == "masks kind 's2t' (rlstab.masks.s2t.S2T)"


def test_label_of_an_object_of_no_family():
    assert label(object()) == "component kind '?' (builtins.object)"


def test_an_assertion_gets_the_label_and_the_check_without_its_traceback_chain():
    with pytest.raises(AssertionError) as caught, checking(S2T(), "check_x"):
        raise AssertionError("why")
    assert str(caught.value) == "masks kind 's2t' (rlstab.masks.s2t.S2T): check_x: why"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_any_other_exception_becomes_a_failed_check_chained_to_its_cause():
    with pytest.raises(AssertionError) as caught, checking(S2T(), "check_y"):
        raise TypeError("bad operand")
    assert str(caught.value) == "masks kind 's2t' (rlstab.masks.s2t.S2T): check_y: raised TypeError: bad operand"
    assert isinstance(caught.value.__cause__, TypeError)


def test_a_passing_body_raises_nothing():
    with checking(S2T(), "check_z"):
        pass
