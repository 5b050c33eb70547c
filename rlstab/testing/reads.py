"""A component's ``reads`` are what it reads: the compiled objective refuses a batch without them,
and a batch with nothing more is enough.

``reads`` is how an adapter learns which of its trainer's tensors to hand over (``rlstab explain``
names them, ``CompiledObjective.readers`` lists who needs what). A field read but not declared
is a crash in the middle of someone's run, on the first trainer that does not happen to supply
it; a field declared but misspelt is never checked. Every other check of the kit also runs on
batches that carry only the declared fields, so an undeclared read fails them too; this one says
so in words.
"""

from __future__ import annotations

import dataclasses

from rlstab.batch import BatchError, TokenBatch
from rlstab.testing.batches import make_batch, tensors
from rlstab.testing.hosting import host_objective
from rlstab.testing.report import checking
from rlstab.testing.running import loss_and_grad

FIELDS = {f.name for f in dataclasses.fields(TokenBatch)}
REQUIRED = {"logprobs", "response_mask"}


def check_reads_are_declared(component, *, host=None, seed: int = 0) -> None:
    """``reads`` names TokenBatch fields; without any one of them the loss raises ``BatchError`` naming it;
    with only the declared fields, the step's gather and the loss run."""
    with checking(component, "check_reads_are_declared"):
        reads = component.reads
        assert isinstance(reads, frozenset), f"reads must be a frozenset of TokenBatch field names, got {type(reads).__name__}"
        unknown = sorted(set(reads) - FIELDS)
        assert not unknown, f"reads names {unknown}, which are not TokenBatch fields ({', '.join(sorted(FIELDS))})"
        objective = host_objective(component, host)
        batch = make_batch(objective.compile(), seed=seed)
        carried = sorted(name for name, value in tensors(batch).items() if value is not None)
        try:
            objective.compile().gather([batch])
            loss_and_grad(objective.compile(), batch)
        except Exception as err:
            raise AssertionError(
                f"fails on a batch carrying only the fields its objective declares ({', '.join(carried)}): "
                f"{type(err).__name__}: {err} (does it read a field it does not declare in `reads`?)"
            ) from err
        for name in sorted(set(reads) - REQUIRED):
            fields = tensors(batch)
            if fields.get(name) is None:
                continue  # read by a path this batch does not take (an estimator's, when advantages are given)
            fields[name] = None
            try:
                objective.compile()(TokenBatch(**fields))
            except BatchError as err:
                assert name in str(err), f"without TokenBatch.{name} the loss raises a BatchError that does not name it: {err}"
            else:
                raise AssertionError(f"declares it reads TokenBatch.{name}, but a batch without it is not refused")
