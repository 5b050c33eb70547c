"""A pre-registered dose-trend test: does a metric move monotonically with a treatment's dose?

Arms a_1..a_k are given doses d_1..d_k (``rlstab.lab.protocol.Trend``). Each dose is replaced by its rank
r_i (1 for the smallest dose, k for the largest), and the ranks are centred, ``w_i = r_i - (k + 1) / 2``
(four doses: -1.5, -0.5, +0.5, +1.5). Per seed s, with x_{i,s} the metric of arm i's run from seed s,
the trend is the least-squares slope of the metric on the centred ranks,

    b_s = sum_i w_i x_{i,s} / sum_i w_i^2,

a linear contrast of the arms (its weights sum to 0, so a seed's own level cancels, as in a paired
difference), in units of the metric per dose step. Over the n seeds where every arm has the metric,
the b_s get a one-sample t: their mean with its 95% t interval, ``p`` of ``t = mean / (sd / sqrt(n))``
with n - 1 degrees of freedom, wins/ties/losses (slopes above, at and below 0), and the MDE under the
report's Holm family (``rlstab.lab.statistics``). It is the linear-contrast test for a trend over
ordered groups with equally spaced scores (the linear orthogonal polynomial; Snedecor and Cochran,
*Statistical Methods*, on comparisons among treatment means), done on each seed's contrast so that
the seeds, not the runs, are the units, as in the paired differences.

Why ranks and not the raw doses: the doses of a dose-response are spread geometrically (0, 0.002,
0.01, 0.05 span a factor of 25 above zero). Raw-dose weights, ``d_i - mean(d)``, would be
(-0.0155, -0.0135, -0.0055, +0.0345): almost all the weight on the top dose against the rest, a test of
that one arm rather than of a trend. Log doses are undefined at a dose of 0. Ranks give each step up
in dose the same weight, so the test asks whether the metric moves in one direction as the dose
rises, without assuming a shape of the response.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlstab.lab.statistics import mean_interval, minimum_detectable_effect, paired_p, sample_sd


def rank_weights(doses: Sequence[float]) -> list[float]:
    """The centred ranks of distinct ``doses``: rank 1 for the smallest, minus the mean rank (k + 1) / 2."""
    order = sorted(range(len(doses)), key=lambda i: doses[i])
    ranks = [0.0] * len(doses)
    for rank, i in enumerate(order, start=1):
        ranks[i] = float(rank)
    centre = (len(doses) + 1) / 2
    return [r - centre for r in ranks]


def trend_test(per_arm: Sequence[dict[int, float | None]], doses: Sequence[float]) -> dict:
    """The trend of the arms' per-seed values ``per_arm`` (``{seed: value}``, in the order of ``doses``):
    ``{weights, seeds, slopes (b_s, in the order of seeds), mean, low, high, n, wins, ties, losses, sd, p, p_holm, n_effective,
    sd_effective, mde, mde_uncorrected, distinguishable}``, Holm's fields for a family of one."""
    if len(per_arm) != len(doses) or len(doses) < 2:
        raise ValueError(f"{len(per_arm)} arms and {len(doses)} doses: one dose per arm, at least 2")
    weights = rank_weights(doses)
    scale = sum(w * w for w in weights)
    seeds = sorted(set.intersection(*(set(s for s, v in arm.items() if v is not None) for arm in per_arm)))
    slopes = {s: sum(w * arm[s] for w, arm in zip(weights, per_arm)) / scale for s in seeds}
    values = list(slopes.values())
    result = {"weights": weights, "seeds": seeds, "slopes": values, **mean_interval(values)}
    result["wins"] = sum(b > 0 for b in values)
    result["ties"] = sum(b == 0 for b in values)
    result["losses"] = sum(b < 0 for b in values)
    n = len(values)
    sd = sample_sd(values)
    result["sd"] = sd
    result["p"] = paired_p(result["mean"], sd, n)
    result["p_holm"] = result["p"]
    result["n_effective"], result["sd_effective"] = n, sd
    result["mde_uncorrected"] = result["mde"] = minimum_detectable_effect(sd, n)
    low, high = result["low"], result["high"]
    result["distinguishable"] = None if low is None else bool(low > 0 or high < 0)
    return result
