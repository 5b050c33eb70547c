"""``rlstab.compiler.keeps``: which tokens the masks keep, worked out by hand on a 2 x 3 batch."""

from types import SimpleNamespace

import torch

from rlstab.compiler.keeps import kept, mask_keeps, shadow_keeps, without_rejected

VALID = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


class Keeps:
    """A mask that keeps ``keep`` and records the threshold it was given."""

    def __init__(self, keep: list[list[float]]):
        self.keep_, self.given = torch.tensor(keep), []

    def keep(self, t, threshold):
        self.given.append(threshold)
        return self.keep_


def tokens():
    return SimpleNamespace(valid=VALID.clone(), valid_bool=VALID > 0)


def test_without_masks_the_valid_tokens_themselves():
    t = tokens()
    assert kept(t, []) is t.valid


def test_kept_is_valid_times_every_keep():
    # valid * [[1,0,1],[1,1,1]] * [[1,1,1],[0,1,1]] = [[1,0,0],[0,0,0]]
    out = kept(tokens(), [torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]), torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])])
    assert out.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_kept_leaves_the_valid_tokens_as_they_were():
    t = tokens()
    kept(t, [torch.zeros(2, 3), torch.zeros(2, 3)])  # the second keep multiplies in place: a copy's
    assert t.valid.tolist() == VALID.tolist()


def test_a_rejection_makes_its_tokens_padding_without_a_threshold():
    t, rejection = tokens(), Keeps([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    without_rejected(t, [rejection])
    # (0, 1) rejected: valid [[1,1,0],[1,0,0]] -> [[1,0,0],[1,0,0]]
    assert t.valid.tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert t.valid_bool.tolist() == [[True, False, False], [True, False, False]]
    assert rejection.given == [None]


def test_without_rejections_the_tokens_are_untouched():
    t = tokens()
    before = t.valid
    without_rejected(t, [])
    assert t.valid is before


def test_masks_then_shadow_masks_take_their_thresholds_in_order():
    masks = [Keeps([[1.0] * 3] * 2), Keeps([[0.0] * 3] * 2)]
    shadows = [Keeps([[1.0, 0.0, 0.0]] * 2)]
    objective = SimpleNamespace(masks=masks, shadow_masks=shadows)
    thresholds = ("a", "b", "c")  # StepStats.thresholds: the two masks', then the shadow mask's
    assert [k.tolist() for k in mask_keeps(objective, tokens(), thresholds)] == [[[1.0] * 3] * 2, [[0.0] * 3] * 2]
    assert [k.tolist() for k in shadow_keeps(objective, tokens(), thresholds)] == [[[1.0, 0.0, 0.0]] * 2]
    assert [m.given for m in masks + shadows] == [["a"], ["b"], ["c"]]
