"""How each metric combines over the micro-batches of a step (``Metrics.combines``), and ``combine``.

``combine`` must give exactly what the embedded trainer's metric aggregation gave before the kinds
existed (``aggregate_metrics``, which decided by the metrics' names; ``by_names`` below), bit for
bit, so that the demo's ``metrics.jsonl`` stays the same.
"""

import copy
import math
import pickle
import re
from pathlib import Path

import pytest

import rlstab
from rlstab.metrics import Metrics, combine

from batches import random_batch
from step_worker import take


def by_names(parts: list[dict[str, float]]) -> dict[str, float]:
    """The aggregation by names the embedded trainer used before the kinds (its ``aggregate_metrics``), written
    out: counts and losses add, step values are the first's, the rest weighted by valid tokens; and the names
    that came with the kinds: the silenced tokens by sign (counts), the mismatch ratio's extremes."""
    out = {}
    for name in dict.fromkeys(k for m in parts for k in m):
        have = [m for m in parts if name in m]
        values = [m[name] for m in have]
        if name == "mismatch/ratio_min":
            out[name] = min(values)
        elif name == "mismatch/ratio_max":
            out[name] = max(values)
        elif name in ("tokens/valid", "tokens/kept", "loss") or name.endswith(
            ("/kept", "/silenced", "/silenced_positive", "/silenced_negative")
        ) or name.startswith("loss/"):
            out[name] = sum(values)
        elif name in ("step/tokens_valid", "step/tokens_kept", "step/branch_tokens_valid", "step/branch_responses") or (
            name.endswith("threshold")
        ):
            out[name] = values[0]
        else:
            weights = [m["tokens/valid"] for m in have]
            out[name] = sum(v * w for v, w in zip(values, weights)) / (sum(weights) or 1.0)
    return out


def micro_batch_metrics(name: str, splits=((0, 5), (5, 6), (6, 16)), seed: int = 3) -> list[Metrics]:
    """Each micro-batch's metrics of one step of preset ``name``."""
    loss_fn = rlstab.load(name).compile()
    batch = random_batch(B=16, T=12, seed=seed)
    leaf = batch.logprobs.detach().clone().requires_grad_()
    micro = [take(batch, lo, hi, leaf) for lo, hi in splits]
    stats = loss_fn.gather(micro)
    return [loss_fn(mb, step=stats).metrics for mb in micro]


def test_the_loss_declares_each_metrics_kind():
    (metrics,) = micro_batch_metrics("recipe-2026", splits=((0, 16),))
    kinds = {name: metrics.combines(name) for name in metrics}
    assert kinds["tokens/valid"] == kinds["tokens/kept"] == kinds["loss"] == kinds["loss/policy"] == "sum"
    assert kinds["mask/s2t/kept"] == kinds["mask/s2t/silenced"] == "sum"
    assert kinds["mask/rollout_rejection/kept"] == kinds["mask/rollout_rejection/silenced"] == "sum"
    assert kinds["mask/s2t/entropy_threshold"] == "step"
    assert kinds["step/tokens_valid"] == kinds["step/tokens_kept"] == "step"
    for name in ("mask/s2t/kept_fraction", "tokens/kept_fraction", "reweight/tis/mean", "approx_kl",
                 "advantage/mean", "entropy/mean", "clip/high_fraction"):
        assert kinds[name] == "token_mean", name


@pytest.mark.parametrize("name", ["stare", "bapo", "dapo", "vcpo", "deep_grpo", "dppo_kl", "20-entropy"])
def test_step_values_of_components_and_the_step_level_are_step_constants(name):
    metrics = micro_batch_metrics(name)
    for part in metrics:
        for metric in part:
            if metric.startswith(("step/", "surrogate/")) or metric.endswith("threshold"):
                assert part.combines(metric) == "step", metric
            if metric.startswith("reweight/") and not metric.endswith("/mean"):
                assert part.combines(metric) == "step", metric
            if metric.startswith("loss"):
                assert part.combines(metric) == "sum", metric


def test_kinds_are_known_without_reading_and_are_checked():
    m = Metrics(["n", "f"], [1.0, 0.5], kinds=["sum", "token_mean"])
    assert m.combines("f") == "token_mean" and m._host is None  # nothing read
    with pytest.raises(KeyError, match="not one of these metrics"):
        m.combines("g")
    with pytest.raises(KeyError, match="without kinds"):
        Metrics(["n"], [1.0]).combines("n")
    with pytest.raises(ValueError, match="1 metric kinds for 2 names"):
        Metrics(["a", "b"], [1.0, 2.0], kinds=["sum"])
    with pytest.raises(ValueError, match="unknown metric kinds"):
        Metrics(["a"], [1.0], kinds=["mean"])


