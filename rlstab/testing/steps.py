"""A step split into micro-batches gives the loss and gradients of the whole step at once.

This is rlstab's central promise (see ``rlstab.compiled``): whatever the micro-batch size, the
method is the same. A component that computes a statistic (a mean, a quantile, a count) inside
``keep``/``weights``/``evaluate`` from the micro-batch it is given, instead of declaring it as a
step quantity (``quantile_request``, ``step_sums``, an estimator's ``fit``), silently changes with
the trainer's micro-batch size. The check runs the kit's batch as one micro-batch (its own step,
and through ``gather``) and split into five uneven micro-batches, one of them empty, and compares:

- everything the step fixed (``StepStats``: counts, thresholds, the estimator's table, the hooks'
  step values, the step-level decisions) with the whole batch's;
- every step metric each micro-batch reports (``step/...``, thresholds, the hooks' values);
- one micro-batch gathered as a step with the batch computed as its own step;
- the summed loss and the gradient with the whole batch's.

**Declared per-micro-batch components.** Some methods select tokens within each micro-batch, as
their papers' code does (Clip-Cov, KL-Cov, STARE's top-P sets); they say so with
``selection: "micro_batch"``, ``CompiledObjective.per_micro_batch()`` reports them and ``explain``
prints it. For them the loss depends on the split by design, so the summed loss and gradient are
not compared; everything else above is (the statistics of the step stay step-wide), and the check
requires that the declaration reaches ``per_micro_batch()`` and ``explain()``.
"""

from __future__ import annotations

from rlstab.explain import explain
from rlstab.testing.batches import advantage_modes, make_batch
from rlstab.testing.compare import assert_close, assert_grads_close, assert_same, step_metrics, summary
from rlstab.testing.hosting import component_label, family_name, host_objective
from rlstab.testing.report import checking
from rlstab.testing.running import loss_and_grad, run_step

SPLITS = [(0, 3), (3, 8), (8, 8), (8, 12), (12, 16)]  # uneven, one empty, of a 16-row batch
EXPLAIN_NOTE = "Computed within each micro-batch instead"


def declares_per_micro_batch(objective, component) -> bool:
    """Whether the compiled objective reports the component as computed per micro-batch; AssertionError
    if the component says ``selection: micro_batch`` but the compiled objective does not report it."""
    label = component_label(objective, component)
    reported = label in objective.compile().per_micro_batch()
    if getattr(component, "selection", None) == "micro_batch" and not reported:
        raise AssertionError(
            f"declares selection 'micro_batch', but CompiledObjective.per_micro_batch() does not report {label!r} "
            "(it reports masks, reweighters and the surrogate): users would not be told its loss depends on the split"
        )
    return reported


def check_micro_batches_equal_whole_step(component, *, host=None, seed: int = 0) -> None:
    """The step's statistics, step metrics, summed loss and gradient over five micro-batches equal the whole batch's."""
    with checking(component, "check_micro_batches_equal_whole_step"):
        objective = host_objective(component, host)
        local = declares_per_micro_batch(objective, component)
        if local:
            explanation = explain(objective)
            label = component_label(objective, component)
            assert EXPLAIN_NOTE in explanation and label in explanation, (
                f"explain() does not say that {label} is computed within each micro-batch:\n{explanation}"
            )
        for mode in advantage_modes(family_name(component)):
            _split_equals_whole(objective, make_batch(objective.compile(), seed=seed, advantages=mode), local, mode)


def _split_equals_whole(objective, batch, local: bool, mode: str) -> None:
    where = f"(advantages {mode})"
    own, own_grad = loss_and_grad(objective.compile(), batch)
    one_fn = objective.compile()
    whole_stats = one_fn.gather([batch])
    one, one_grad = loss_and_grad(one_fn, batch, step=whole_stats)
    assert_close(one.loss, own.loss, f"one micro-batch gathered as a step vs the batch as its own step {where}: the loss")
    assert_grads_close(one_grad, own_grad, f"one micro-batch gathered as a step vs the batch as its own step {where}")

    bounds = _bounds(batch.response_mask.shape[0])
    stats, total, grad, outs = run_step(objective.compile(), batch, bounds)
    assert_same(summary(stats), summary(whole_stats), f"the step statistics of micro-batches {bounds} and of the whole batch {where}")
    expected = step_metrics(own.metrics)
    for (lo, hi), out in zip(bounds, outs):
        assert_same(
            step_metrics(out.metrics), expected, f"the step metrics of micro-batch {lo}:{hi} and of the whole batch {where}"
        )
    if not local:
        assert_close(total, own.loss, f"the summed loss of micro-batches {bounds} vs the whole batch {where}")
        assert_grads_close(grad, own_grad, f"micro-batches {bounds} vs the whole batch {where}")


def _bounds(B: int) -> list[tuple[int, int]]:
    if B == 16:
        return SPLITS
    third = B // 3
    return [(0, third), (third, third), (third, 2 * third), (2 * third, B)]
