"""random_silence, the control: which tokens, how many, and the same whatever the split, padding and ranks."""

import struct

import pytest
import torch

import rlstab
from rlstab.explain import explain
from rlstab.masks.random_silence import RandomSilence, mix32, random_keys
from rlstab.testing import check_micro_batches_equal_whole_step, check_two_ranks_equal_one_process
from rlstab.tokens import Tokens

from batches import random_batch

M32 = 0xFFFFFFFF


def mix32_reference(x: int) -> int:
    """The docstring's hash with Python's unbounded integers (no 16-bit halves)."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def keys_reference(old_rows: list[list[float]], seed: int) -> list[list[float]]:
    """random_keys' formula on each row's valid tokens' old log-probabilities (Python ints throughout)."""
    out = []
    for row in old_rows:
        bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in row]
        c = mix32_reference(sum(mix32_reference(b ^ mix32_reference(r)) for r, b in enumerate(bits)))
        ks = [mix32_reference(c ^ mix32_reference(mix32_reference(r) ^ seed)) for r in range(len(row))]
        out.append([struct.unpack("<f", struct.pack("<I", 0x00800000 + k % (0x7F800000 - 0x00800000)))[0] for k in ks])
    return out


def test_mix32_is_the_reference_hash_without_overflow():
    xs = [0, 1, 2, 0x7FFFFFFF, 0x80000000, M32, 123456789, 0xDEADBEEF]
    assert mix32(torch.tensor(xs, dtype=torch.int64)).tolist() == [mix32_reference(x) for x in xs]
    assert mix32_reference(0) == 0 and mix32_reference(1) != 1  # 0 is the hash's fixed point


# Two responses, A = (+1, -1): row 0 has 5 valid tokens, row 1 has 3 (then 2 padding).
OLD = torch.tensor([[-0.5, -1.0, -2.0, -0.1, -3.0], [-0.2, -0.7, -1.5, 9.0, 9.0]])
VALID = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
A = torch.tensor([1.0, -1.0])


def run(mask, valid=VALID, old=OLD):
    batch = rlstab.TokenBatch(logprobs=old.clone(), old_logprobs=old, advantages=A, response_mask=valid)
    objective = rlstab.load({"masks": [mask], "aggregation": {"kind": "token-mean", "count": "kept"}})
    compiled = objective.compile()
    return compiled(batch).metrics, compiled.mask_silences(batch)["random_silence"]


def test_the_keys_are_the_formula_by_hand():
    t = Tokens.from_batch(rlstab.TokenBatch(logprobs=OLD, old_logprobs=OLD, response_mask=VALID), 20.0)
    keys = random_keys(t, seed=7)
    expected = keys_reference([OLD[0].tolist(), OLD[1, :3].tolist()], seed=7)
    assert keys[0].tolist() == expected[0] and keys[1, :3].tolist() == expected[1]


@pytest.mark.parametrize(("fraction", "m"), [(0.0, 0), (0.3, 2), (0.5, 3), (0.7, 4), (1.0, 5)])
def test_fraction_silences_the_smallest_keys_of_the_positive_tokens(fraction, m):
    # Candidates: row 0's 5 tokens (A > 0); m = floor(5 f + 1/2): 0.3 -> floor(2.0) = 2, 0.5 -> floor(3.0) = 3,
    # 0.7 -> floor(4.0) = 4. The m silenced are those with the m smallest keys (by hand, from the formula).
    metrics, silenced = run({"kind": "random_silence", "fraction": fraction, "seed": 3})
    keys = keys_reference([OLD[0].tolist()], seed=3)[0]
    chosen = sorted(range(5), key=keys.__getitem__)[:m]
    expected = torch.zeros(2, 5)
    expected[0, chosen] = 1.0
    assert torch.equal(silenced, expected)  # row 1 (A < 0) is never a candidate
    assert metrics["mask/random_silence/silenced"] == m and metrics["mask/random_silence/target"] == m
    assert metrics["mask/random_silence/candidates"] == 5


def test_every_valid_token_is_a_candidate_without_positive_only():
    metrics, silenced = run({"kind": "random_silence", "fraction": 0.5, "positive_only": False})
    # 8 valid tokens: m = floor(8 * 0.5 + 1/2) = 4, from both rows; padding is never silenced.
    assert metrics["mask/random_silence/candidates"] == 8 and silenced.sum() == 4
    assert silenced[1, 3:].sum() == 0


