"""STAPO's mechanism along training, with nulls (``rlstab audit --mechanism --from``).

For each saved state (a lab run's kept checkpoint, ``rlstab.demo.counterfactual_states``) the weights are loaded and
the state's own batch is sampled (``rlstab.demo.audit.collect``: ``prompts`` problems x ``group_size`` responses at
the run's regime temperature, seeded by :func:`state_seed`). On that batch, taken as one on-policy step:

- ``c_t = dL/dlogp_t``, the coefficients of the *full* loss (the objective without masks and regularisers, gathered
  over the batch's micro-batches: ``rlstab.trainer.mechanism.meter``, as ``StepMeter``);
- ``g_X = sum_{t in X} c_t dlogp_t/dtheta`` over the policy's trainable parameters, for X = every valid token
  (``g_full``), the objective's mask's silenced set S (m tokens: ``rlstab.demo.counterfactual.mask_tokens``), and
  each null set;
- ``share(X) = ||g_X|| / ||g_full||``; the cosine of ``g_S`` with ``g_full``;
- **null A**: ``null_draws`` sets of m distinct tokens drawn uniformly without replacement among the valid tokens
  with A > 0 (``rlstab.demo.counterfactual_stats.random_sets``);
- **null B**, p-matched without the entropy condition: as many sets of m tokens drawn among the tokens S2T's
  probability condition alone admits, ``A > 0 and p < tau_p`` (entropy ignored; S is a subset of them). Defined for
  an objective whose one mask is ``s2t``; for any other it is skipped (``None``, with the reason);
- per null, S's one-sided exact p-value ``(1 + #{k : share_k >= share_S}) / (K + 1)``
  (``counterfactual_stats.upper_p_value``): STAPO claims the mask's few tokens carry an outsized share;
- the correlation with entropy at fixed probability (``logit_grad.entropy_at_fixed_probability``): within each
  probability bin of ``logit_grad.PROBABILITY_EDGES`` with >= 10 tokens, Spearman's correlation of the logit-gradient
  norm with the entropy over the state's response tokens, for the coefficient-free ``||e_y - pi||`` and the
  ``|c_t|``-weighted norm, and their token-count-weighted mean.

A state where m = 0 (or ``g_full = 0``) has no test: it is reported as uninformative and left out of the combination.
Over the informative states the p-values combine by Fisher's method (``counterfactual_stats.fisher``, as the
counterfactual audit), per null; the fixed-p correlation is also computed over every state's tokens pooled.

Cost per state: one forward pass with gradient per micro-batch (the graphs kept), one backward per micro-batch for
``g_full``, and for S and each null set one backward per micro-batch holding one of its tokens (a set of a few tokens
touches a few micro-batches; :data:`MICRO_BATCH` is small for that reason).
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable

from rlstab.demo.counterfactual_stats import fisher, random_sets, upper_p_value
from rlstab.lazy import torch
from rlstab.objective import Objective

MICRO_BATCH = 8
"""Responses per micro-batch: a null set of m tokens costs a backward pass through the micro-batches holding them only."""
NULLS = ("a", "b")
"""null A (count-matched positive-advantage tokens), null B (count-matched among the probability condition's)."""
METHODS = {
    "batch": "the state's own responses: prompts x group_size, sampled by the state's policy at the run's regime "
             "temperature, problems and sampling seeded by crc32('seed:run_seed:step')",
    "coefficients": "c_t = dL/dlogp_t of the objective without masks and regularisers, gathered over the batch as "
                    "one on-policy step (rlstab.trainer.mechanism.meter)",
    "share": "||g_X|| / ||g_full||, g_X = sum_{t in X} c_t dlogp_t/dtheta over the trainable parameters (float64)",
    "S": "the valid tokens the product of the objective's masks does not keep",
    "null_a": "K sets of m distinct tokens, uniform without replacement among the valid tokens with A > 0",
    "null_b": "K sets of m distinct tokens, uniform without replacement among the valid tokens with A > 0 and "
              "p < tau_p (S2T's probability condition, entropy ignored); only for an objective whose one mask is s2t",
    "null_seed": "one torch.Generator per state seeded by crc32('seed:run_seed:step:null'), null A's K draws first",
    "p": "one-sided exact: (1 + #{k: share_k >= share_S}) / (K + 1)",
    "combination": "Fisher: X = -2 sum ln p over the informative states (m > 0 and g_full != 0), "
                   "p = P(chi2 with 2S degrees of freedom >= X), per null",
    "fixed_p": "within each probability bin (edges 0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 1) holding >= 10 tokens, "
               "Spearman of the logit-gradient norm with the entropy; the mean over bins weighted by their token "
               "counts; direction = ||e_y - pi||, norm = |c_t| ||e_y - pi||",
}
"""How each number of ``mechanism.json`` is made, stored in it."""


def state_seed(seed: int, run_seed: int | None, step: int | None) -> int:
    """The seed of a state's batch: ``crc32("seed:run_seed:step")``, a different batch per state and a fixed one per
    ``--seed`` (``rlstab.demo.audit.collect`` seeds the problems with it and the sampling with it + 1)."""
    return zlib.crc32(f"{seed}:{run_seed}:{step}".encode())


def null_seed(seed: int, run_seed: int | None, step: int | None) -> int:
    """The seed of a state's null draws: ``crc32("seed:run_seed:step:null")``."""
    return zlib.crc32(f"{seed}:{run_seed}:{step}:null".encode())


def probability_condition(objective: Objective, sample, positive: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """Null B's candidates, ``[N, T]`` bool: the valid tokens with A > 0 and p < tau_p of the objective's S2T mask
    (on-policy, the current and old probabilities are the sample's); ``(None, why)`` for any other objective."""
    from rlstab.masks.s2t import S2T

    masks = objective.masks
    if len(masks) != 1 or not isinstance(masks[0], S2T):
        kinds = ", ".join(m.kind for m in masks) or "none"
        return None, (f"null B is defined from an s2t mask's probability condition; this objective's masks are "
                      f"{kinds}")
    return positive & (sample.logprobs < math.log(masks[0].tau_p)), ""


def null_sets(pools: dict[str, torch.Tensor | None], m: int, draws: int,
              generator: torch.Generator) -> dict[str, list[torch.Tensor]]:
    """Each null's ``draws`` sets (``[N, T]`` bool) of ``min(m, pool size)`` distinct tokens of its pool (``[N, T]``
    bool, None for an undefined null), uniform without replacement, the nulls in :data:`NULLS` order from one
    ``generator``; none when ``m`` is 0."""
    out: dict[str, list[torch.Tensor]] = {name: [] for name in NULLS}
    for name in NULLS:
        pool = pools[name]
        if m == 0 or pool is None:
            continue
        candidates = pool.flatten().nonzero()[:, 0]
        for flat in random_sets(candidates, min(m, candidates.numel()), draws, generator):
            mask = torch.zeros(pool.numel(), dtype=torch.bool)
            mask[flat] = True
            out[name].append(mask.view(pool.shape))
    return out


def _summary(observed: float, null: list[float]) -> dict:
    ordered = sorted(null)
    k = len(ordered)
    return {
        "shares": null,
        "median": (ordered[(k - 1) // 2] + ordered[k // 2]) / 2,
        "p95": ordered[int(0.95 * (k - 1) + 0.5)],
        "p": upper_p_value(observed, null),
    }


def measure_sample(policy, sample, objective: Objective, *, null_draws: int, generator: torch.Generator,
                   micro_batch: int = MICRO_BATCH, batched: bool = False, chunk: int = 16) -> tuple[dict, object]:
    """S, the nulls and their shares, and the fixed-p correlation on ``sample`` at ``policy``'s current weights.

    Returns ``(result, tokens)``: the state's numbers (no file I/O) and its ``TokenGradients`` (for the pooled
    correlation). ``batched``: the null sets' gradients by ``torch.autograd.grad(is_grads_batched=True)``,
    ``chunk`` sets at a time (``share.parameter_gradients``); the same numbers as the loop.
    """
    from rlstab.demo.audit import rollout_of, silenced_texts, step_batches
    from rlstab.demo.counterfactual import mask_tokens
    from rlstab.trainer.mechanism.logit_grad import (
        TokenGradients,
        distribution_stats,
        entropy_at_fixed_probability,
    )
    from rlstab.trainer.mechanism.meter import full_coefficients, mask_free
    from rlstab.trainer.mechanism.share import parameter_gradient, parameter_gradients

    silenced, positive, _ = mask_tokens(sample, objective)
    m = int(silenced.sum())
    admitted, undefined = probability_condition(objective, sample, positive)
    if admitted is not None and bool((silenced & ~admitted).any()):
        raise AssertionError("the mask silenced a token outside its own probability condition")
    pools = {"a": positive, "b": admitted}
    sets = null_sets(pools, m, null_draws, generator)

    full = mask_free(objective).compile()
    batch_of = step_batches(sample, objective)
    parts = [list(range(i, min(i + micro_batch, sample.responses))) for i in range(0, sample.responses, micro_batch)]
    stats = full.gather([batch_of(rows, sample.logprobs[rows], sample.entropy[rows]) for rows in parts],
                        distributed=False)
    rollout = rollout_of(sample, policy)
    params = policy.trainable_parameters()
    tokens = TokenGradients()
    graphs = []  # (rows, logprobs with their graph, coefficients)
    for rows in parts:
        logprobs, entropy, sum_squares = distribution_stats(policy, rollout.rows(rows))
        c = full_coefficients(full, batch_of, rows, logprobs, entropy.detach(), stats)
        tokens.add(logprobs, entropy, sum_squares, c, sample.response_mask[rows])
        graphs.append((rows, logprobs, c))
    passes = 0
    g_full = None
    for _, logprobs, c in graphs:
        if bool((c != 0).any()):
            part = parameter_gradient(logprobs, params, c)
            passes += 1
            g_full = part if g_full is None else g_full + part
    full_norm = 0.0 if g_full is None else float(g_full.norm())

    def gradients(masks: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """``g_X`` of each set (None where it is exactly 0), ``chunk`` sets at a time."""
        nonlocal passes
        out: list[torch.Tensor | None] = []
        for start in range(0, len(masks), chunk):
            group = masks[start:start + chunk]
            total = [None] * len(group)
            for rows, logprobs, c in graphs:
                weights = torch.stack([c * x[rows].to(c.dtype) for x in group])
                active = [i for i in range(len(group)) if bool((weights[i] != 0).any())]
                if not active:
                    continue
                grads = parameter_gradients(logprobs, params, weights[active], batched=batched)
                passes += 1 if batched else len(active)
                for row, i in enumerate(active):
                    total[i] = grads[row] if total[i] is None else total[i] + grads[row]
            out.extend(total)
        return out

    informative = m > 0 and full_norm > 0
    share = cosine = None
    nulls: dict[str, dict | None] = {"a": None, "b": None}
    if informative:
        (g_s,) = gradients([silenced])
        norm = 0.0 if g_s is None else float(g_s.norm())
        share = norm / full_norm
        cosine = None if norm == 0 else min(1.0, max(-1.0, float(g_s @ g_full) / (norm * full_norm)))
        for name in NULLS:
            if pools[name] is not None:
                shares = [0.0 if g is None else float(g.norm()) / full_norm for g in gradients(sets[name])]
                nulls[name] = _summary(share, shares)
    graphs.clear()  # free the kept graphs
    result = tokens.result()
    p, h = torch.cat(tokens.probability), torch.cat(tokens.entropy)
    direction, norm_t = torch.cat(tokens.direction), torch.cat(tokens.norm)
    out = {
        "responses": sample.responses,
        "tokens": sample.tokens,
        "mean_reward": float(sample.rewards.mean()),
        "mixed_groups": sample.mixed_groups,
        "positive_tokens": int(positive.sum()),
        "probability_condition_tokens": None if admitted is None else int(admitted.sum()),
        "null_b_undefined": undefined or None,
        "silenced": m,
        "silenced_tokens": silenced_texts(sample, silenced),
        "full_grad_norm": full_norm,
        "informative": informative,
        "uninformative_reason": None if informative else ("m = 0: the mask silenced no token" if m == 0 else
                                                          "g_full = 0: no token carries a coefficient"),
        "share": share,
        "cosine": cosine,
        "null_a": nulls["a"],
        "null_b": nulls["b"],
        "fixed_p": entropy_at_fixed_probability(p, h, {"direction": direction, "norm": norm_t}),
        "spearman": result["spearman"],
        "backward_passes": passes,
    }
    return out, tokens


def audit_state(policy, task, objective: Objective, state, *, prompts: int, group_size: int, temperature: float,
                seed: int, null_draws: int, log: Callable[[str], None] | None = None, **options) -> tuple[dict, object]:
    """Load ``state``'s weights, sample its batch (:func:`state_seed`), and :func:`measure_sample` it."""
    from rlstab.demo.audit import collect
    from rlstab.demo.counterfactual_states import set_weights

    started = time.perf_counter()
    set_weights(policy, state.weights)
    batch_seed = state_seed(seed, state.run_seed, state.step)
    sample = collect(policy, task, prompts=prompts, group_size=group_size, seed=batch_seed, temperature=temperature)
    generator = torch.Generator().manual_seed(null_seed(seed, state.run_seed, state.step))
    result, tokens = measure_sample(policy, sample, objective, null_draws=null_draws, generator=generator, **options)
    out = {"label": state.label, "run": state.run, "run_seed": state.run_seed, "step": state.step,
           "temperature": temperature, "batch_seed": batch_seed, **result,
           "seconds": time.perf_counter() - started}
    if log is not None:
        tested = (f"share {out['share']:.4g}, p_A {_p(out['null_a'])}, p_B {_p(out['null_b'])}" if out["informative"]
                  else f"uninformative ({out['uninformative_reason']})")
        log(f"mechanism: {state.label}: {out['tokens']:,} tokens, m = {out['silenced']}, {tested}; "
            f"{out['backward_passes']} backward passes in {out['seconds']:.1f} s")
    return out, tokens


def _p(null: dict | None) -> str:
    return "-" if null is None else f"{null['p']:.3g}"


def mechanism_along(policy, task, objective: Objective, name: str, states, *, source: dict, prompts: int,
                    group_size: int, seed: int, null_draws: int, log: Callable[[str], None] | None = None,
                    **options) -> dict:
    """:func:`audit_state` for each ``(state, temperature)`` of ``states`` (a state may be a callable returning one,
    loaded in turn), then :func:`combine`: the content of ``mechanism.json``."""
    from rlstab.trainer.mechanism.logit_grad import TokenGradients, entropy_at_fixed_probability

    started = time.perf_counter()
    results, pooled = [], TokenGradients()
    for state, temperature in states:
        state = state() if callable(state) else state
        result, tokens = audit_state(policy, task, objective, state, prompts=prompts, group_size=group_size,
                                     temperature=temperature, seed=seed, null_draws=null_draws, log=log, **options)
        results.append(result)
        for field in ("probability", "entropy", "direction", "norm"):
            getattr(pooled, field).extend(getattr(tokens, field))
    p, h = (torch.cat(pooled.probability), torch.cat(pooled.entropy)) if pooled.probability else (None, None)
    fixed = None if p is None else entropy_at_fixed_probability(
        p, h, {"direction": torch.cat(pooled.direction), "norm": torch.cat(pooled.norm)})
    return {
        "source": source,
        "objective": name,
        "mask": [m.describe() for m in objective.masks],
        "settings": {"prompts": prompts, "group_size": group_size, "seed": seed, "null_draws": null_draws,
                     "micro_batch": options.get("micro_batch", MICRO_BATCH)},
        "methods": METHODS,
        "states": results,
        "combined": {**combine(results), "fixed_p_pooled": fixed},
        "seconds": time.perf_counter() - started,
    }


def combine(states: list[dict]) -> dict:
    """Fisher's combination of each null's per-state p-values over the informative states; the uninformative ones
    counted and named."""
    informative = [s for s in states if s["informative"]]
    out: dict = {"informative_states": len(informative),
                 "uninformative_states": [s["label"] for s in states if not s["informative"]]}
    for name in NULLS:
        pvalues = [s[f"null_{name}"]["p"] for s in informative if s[f"null_{name}"] is not None]
        statistic, p = fisher(pvalues)
        out[f"null_{name}"] = {"states": len(pvalues), "fisher": statistic, "p": p}
    return out
