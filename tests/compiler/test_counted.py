"""``rlstab.compiler.counted``: the exact order statistic a counted mask (``random_silence``) cuts at."""

from types import SimpleNamespace

import torch

from rlstab.comm import Comm
from rlstab.compiler.counted import counted_threshold

LOCAL = Comm(distributed=False)


class Counted:
    """A counted mask: its candidates and keys given, its target ``m`` a fixed count or the matched count."""

    def __init__(self, keys, candidates, m=None):
        self.keys_, self.candidates_, self.m, self.asked = torch.tensor(keys), torch.tensor(candidates), m, []

    def candidates(self, t):
        return self.candidates_

    def keys(self, t):
        return self.keys_

    def target(self, n, matched):
        self.asked.append((n, matched))
        return matched if self.m is None else self.m


class Keeps:
    def __init__(self, keep):
        self.keep_ = torch.tensor(keep)

    def keep(self, t, threshold):
        return self.keep_


def tokens(B=1, T=4):
    return SimpleNamespace(valid=torch.ones(B, T))


def values(result):
    return [float(x) for x in result]


def test_distinct_keys_cut_at_the_m_th_smallest():
    # keys 0.4, 0.1, 0.3, 0.2; m = 2: the 2nd smallest is 0.2; below it 1 key (0.1), tied 1 -> share (2 - 1) / 1 = 1.
    mask = Counted([[0.4, 0.1, 0.3, 0.2]], [[1.0, 1.0, 1.0, 1.0]], m=2)
    m, n, cut, share = counted_threshold(mask, [tokens()], LOCAL, None)
    assert (float(m), float(n), share.item()) == (2.0, 4.0, 1.0)
    assert cut.item() == torch.tensor(0.2).item() and cut.dtype == torch.float32
    assert mask.asked == [(4, None)]


def test_tied_keys_share_the_rest_of_m():
    # keys 0.1, 0.3, 0.3, 0.5; m = 2: cut 0.3, below 1 (0.1), tied 2 -> each tied key silenced by (2 - 1) / 2 = 0.5,
    # so the silenced mass is 1 + 2 * 0.5 = 2 = m exactly.
    mask = Counted([[0.1, 0.3, 0.3, 0.5]], [[1.0, 1.0, 1.0, 1.0]], m=2)
    m, n, cut, share = counted_threshold(mask, [tokens()], LOCAL, None)
    assert values((m, n, share)) == [2.0, 4.0, 0.5]
    assert cut.item() == torch.tensor(0.3).item()


def test_only_candidates_count_across_micro_batches():
    # Micro-batch 1: candidates keys 0.5, 0.2 (0.01 is not a candidate); micro-batch 2: 0.3, 0.9 (0.05 is not).
    # n = 4; m = 3: sorted 0.2, 0.3, 0.5, 0.9 -> cut 0.5, below 2, tied 1, share 1.
    first = Counted([[0.5, 0.01, 0.2]], [[1.0, 0.0, 1.0]], m=3)
    second = Counted([[0.3, 0.9, 0.05]], [[1.0, 1.0, 0.0]], m=3)

    class Both(Counted):  # one mask, each micro-batch its own keys
        def candidates(self, t):
            return t.mask.candidates_

        def keys(self, t):
            return t.mask.keys_

    both = Both([[0.0]], [[0.0]], m=3)
    a, b = SimpleNamespace(valid=torch.ones(1, 3), mask=first), SimpleNamespace(valid=torch.ones(1, 3), mask=second)
    m, n, cut, share = counted_threshold(both, [a, b], LOCAL, None)
    assert values((m, n, share)) == [3.0, 4.0, 1.0]
    assert cut.item() == torch.tensor(0.5).item()


def test_m_zero_cuts_below_every_key():
    m, n, cut, share = counted_threshold(Counted([[0.1, 0.2, 0.3, 0.4]], [[1.0] * 4], m=0), [tokens()], LOCAL, None)
    assert values((m, n, cut, share)) == [0.0, 4.0, 0.0, 0.0]


def test_a_step_without_tokens_or_candidates_has_no_threshold():
    assert counted_threshold(Counted([[0.1]], [[1.0]], m=1), [], LOCAL, None) is None
    assert counted_threshold(Counted([[0.1, 0.2, 0.3, 0.4]], [[0.0] * 4], m=1), [tokens()], LOCAL, None) is None


def test_a_match_takes_m_from_the_candidates_the_other_mask_silences():
    # The other mask silences tokens 1, 2 and 3 (keep 0); 1 and 3 are candidates: matched count 2 -> m = 2.
    # Token 2 is silenced too, but is no candidate: not counted.
    mask = Counted([[0.4, 0.1, 0.3, 0.2]], [[1.0, 1.0, 0.0, 1.0]])
    other = Keeps([[1.0, 0.0, 0.0, 0.0]])
    m, n, cut, share = counted_threshold(mask, [tokens()], LOCAL, (other, None))
    # Candidates 0.4, 0.1, 0.2 (n = 3); m = 2 -> the 2nd smallest, 0.2; below 1, tied 1, share 1.
    assert mask.asked == [(3, 2)]
    assert values((m, n, share)) == [2.0, 3.0, 1.0]
    assert cut.item() == torch.tensor(0.2).item()
