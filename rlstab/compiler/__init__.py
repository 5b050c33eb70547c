"""The compiler, by phase: how an objective becomes its loss (``rlstab.compiled.CompiledObjective`` holds them).

- ``plan``: what the loss reads, labels and keeps state for, read from the objective (no torch).
- ``inputs``: the batch's checks and its tokens; ``keeps``: which tokens the masks keep;
  ``offending_inputs``: values that cannot be right (not finite, beyond their field's limits), zeroed
  on padding and raised on valid tokens; ``advantages``: the estimator's fit and its use.
- the step phase: ``step_phase`` (``gather``'s statistics), ``counted`` (a counted mask's order
  statistic: ``random_silence``), ``states`` (the stateful components'
  step, one loop for ``gather`` and ``begin_training_batch``), ``step_stats`` (the frozen result).
- the loss phase: ``loss_phase`` (the loss), ``loss_metrics`` (its metrics, each with how it
  combines over micro-batches), ``loss_output`` (the inputs' finiteness check on the metrics' read).
- ``lopti_phases``: the two objectives of a Lopti step, compiled and run one after the other.

Importing this package, ``plan`` or ``lopti_phases`` imports no torch.
"""
