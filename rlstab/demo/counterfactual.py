"""The one-step counterfactual audit (``rlstab audit --counterfactual``): does silencing a mask's tokens change the
update more than silencing as many random positive-advantage tokens would?

From one saved state (``rlstab.demo.counterfactual_states``: weights and Adam's state) and a batch of the policy's
own rollouts (``rlstab.demo.audit.collect``: ``prompts`` problems x ``group_size`` responses, sampled at
``temperature``), one optimizer update is applied each way, every time from the identical state (the weights,
Adam's moments and step count, and the objective's component state are restored before each):

- **all tokens**: the objective with its masks not acting (``stapo`` gives DAPO's update);
- **mask**: the objective's masks' tokens silenced (the valid tokens their product does not keep);
- **null**: ``null_draws`` count-matched random sets of positive-advantage tokens, as many as the mask silences;
- **probability-only**: the as many positive-advantage tokens of lowest probability.

(``rlstab.demo.counterfactual_stats`` says how the sets are drawn.) Each arm is the objective with its masks
replaced by one expression mask, ``silence: ref_logprob < -0.5``, and the arm's tokens handed in as
``TokenBatch.ref_logprobs`` (-1 on a silenced token, 0 elsewhere): the embedded trainer fills no reference
log-probabilities, so the field is free, and every arm silences through the objective's own mask machinery (the
numerator, the kept-token denominators, the metrics). A test checks that the mask arm's update is the objective's
own. The update is the trainer's (``rlstab.trainer.loop.update``): ``gather`` over the micro-batches, each
micro-batch's loss and backward, the gradient norm clipped at the state's ``max_grad_norm``, one Adam step. The
batch is on-policy: its old log-probabilities are the state's own, every ratio is 1.

Measured after each update, against the state before it:

- ``entropy_change``: the mean next-token entropy (nats, temperature 1) over the valid tokens of a fixed held-out
  set, after minus before. The set: one response to each of ``held_out`` held-out problems of the task
  (``rlstab.trainer.tasks.held_out_problems``), sampled from the state's policy at temperature 1 by a generator
  seeded with ``seed``, the same tokens for every arm (teacher-forced);
- ``batch_entropy_change``: the same over the update's own rollouts;
- ``kl``: KL(pi_before || pi_after) per held-out token, averaged: the k3 estimator
  ``r - 1 - log r``, ``r = pi_after(y_t) / pi_before(y_t)``, unbiased for each position's KL because the held-out
  tokens are sampled from pi_before at temperature 1, and never negative;
- ``update_norm``: ``||theta_after - theta_before||`` over the trainable parameters (Adam's update, clipping
  included), and ``update_angle``: its angle (degrees) to the all-tokens update;
- ``reward_change``: greedy exact-match accuracy on the held-out problems (the trainer's held-out accuracy,
  ``rlstab.trainer.loop.evaluate``: no randomness), after minus before.

Per state, the mask's (and the probability-only set's) value of each measure gets its exact two-sided p-value
within the null; states combine by Fisher's method, Holm over the measures. The first-order prediction
``Delta H ~= -eta Cov(log pi, A)`` gives the sign of ``entropy_change(mask) - entropy_change(all tokens)`` as the
sign of the silenced tokens' covariance contribution ``c_S``; the audit says whether the measured sign agrees, for
the mask and for each null draw.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable

from rlstab.batch import TokenBatch
from rlstab.compiler.plan import Plan
from rlstab.demo.counterfactual_stats import (
    exact_p_value,
    fisher,
    lowest_probability_set,
    random_sets,
    rank,
    sign,
    silenced_covariance,
)
from rlstab.lazy import torch
from rlstab.objective import Objective

MEASURES = ("entropy_change", "batch_entropy_change", "kl", "update_norm", "update_angle", "reward_change")
"""What each update is measured by (module docstring)."""
COMPARED = ("mask", "probability_only")
"""The arms ranked within the null."""
CARRIER = "ref_logprob < -0.5"
"""The arms' mask: silence the tokens whose ``TokenBatch.ref_logprobs`` is -1 (module docstring)."""
UNSUPPLIED = ("ref_logprobs", "sum_pi_squared", "proxy_logprobs")
"""Batch fields the audit's update does not supply (the first carries the arms' tokens)."""
MICRO_BATCH = 64
"""Responses per micro-batch of the update and of the no-grad passes."""
PROGRESS_EVERY_S = 60.0
"""A progress line at least this often while null draws run (and after every 10th): a SmolLM2 draw takes minutes."""


