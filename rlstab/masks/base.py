"""What every token mask provides.

A mask returns a float ``keep`` tensor, 1.0 where the token trains and 0.0 where it is silenced.
Masks of an objective are AND-ed (multiplied). A mask whose rule depends on the whole step (an
entropy quantile) names a *population* of values; the compiled objective takes the quantile over
the whole step (every micro-batch, every rank) and hands the frozen threshold back to ``keep``.

A *counted* mask (``counted = True``: ``random_silence``) silences a number of tokens fixed over the
step instead: it provides ``candidates(t)``, ``keys(t)`` and ``target(n, matched)``, and the step
hands ``keep`` the tuple ``(target, candidates, cut, share)`` (see ``rlstab.compiler.counted``): its
keep is 0 or 1 but at the cut, where candidates with tied keys share what is left of the count.
"""

from __future__ import annotations

from typing import ClassVar

from rlstab.components import Component
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class Mask(Component):
    """Base class of token masks (``masks:`` in an objective)."""

    threshold_name: ClassVar[str] = "threshold"
    counted: ClassVar[bool] = False
    """Whether the step phase finds this mask's threshold as an order statistic of ``keys`` (see above)."""

    def quantile_request(self, t: Tokens) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """``(values, include, q)``: the step population whose q-quantile this mask needs, or None."""
        return None

    def keep(self, t: Tokens, threshold: torch.Tensor | None) -> torch.Tensor:
        """``[B, T]`` float32, 1.0 = the token trains, 0.0 = silenced. On padding any finite value (it is
        multiplied by 0 there, and NaN * 0 is NaN: compute from padding's inputs with ``torch.where``).

        ``threshold`` is the step's frozen q-quantile of what ``quantile_request`` asked for (a 0-d
        tensor; a tuple of them for a list of requests), or ``(target, candidates, cut)`` for a counted
        mask. The threshold is None when there is nothing to take it over: a step with no valid token,
        or none that the request's ``include`` selects (a tuple then holds None in that place); and
        always for a mask without a ``quantile_request``. Handle it: the built-in masks then keep
        every token.
        """
        raise NotImplementedError


def below(x: torch.Tensor, bound: float | torch.Tensor) -> torch.Tensor:
    """Float 0/1 indicator of ``x < bound`` (a float-output compare is ~4x cheaper than bool)."""
    return torch.lt(x, bound, out=torch.empty_like(x))


def at_least(x: torch.Tensor, bound: float | torch.Tensor) -> torch.Tensor:
    """Float 0/1 indicator of ``x >= bound``."""
    return torch.ge(x, bound, out=torch.empty_like(x))


def positive(x: torch.Tensor) -> torch.Tensor:
    """Float 0/1 indicator of ``x > 0``."""
    return torch.gt(x, 0.0, out=torch.empty_like(x))