def test_the_draw_ignores_where_the_padding_is():
    # Row 1 left-padded instead of right-padded: its tokens keep their ranks 0, 1, 2, hence their keys.
    left_old = torch.stack([OLD[0], torch.tensor([9.0, 9.0, -0.2, -0.7, -1.5])])
    left_valid = torch.stack([VALID[0], torch.tensor([False, False, True, True, True])])
    _, right = run({"kind": "random_silence", "fraction": 0.5, "positive_only": False})
    _, left = run({"kind": "random_silence", "fraction": 0.5, "positive_only": False}, valid=left_valid, old=left_old)
    assert torch.equal(left[0], right[0]) and torch.equal(left[1, 2:], right[1, :3])


@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.37, 0.9])
def test_fraction_silences_the_nearest_count_exactly(fraction):
    batch = random_batch(B=32, T=40, seed=5)  # a few hundred positive-advantage tokens
    out = rlstab.load({"extends": "grpo", "masks": [{"kind": "random_silence", "fraction": fraction}]}).compile()(batch)
    n = out.metrics["mask/random_silence/candidates"]
    assert n > 200
    assert out.metrics["mask/random_silence/silenced"] == int(fraction * n + 0.5)


def s2t_and_control(control: dict, shadow: bool):
    """grpo with S2T (tau_p 0.05 so it fires often) acting or as a shadow, and the control matched to it."""
    s2t = {"kind": "s2t", "tau_p": 0.05}
    if shadow:
        return rlstab.load({"extends": "grpo", "masks": [control], "shadow_masks": [s2t]})
    return rlstab.load({"extends": "grpo", "masks": [s2t, control]})