def problems_of(objective: Objective) -> list[str]:
    """Why ``objective`` cannot be audited this way (empty when it can): no mask, a mask that rejects rows, a
    field the audit does not supply, advantages the trainer gives."""
    from rlstab.advantages import Given

    plan = Plan.of(objective)
    out = []
    if not objective.masks:
        out.append("it has no mask to audit (masks: []); give an objective with one, e.g. stapo")
    if plan.rejections:
        out.append("its masks reject rows (a rollout rejection), which the audit cannot silence token by token")
    read = sorted({name for _, name in plan.reads} & set(UNSUPPLIED))
    if read:
        out.append(f"it reads TokenBatch.{read[0]}, which the counterfactual update does not supply")
    if isinstance(objective.advantage, Given):
        out.append("its advantages are given by the trainer (advantage: given); the audit estimates them from rewards")
    return out


def carrier_objective(objective: Objective) -> Objective:
    """``objective`` with its masks replaced by the carrier mask and its shadow masks left out."""
    from rlstab.masks import Expression

    return objective.model_copy(update={"masks": [Expression(silence=CARRIER)], "shadow_masks": []})


# ----------------------------------------------------------------------------- one update


class Updater:
    """Applies one optimizer update from a fixed state, restoring it first, and measures what it changed."""

    def __init__(self, policy, task, objective: Objective, state, sample, held_out: list, *, seed: int,
                 micro_batch: int = MICRO_BATCH):
        from rlstab.demo.counterfactual_states import set_weights
        from rlstab.regularisers import EntropyBonus
        from rlstab.trainer.loop import evaluate
        from rlstab.trainer.policy import Rollout

        self.policy, self.task, self.sample, self.state = policy, task, sample, state
        self.loss_fn = carrier_objective(objective).compile()
        self.objective_state = self.loss_fn.state_dict()
        self.entropy_grad = any(isinstance(r, EntropyBonus) for r in objective.regularisers)
        self.dual_stream = objective.dual_stream is not None
        self.norms = torch.ones(sample.responses) if "grad_sq_norms" in objective.advantage.reads else None
        set_weights(policy, state.weights)
        self.params = policy.trainable_parameters()
        self.before = [p.detach().clone() for p in self.params]
        self.optimizer = torch.optim.Adam(self.params, lr=state.lr)
        if state.optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(state.optimizer))
        self.optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        codec = policy.codec
        self.rollout = Rollout([codec.encode(sample.problems[int(g)].prompt) for g in sample.group_ids],
                               sample.response_ids, sample.response_mask, sample.rollout_logprobs)
        self.parts = [list(range(i, min(i + micro_batch, sample.responses)))
                      for i in range(0, sample.responses, micro_batch)]
        self.held_out = held_out
        with torch.no_grad():
            prompts = [codec.encode(p.prompt) for p in held_out]
            generator = torch.Generator().manual_seed(seed)
            self.held_rollout = policy.sample(prompts, max_new_tokens=task.max_new_tokens, temperature=1.0,
                                              generator=generator)
            self.held_logprobs, self.held_entropy = self._stats(self.held_rollout)
            self.reward_before = evaluate(policy, task, held_out)
        self.held_valid = self.held_rollout.response_mask
        self.batch_entropy_before = _mean(sample.entropy, sample.response_mask)
        self.reference: torch.Tensor | None = None  # the all-tokens update, for the angles

    def _stats(self, rollout) -> tuple[torch.Tensor, torch.Tensor]:
        rows = list(range(len(rollout.prompt_ids)))
        parts = [self.policy.token_stats(rollout.rows(rows[i:i + MICRO_BATCH])) for i in range(0, len(rows), MICRO_BATCH)]
        return torch.cat([p[0] for p in parts]).detach().float(), torch.cat([p[1] for p in parts]).detach().float()

    def restore(self) -> None:
        """The state before any update: weights, Adam's state (a fresh copy: Adam updates it in place), the
        objective's component state."""
        with torch.no_grad():
            for p, w in zip(self.params, self.before):
                p.copy_(w)
        self.optimizer.load_state_dict(copy.deepcopy(self.optimizer_state))
        self.loss_fn.load_state_dict(self.objective_state)

    def _batch(self, rows: list[int], logprobs, entropy, carrier) -> TokenBatch:
        s = self.sample
        idx = torch.as_tensor(rows, dtype=torch.long)
        return TokenBatch(
            logprobs=logprobs, old_logprobs=s.logprobs[idx], response_mask=s.response_mask[idx], entropy=entropy,
            rollout_logprobs=None if s.rollout_logprobs is None else s.rollout_logprobs[idx],
            ref_logprobs=carrier[idx], rewards=s.rewards[idx], group_ids=s.group_ids[idx],
            grad_sq_norms=None if self.norms is None else self.norms[idx],
            is_branch=torch.zeros(len(rows), dtype=torch.bool) if self.dual_stream else None,
        )

    def update(self, silenced: torch.Tensor) -> torch.Tensor:
        """Restore the state, apply one update with ``silenced`` (``[N, T]`` bool) silenced; returns the update
        ``theta_after - theta_before`` (flat, float64)."""
        from rlstab.trainer.loop import scaled_step

        self.restore()
        s = self.sample
        carrier = torch.where(silenced, -1.0, 0.0).float()
        stats = self.loss_fn.gather([self._batch(rows, s.logprobs[rows], s.entropy[rows], carrier) for rows in self.parts])
        self.optimizer.zero_grad(set_to_none=True)
        counted = 0.0
        for rows in self.parts:
            logprobs, entropy = self.policy.token_stats(self.rollout.rows(rows), entropy_grad=self.entropy_grad)
            out = self.loss_fn(self._batch(rows, logprobs, entropy if self.entropy_grad else entropy.detach(), carrier),
                               step=stats)
            out.loss.backward()
            counted += float(out.metrics["mask/expression/silenced"])
        wanted = int((silenced & s.response_mask).sum())
        if counted != wanted:  # the loss silenced exactly the arm's tokens
            raise AssertionError(f"the update silenced {counted:g} tokens, the arm {wanted}")
        torch.nn.utils.clip_grad_norm_(self.params, self.state.max_grad_norm)
        scaled_step(self.optimizer, stats.lr_scale)
        return torch.cat([(p.detach() - b).flatten().double() for p, b in zip(self.params, self.before)])

    def measure(self, silenced: torch.Tensor) -> tuple[dict[str, float], torch.Tensor]:
        """One update with ``silenced`` silenced: its :data:`MEASURES`, and the update itself."""
        from rlstab.trainer.loop import evaluate

        delta = self.update(silenced)
        with torch.no_grad():
            held_logprobs, held_entropy = self._stats(self.held_rollout)
            _, batch_entropy = self._stats(self.rollout)
            reward = evaluate(self.policy, self.task, self.held_out)
        log_ratio = (held_logprobs - self.held_logprobs).double()
        k3 = log_ratio.exp() - 1 - log_ratio
        norm = float(delta.norm())
        if self.reference is None:
            angle = 0.0
        else:
            denominator = norm * float(self.reference.norm())
            cosine = float(delta @ self.reference) / denominator if denominator > 0 else 1.0
            angle = math.degrees(math.acos(max(-1.0, min(1.0, cosine))))
        return {
            "entropy_change": _mean(held_entropy, self.held_valid) - _mean(self.held_entropy, self.held_valid),
            "batch_entropy_change": _mean(batch_entropy, self.sample.response_mask) - self.batch_entropy_before,
            "kl": float(k3[self.held_valid].mean()) if bool(self.held_valid.any()) else 0.0,
            "update_norm": norm,
            "update_angle": angle,
            "reward_change": reward - self.reward_before,
        }, delta