def test_pickled_and_copied_metrics_are_plain_dicts():
    m = Metrics(["tokens/valid", "loss"], [4.0, 2.5], kinds=["sum", "sum"])
    for copied in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert type(copied) is dict and copied == {"tokens/valid": 4.0, "loss": 2.5}


def test_combine_by_hand():
    def part(valid, kept, frac, thr, loss):
        names = ["tokens/valid", "tokens/kept", "clip/high_fraction", "mask/s2t/entropy_threshold", "loss"]
        return Metrics(names, [valid, kept, frac, thr, loss], kinds=["sum", "sum", "token_mean", "step", "sum"])

    out = combine([part(10.0, 8.0, 0.125, 0.5, 1.0), part(30.0, 30.0, 0.0, 0.5, 2.0)])
    assert out == {"tokens/valid": 40.0, "tokens/kept": 38.0, "clip/high_fraction": (0.125 * 10.0) / 40.0,
                   "mask/s2t/entropy_threshold": 0.5, "loss": 3.0}
    assert list(out) == ["tokens/valid", "tokens/kept", "clip/high_fraction", "mask/s2t/entropy_threshold", "loss"]


def test_combine_takes_a_metric_from_the_parts_that_have_it():
    a = Metrics(["tokens/valid", "f", "thr"], [2.0, 1.0, 0.25], kinds=["sum", "token_mean", "step"])
    b = Metrics(["tokens/valid", "f"], [6.0, 0.5], kinds=["sum", "token_mean"])
    c = Metrics(["tokens/valid", "thr", "g"], [0.0, 0.75, 3.0], kinds=["sum", "step", "token_mean"])
    out = combine([a, b, c])
    assert out == {"tokens/valid": 8.0, "f": (1.0 * 2.0 + 0.5 * 6.0) / 8.0, "thr": 0.25, "g": 0.0}


def test_combine_takes_the_losses_metrics_only():
    with pytest.raises(TypeError, match="got dict"):
        combine([{"tokens/valid": 1.0}])


@pytest.mark.parametrize("name", ["stapo", "dapo", "recipe-2026", "stare", "bapo", "icepop", "vcpo", "deep_grpo",
                                  "20-entropy", "gspo", "cispo", "clip_cov"])
def test_combine_equals_the_aggregation_by_names_bit_for_bit(name):
    parts = micro_batch_metrics(name)
    expected = by_names([dict(m) for m in parts])
    out = combine(parts)
    assert list(out) == list(expected)
    for metric, value in out.items():
        same = value == expected[metric] or (math.isnan(value) and math.isnan(expected[metric]))
        assert same and math.copysign(1.0, value) == math.copysign(1.0, expected[metric]), (metric, value, expected[metric])


def test_a_step_whose_groups_are_all_dropped_keeps_its_step_values():
    # Every reward 0: dynamic sampling drops all 4 groups, so no micro-batch has a valid token. The step values
    # stay the step's (a weighted mean over no tokens would have made them 0).
    data = rlstab.load("grpo").model_dump(mode="json", exclude_none=True)
    loss_fn = rlstab.Objective.model_validate({**data, "group_filter": {"kind": "dynamic_sampling"}}).compile()
    batch = random_batch(B=16, T=12, seed=3)
    batch = type(batch)(**{**{f: getattr(batch, f) for f in batch.__dataclass_fields__}, "rewards": batch.rewards * 0})
    micro = [take(batch, lo, hi, batch.logprobs) for lo, hi in ((0, 5), (5, 16))]
    stats = loss_fn.gather(micro)
    out = combine([loss_fn(mb, step=stats).metrics for mb in micro])
    assert out["tokens/valid"] == 0.0 and out["loss"] == 0.0
    assert out["step/groups_dropped"] == 4.0 and out["step/groups_dropped_fraction"] == 1.0


def documented_kinds() -> list[tuple[re.Pattern, str]]:
    """docs/metrics.md's table of metrics: (the name as a pattern, ``<...>`` one segment; its kind), in order."""
    page = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    table = page.split("## The metrics", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([^`]+)`", cells[0]):
            pattern = "".join("[^/]+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[^>]+>)", name))
            rows.append((re.compile(pattern), cells[1]))
    return rows


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_every_metric_is_documented_with_its_kind(name):
    rows = documented_kinds()
    (metrics,) = micro_batch_metrics(name, splits=((0, 16),))
    for metric in metrics:
        kind = next((kind for pattern, kind in rows if pattern.fullmatch(metric)), None)
        assert kind == metrics.combines(metric), (metric, kind)