@pytest.mark.parametrize("shadow", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_match_silences_exactly_as_many_positive_tokens_as_s2t_in_the_step(seed, shadow):
    batch = random_batch(B=32, T=40, seed=seed, advantages="sequence")
    match = "shadow/s2t" if shadow else "s2t"
    compiled = s2t_and_control({"kind": "random_silence", "match": match, "seed": seed}, shadow).compile()
    stats = compiled.gather([batch])
    silences = compiled.mask_silences(batch, stats)
    s2t, control = silences[match], silences["random_silence"]
    assert s2t.sum() > 5  # it fires
    assert control.sum() == s2t.sum()
    positive = (batch.advantages > 0).unsqueeze(-1).expand_as(control)
    assert bool((control[~positive] == 0).all())  # only positive-advantage tokens
    assert not torch.equal(control, s2t)  # other tokens: a random choice


def split_silences(compiled, batch, splits):
    micro = [take_rows(batch, lo, hi) for lo, hi in splits]
    stats = compiled.gather(micro)
    return {k: torch.cat([compiled.mask_silences(mb, stats)[k] for mb in micro]) for k in compiled.mask_silences(micro[0], stats)}


def take_rows(batch, lo, hi):
    fields = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    return rlstab.TokenBatch(**{k: (v[lo:hi] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})


@pytest.mark.parametrize("mask", [{"kind": "random_silence", "fraction": 0.2},
                                  {"kind": "random_silence", "match": "shadow/s2t"}])
def test_the_silenced_tokens_do_not_depend_on_the_micro_batch_split(mask):
    batch = random_batch(B=16, T=24, seed=11, advantages="sequence")
    compiled = s2t_and_control(mask, shadow=True).compile()
    whole = split_silences(compiled, batch, [(0, 16)])
    for splits in ([(0, 3), (3, 8), (8, 12), (12, 16)], [(0, 1), (1, 15), (15, 16)]):
        assert all(torch.equal(whole[k], v) for k, v in split_silences(compiled, batch, splits).items())
    assert whole["random_silence"].sum() > 0


def test_the_kit_with_an_s2t_to_match_splits_and_two_ranks():
    host = {"extends": "dapo", "masks": [{"kind": "s2t", "tau_p": 0.05}]}
    control = RandomSilence(match="s2t", seed=5)
    check_micro_batches_equal_whole_step(control, host=host)
    check_two_ranks_equal_one_process(control, RandomSilence(fraction=0.1), host=host)


def test_the_seed_changes_the_draw():
    batch = random_batch(B=16, T=24, seed=11)
    draws = [rlstab.load({"extends": "grpo", "masks": [{"kind": "random_silence", "fraction": 0.3, "seed": s}]})
             .compile().mask_silences(batch)["random_silence"] for s in (0, 1)]
    assert draws[0].sum() == draws[1].sum() and not torch.equal(*draws)


@pytest.mark.parametrize(("masks", "shadows", "message"), [
    ([{"kind": "random_silence"}], [], r"masks\[0\] = .*give exactly one of fraction .* or match"),
    ([{"kind": "random_silence", "fraction": 0.1, "match": 0}], [], r"masks\[0\] = .*give exactly one"),
    ([{"kind": "random_silence", "fraction": 1.5}], [], r"masks\[0\]\.fraction = 1\.5"),
    ([{"kind": "random_silence", "match": "s2t"}], [], r"masks\[0\]\.match = 's2t': names no mask of this objective"),
    ([{"kind": "s2t"}, {"kind": "random_silence", "match": 2}], [], r"masks\[1\]\.match = 2: names no mask .*allowed: 's2t'"),
    ([{"kind": "random_silence", "match": 0}], [], r"masks\[0\]\.match = 0: names 'random_silence', itself a counted mask"),
    ([{"kind": "rollout_rejection", "high": 2.0, "rejected": "padding"}, {"kind": "random_silence", "match": 0}], [],
     r"masks\[1\]\.match = 0: names 'rollout_rejection', a rollout rejection"),
    ([], [{"kind": "s2t"}, {"kind": "random_silence", "match": "shadow/s2tt"}],
     r"shadow_masks\[1\]\.match = 'shadow/s2tt': names no mask .*allowed: 'shadow/s2t'"),
])
def test_yaml_errors_name_the_path_and_the_value(masks, shadows, message):
    with pytest.raises(rlstab.ConfigError, match=message):
        rlstab.load({"extends": "grpo", "masks": masks, "shadow_masks": shadows})


def test_the_yaml_of_a_control_arm_round_trips(tmp_path):
    path = tmp_path / "control.yaml"
    path.write_text("extends: dapo\nmasks:\n- {kind: random_silence, match: shadow/s2t, seed: 1}\nshadow_masks:\n- {kind: s2t}\n")
    objective = rlstab.load(path)
    assert objective.masks[0] == RandomSilence(match="shadow/s2t", seed=1)
    assert rlstab.load(objective.to_yaml()) == objective
    assert "random_silence (a control)" in explain(objective)


@pytest.mark.parametrize("on_device", [False, True])
def test_the_count_is_exact_on_the_radix_path_and_the_device_path(monkeypatch, on_device):
    # ~10,000 positive-advantage tokens: over the 8,192 that are sorted, so the cut is found by radix selection;
    # ON_DEVICE = True runs the GPU's path (no host reads of the bins) on CPU tensors.
    from rlstab.quantile import Population

    monkeypatch.setattr(Population, "ON_DEVICE", on_device)
    batch = random_batch(B=200, T=200, seed=2, advantages="sequence")
    compiled = s2t_and_control({"kind": "random_silence", "match": "s2t"}, shadow=False).compile()
    out = compiled(batch)
    assert out.metrics["mask/random_silence/candidates"] > 8192
    assert out.metrics["mask/random_silence/silenced"] == out.metrics["mask/s2t/silenced"] > 100
    fraction = rlstab.load({"extends": "grpo", "masks": [{"kind": "random_silence", "fraction": 0.25}]}).compile()(batch)
    n = fraction.metrics["mask/random_silence/candidates"]
    assert fraction.metrics["mask/random_silence/silenced"] == int(0.25 * n + 0.5)


# Ties: identical responses draw identical keys, and the tied candidates at the cut share what is left of m.


def with_copies(batch, copies: dict[int, int]):
    """``batch`` with row ``dst`` replaced by an exact copy of row ``src`` for each ``dst: src``."""
    fields = {}
    for name in batch.__dataclass_fields__:
        value = getattr(batch, name)
        if isinstance(value, torch.Tensor) and value.shape[:1] == batch.response_mask.shape[:1]:
            value = value.detach().clone()
            for dst, src in copies.items():
                value[dst] = value[src]
            value = value.requires_grad_(getattr(batch, name).requires_grad)
        fields[name] = value
    return rlstab.TokenBatch(**fields)


def test_two_identical_one_token_responses_share_a_one_token_target():
    # Two copies of one rewarded one-token response (A = +1): n = 2 candidates with the same key, and
    # fraction 0.5 gives m = floor(2 * 0.5 + 1/2) = 1. The cut is the 1st smallest key, shared by both
    # (b = 0 below it, c = 2 at it), so each is silenced by (1 - 0) / 2. The rule before silenced key < key_(2)
    # = that same key: none of them.
    old = torch.tensor([[-0.3], [-0.3]])
    batch = rlstab.TokenBatch(logprobs=old.clone().requires_grad_(), old_logprobs=old,
                              advantages=torch.tensor([1.0, 1.0]), response_mask=torch.ones(2, 1, dtype=torch.bool))
    compiled = rlstab.load({"extends": "dapo", "masks": [{"kind": "random_silence", "fraction": 0.5}]}).compile()
    out = compiled(batch)
    assert compiled.mask_silences(batch)["random_silence"].tolist() == [[0.5], [0.5]]
    assert out.metrics["mask/random_silence/silenced"] == 1.0 and out.metrics["mask/random_silence/target"] == 1.0
    # The update is the one silencing one copy wholly: DAPO's token mean over the 2 valid tokens, ratio 1, A = 1:
    # loss = -(0.5 * 1 + 0.5 * 1) / 2 = -0.5 (one copy silenced: -(0 + 1) / 2, the same), each copy's gradient
    # -0.5 / 2 = -0.25 (summed over the copies: -0.5, as the kept copy's alone).
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.5)
    assert batch.logprobs.grad.tolist() == [[-0.25], [-0.25]]


@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.1, 0.37, 0.5, 0.9])
def test_with_identical_responses_the_silenced_mass_is_the_target(fraction):
    # Rows 8-15 copy rows 0-7 (old log-probabilities, advantages, everything): every candidate key comes in
    # pairs, so an odd m cuts a pair in two. m = floor(f n + 1/2) whatever the ties.
    batch = with_copies(random_batch(B=16, T=24, seed=3, advantages="sequence"), {8 + i: i for i in range(8)})
    compiled = rlstab.load({"extends": "dapo", "masks": [{"kind": "random_silence", "fraction": fraction}]}).compile()
    out = compiled(batch)
    silenced = compiled.mask_silences(batch)["random_silence"]
    n = out.metrics["mask/random_silence/candidates"]
    m = int(fraction * n + 0.5)
    assert n > 40 and n % 2 == 0
    assert out.metrics["mask/random_silence/target"] == m
    assert out.metrics["mask/random_silence/silenced"] == pytest.approx(m, abs=1e-4)
    assert silenced.sum().item() == pytest.approx(m, abs=1e-4)
    assert torch.equal(silenced[:8], silenced[8:])  # copies are treated alike
    halves = ((silenced > 0) & (silenced < 1)).sum().item()
    assert halves == (2 if m % 2 else 0)  # an odd m leaves one pair at the cut, each copy silenced by 1/2


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_match_against_s2t_is_exact_with_identical_responses(seed):
    # Rows 12-15 copy rows 0-3: S2T silences a copied token in both copies, but the count it fixes, m, may be
    # odd, and the random keys of copies tie; the control still silences exactly m.
    batch = with_copies(random_batch(B=16, T=24, seed=seed, advantages="sequence"), {12 + i: i for i in range(4)})
    compiled = s2t_and_control({"kind": "random_silence", "match": "shadow/s2t", "seed": seed}, shadow=True).compile()
    stats = compiled.gather([batch])
    silences = compiled.mask_silences(batch, stats)
    s2t, control = silences["shadow/s2t"], silences["random_silence"]
    assert s2t.sum() > 3
    assert control.sum().item() == pytest.approx(s2t.sum().item(), abs=1e-4)
    positive = (batch.advantages > 0).unsqueeze(-1).expand_as(control)
    assert bool((control[~positive] == 0).all())


def test_shared_ties_do_not_depend_on_the_micro_batch_split():
    # Rows 8-15 copy rows 0-7, so every copy sits in another micro-batch than its original under these splits.
    batch = with_copies(random_batch(B=16, T=24, seed=11, advantages="sequence"), {8 + i: i for i in range(8)})
    for fraction in (0.1, 0.3):
        compiled = s2t_and_control({"kind": "random_silence", "fraction": fraction}, shadow=True).compile()
        whole = split_silences(compiled, batch, [(0, 16)])
        shared = whole["random_silence"]
        m = round(shared.sum().item())
        assert ((shared > 0) & (shared < 1)).sum() == (2 if m % 2 else 0)
        for splits in ([(0, 3), (3, 8), (8, 12), (12, 16)], [(0, 1), (1, 13), (13, 16)]):
            assert all(torch.equal(whole[k], v) for k, v in split_silences(compiled, batch, splits).items())