def _mean(values: torch.Tensor, valid: torch.Tensor) -> float:
    return float(values[valid].double().mean()) if bool(valid.any()) else 0.0


# ----------------------------------------------------------------------------- one state


def mask_tokens(sample, objective: Objective) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(silenced, positive, advantages)``, each ``[N, T]``: the valid tokens the objective's (acting) masks do not
    keep, on the sample as one step; the valid tokens with A > 0; each token's advantage (the objective's
    estimator, from the rewards)."""
    fn = objective.compile()
    valid = sample.response_mask
    batch = TokenBatch(logprobs=sample.logprobs, old_logprobs=sample.logprobs, response_mask=valid,
                       entropy=sample.entropy, rollout_logprobs=sample.rollout_logprobs, rewards=sample.rewards,
                       group_ids=sample.group_ids,
                       grad_sq_norms=torch.ones(sample.responses) if "grad_sq_norms" in objective.advantage.reads else None,
                       is_branch=torch.zeros(sample.responses, dtype=torch.bool) if objective.dual_stream else None)
    stats = fn.gather([batch], distributed=False)
    keeps = fn.mask_keeps(batch, stats)
    kept = torch.ones_like(sample.logprobs)
    for label in fn.mask_labels:
        kept = kept * keeps[label]
    advantages = objective.advantage.apply(stats.advantage, sample.rewards, sample.group_ids, valid.any(-1))
    advantages = (advantages[:, None] if advantages.dim() == 1 else advantages).expand_as(sample.logprobs).float()
    return valid & (kept == 0), valid & (advantages > 0), advantages


def audit_state(policy, task, objective: Objective, state, *, prompts: int, group_size: int, temperature: float,
                seed: int, null_draws: int, held_out: int, index: int = 0,
                log: Callable[[str], None] | None = None) -> dict:
    """Every arm from ``state``, measured; the mask's and the probability-only set's p-values; the first-order
    check. ``index`` (the state's place in the audit) seeds the null draws with ``seed * 100_000 + index``."""
    from rlstab.demo.audit import collect, silenced_texts
    from rlstab.demo.counterfactual_states import set_weights
    from rlstab.trainer.tasks import held_out_problems

    started = time.perf_counter()
    set_weights(policy, state.weights)
    sample = collect(policy, task, prompts=prompts, group_size=group_size, seed=seed, temperature=temperature)
    silenced, positive, advantages = mask_tokens(sample, objective)
    m = int(silenced.sum())
    shape = sample.response_mask.shape
    candidates = positive.flatten().nonzero()[:, 0]
    draws = random_sets(candidates, min(m, candidates.numel()), null_draws,
                        torch.Generator().manual_seed(seed * 100_000 + index))

    def as_mask(flat: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(shape[0] * shape[1], dtype=torch.bool)
        out[flat] = True
        return out.view(shape)

    low = as_mask(lowest_probability_set(sample.logprobs.flatten(), candidates, min(m, candidates.numel())))
    problems = held_out_problems(task, held_out)
    updater = Updater(policy, task, objective, state, sample, problems, seed=seed)
    say = log or (lambda line: None)
    say(f"counterfactual: {state.label}: {sample.tokens:,} tokens, {int(positive.sum()):,} with A > 0, the mask "
        f"silences {m}; {null_draws + 4 if m else 2} updates")
    arms = {}
    nothing = torch.zeros_like(silenced)
    arms["all_tokens"], updater.reference = updater.measure(nothing)  # the angles' reference
    repeat = updater.update(nothing)  # the same update again: restoring the state makes it identical
    if m == 0:  # every arm silences nothing: each is the all-tokens update, and there is nothing to test
        draws = []
        arms["mask"], arms["probability_only"] = dict(arms["all_tokens"]), dict(arms["all_tokens"])
    else:
        arms["mask"], _ = updater.measure(silenced)
        arms["probability_only"], _ = updater.measure(low)
    say(f"counterfactual: {state.label}: the arms measured ({time.perf_counter() - started:.0f} s)")
    said = time.perf_counter()
    null = {name: [] for name in MEASURES}
    null_covariance = []
    for k, flat in enumerate(draws):
        measured, _ = updater.measure(as_mask(flat))
        for name in MEASURES:
            null[name].append(measured[name])
        null_covariance.append(silenced_covariance(sample.logprobs, advantages, sample.response_mask, as_mask(flat)))
        if (k + 1) % 10 == 0 or k + 1 == len(draws) or time.perf_counter() - said >= PROGRESS_EVERY_S:
            said = time.perf_counter()
            say(f"counterfactual: {state.label}: null draw {k + 1}/{len(draws)} "
                f"({time.perf_counter() - started:.0f} s)")
    updater.restore()

    tests = None
    if m > 0:
        tests = {arm: {name: _test(arms[arm][name], null[name]) for name in MEASURES} for arm in COMPARED}
    c_mask = silenced_covariance(sample.logprobs, advantages, sample.response_mask, silenced)
    first_order = {
        "covariance": c_mask,
        "predicted_sign": sign(c_mask),
        **{f"measured_{where}": arms["mask"][name] - arms["all_tokens"][name]
           for where, name in (("held_out", "entropy_change"), ("batch", "batch_entropy_change"))},
    }
    for where, name in (("held_out", "entropy_change"), ("batch", "batch_entropy_change")):
        measured = first_order[f"measured_{where}"]
        first_order[f"agrees_{where}"] = None if m == 0 or sign(c_mask) == 0 or sign(measured) == 0 else \
            sign(c_mask) == sign(measured)
        pairs = [(sign(c), sign(x - arms["all_tokens"][name])) for c, x in zip(null_covariance, null[name])]
        pairs = [(c, x) for c, x in pairs if c != 0 and x != 0]
        first_order[f"null_agree_{where}"] = sum(c == x for c, x in pairs)
        first_order[f"null_decided_{where}"] = len(pairs)
    return {
        "label": state.label,
        "run": state.run,
        "run_seed": state.run_seed,
        "step": state.step,
        "lr": state.lr,
        "max_grad_norm": state.max_grad_norm,
        "fresh_adam": state.optimizer is None,
        "responses": sample.responses,
        "tokens": sample.tokens,
        "positive_tokens": int(positive.sum()),
        "silenced": m,
        "null_draws": len(draws),
        "silenced_outside_positive": int((silenced & ~positive).sum()),
        "probability_only_overlap": int((silenced & low).sum()),
        "silenced_tokens": silenced_texts(sample, silenced),
        "mean_reward": float(sample.rewards.mean()),
        "mixed_groups": sample.mixed_groups,
        "held_out_problems": len(problems),
        "held_out_tokens": int(updater.held_valid.sum()),
        "before": {"held_out_entropy": _mean(updater.held_entropy, updater.held_valid),
                   "held_out_reward": updater.reward_before, "batch_entropy": updater.batch_entropy_before},
        "restore_check": float((repeat - updater.reference).abs().max()) if repeat.numel() else 0.0,
        "arms": arms,
        "null": null,
        "tests": tests,
        "first_order": first_order,
        "seconds": time.perf_counter() - started,
    }


def _test(observed: float, null: list[float]) -> dict:
    ordered = sorted(null)
    k = len(ordered)
    return {
        "p": exact_p_value(observed, null),
        "rank": rank(observed, null),
        "null_median": (ordered[(k - 1) // 2] + ordered[k // 2]) / 2,
        "null_low": ordered[int(0.025 * (k - 1) + 0.5)],
        "null_high": ordered[int(0.975 * (k - 1) + 0.5)],
    }


# ----------------------------------------------------------------------------- all states

METHODS = {
    "arms": "one optimizer update from each state, restored before each (weights, Adam's state, the objective's "
            "state): all tokens (the objective's masks not acting); the mask's tokens silenced; K count-matched "
            "random sets of positive-advantage tokens; the as many positive-advantage tokens of lowest probability",
    "null": "each set: m distinct tokens drawn uniformly without replacement among the valid tokens with A > 0 "
            "(torch.randperm, a torch.Generator seeded with seed * 100000 + the state's index)",
    "entropy_change": "mean next-token entropy (nats) over the held-out tokens, after minus before; the held-out "
                      "tokens: one response per held-out problem, sampled from the state's policy at temperature 1 "
                      "(generator seeded with seed), the same for every arm",
    "batch_entropy_change": "the same over the update's own rollouts",
    "kl": "KL(before || after) per held-out token, averaged (k3 = r - 1 - log r, r = pi_after / pi_before)",
    "update_norm": "norm of theta_after - theta_before over the trainable parameters",
    "update_angle": "angle (degrees) between the arm's update and the all-tokens update",
    "reward_change": "greedy exact-match accuracy on the held-out problems, after minus before",
    "p": "two-sided exact: (1 + #{k: |x_k - c| >= |x_0 - c|}) / (K + 1), c the median of the K + 1 values",
    "combination": "Fisher: X = -2 sum ln p over the states where the mask silenced a token, p = P(chi2 with 2S "
                   "degrees of freedom >= X); Holm over the measures",
    "first_order": "Delta H ~= -eta Cov(log pi, A) over the update's tokens (arXiv 2505.22617; stated by issue 39 "
                   "for STAPO): silencing S changes Delta H by about +eta c_S, c_S = (1/N) sum_{t in S} "
                   "(log pi_t - mean log pi)(A_t - mean A); predicted sign = sign(c_S), measured sign = "
                   "sign(Delta H(mask) - Delta H(all tokens))",
}
"""How each number of ``counterfactual.json`` is made, stored in it."""


def counterfactual_audit(policy, task, objective: Objective, name: str, states, *, source: dict, prompts: int,
                         group_size: int, temperature: float, seed: int, null_draws: int, held_out: int,
                         log: Callable[[str], None] | None = None) -> dict:
    """:func:`audit_state` for each of ``states`` (``State`` objects, or callables returning one, loaded in turn),
    then :func:`combine`: the content of ``counterfactual.json``."""
    started = time.perf_counter()
    results = []
    for index, state in enumerate(states):
        state = state() if callable(state) else state
        results.append(audit_state(policy, task, objective, state, prompts=prompts, group_size=group_size,
                                   temperature=temperature, seed=seed, null_draws=null_draws, held_out=held_out,
                                   index=index, log=log))
    return {
        "source": source,
        "objective": name,
        "mask": [m.describe() for m in objective.masks],
        "settings": {"prompts": prompts, "group_size": group_size, "temperature": temperature, "seed": seed,
                     "null_draws": null_draws, "held_out": held_out, "measures": list(MEASURES)},
        "methods": METHODS,
        "states": results,
        "combined": combine(results),
        "seconds": time.perf_counter() - started,
    }

def combine(states: list[dict]) -> dict:
    """Fisher's combination of each measure's per-state p-values (the states where the mask silenced a token), Holm
    over the measures, per compared arm; and the first-order prediction's tally."""
    from rlstab.lab.statistics import holm

    tested = [s for s in states if s["tests"] is not None]
    out: dict = {"states": len(tested), "untested_states": [s["label"] for s in states if s["tests"] is None]}
    for arm in COMPARED:
        per_measure = {}
        for name in MEASURES:
            tests = [s["tests"][arm][name] for s in tested]
            statistic, p = fisher([t["p"] for t in tests])
            per_measure[name] = {
                "fisher": statistic, "p": p,
                "above_null_median": sum(s["arms"][arm][name] > t["null_median"] for s, t in zip(tested, tests)),
                "below_null_median": sum(s["arms"][arm][name] < t["null_median"] for s, t in zip(tested, tests)),
            }
        for name, adjusted in zip(MEASURES, holm([per_measure[n]["p"] for n in MEASURES])):
            per_measure[name]["p_holm"] = adjusted
        out[arm] = per_measure
    tally = {}
    for where in ("held_out", "batch"):
        decided = [s["first_order"][f"agrees_{where}"] for s in tested if s["first_order"][f"agrees_{where}"] is not None]
        tally[where] = {
            "agree": sum(decided), "decided": len(decided),
            "null_agree": sum(s["first_order"][f"null_agree_{where}"] for s in tested),
            "null_decided": sum(s["first_order"][f"null_decided_{where}"] for s in tested),
        }
    out["first_order"] = tally
    return out
