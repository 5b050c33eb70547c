r"""The PPO clip range, written once: its bounds, the dual-clip and delta rules, their checks and their text.

PPO's clip (Schulman et al., arXiv 1707.06347, eq. 7) keeps a token's ratio $r$ within
$[1-\epsilon_{low}, 1+\epsilon_{high}]$ on the side its advantage pushes. Two rules cap the other side, the
unclipped branch of a negative-advantage token:

- dual-clip (Ye et al., arXiv 1912.09729): for $A < 0$, $l \leftarrow \min(l, -cA)$, i.e. the ratio is
  capped at $c$, which must exceed every upper bound of the clip (else it would cap inside the range);
- delta (two-sided clipping; INTELLECT-2, arXiv 2505.07291, section 4.1; TRL 1.16's ``GRPOConfig.delta``): the
  unclipped branch's ratio is capped at $\delta$, $l = \max(-A\min(r, \delta), -A\,\mathrm{clip}(r, \dots))$,
  so that for $A > 0$ the upper bound is $\min(1+\epsilon_{high}, \delta)$ and for $A < 0$ the cap is
  $\max(1+\epsilon_{high}, \delta)$. Both bound the same branch: one of them at most.

``DualClipped`` holds the dual-clip and delta rules, their check and their text, for any surrogate with a
``dual_clip`` field (BAPO, whose bounds change every step, among them); ``ClipRange`` adds the bounds
``1 - eps_low``, ``1 + eps_high`` (PPO clip, GSPO, GPPO). Each surrogate declares the fields itself, with its
own defaults and their sources (a class created without them is refused): fields declared here would come
before ``kind`` in the schema, the YAML and the reference tables, which read each field's bounds from its own
``Field(...)``.
"""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from rlstab.clipping.base import Surrogate


class DualClipped(Surrogate):
    """A surrogate that may cap the ratio of negative-advantage tokens: its ``dual_clip`` (or ``delta``) rule.

    A subclass declares ``dual_clip: float | None = Field(..., gt=1.0)`` and says, in ``_highest_upper()``,
    which upper bound the dual-clip must exceed; one that offers TRL's ``delta`` declares ``delta`` too and
    returns it from ``_delta_cap()``. Checks, in this order: the subclass's own ``_check_ranges()`` (its bounds
    in order), then ``dual_clip > highest upper bound``, then not both ``dual_clip`` and ``delta``.
    """

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "kind" in cls.model_fields and "dual_clip" not in cls.model_fields:  # a component, not a base
            raise TypeError(f"{cls.__name__} derives from DualClipped but has no field dual_clip")

    def _highest_upper(self) -> tuple[str, float]:
        """``(its name, its value)``: the highest upper bound of the clip, which ``dual_clip`` must exceed."""
        raise NotImplementedError

    def _delta_cap(self) -> float | None:
        """The two-sided clip's ``delta``, for a surrogate that offers one; None (the default) for the others."""
        return None

    def _check_ranges(self) -> None:
        """The subclass's checks of its own bounds, run before the dual-clip rule (none by default)."""

    @model_validator(mode="after")
    def _clip_rules(self):
        self._check_ranges()
        name, bound = self._highest_upper()
        if self.dual_clip is not None and self.dual_clip <= bound:
            raise ValueError(f"dual_clip ({self.dual_clip}) must exceed {name} ({bound})")
        delta = self._delta_cap()
        if self.dual_clip is not None and delta is not None:
            raise ValueError(
                f"dual_clip ({self.dual_clip}) and delta ({delta}) both bound the ratio of negative-advantage "
                "tokens; set one (delta > 1 + eps_high is dual_clip = delta)"
            )
        return self

    def dual_clip_text(self) -> str:
        """The dual-clip's part of ``describe()``: empty when it is off."""
        return "" if self.dual_clip is None else f"; for A < 0, l = min(l, -{self.dual_clip:g} A) (dual-clip)"


class ClipRange(DualClipped):
    """A surrogate clipping the ratio to ``[1 - eps_low, 1 + eps_high]``, with the dual-clip or delta rule.

    A subclass declares ``eps_low`` (in [0, 1)), ``eps_high`` (in [0, 10]) and ``dual_clip`` with its defaults.
    """

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        missing = [name for name in ("eps_low", "eps_high") if name not in cls.model_fields]
        if "kind" in cls.model_fields and missing:  # a component, not a base
            raise TypeError(f"{cls.__name__} derives from ClipRange but has no field {', '.join(missing)}")

    def _highest_upper(self) -> tuple[str, float]:
        return "1 + eps_high", 1.0 + self.eps_high

    def ratio_bounds(self) -> tuple[float, float, float | None]:
        """``(lower, upper for A > 0, upper for A < 0)`` of the ratio's clip interval; the last is None (no cap)
        without dual-clip and delta. With delta: ``upper = min(1 + eps_high, delta)``, ``cap = max(1 + eps_high,
        delta)``."""
        lower, upper = 1.0 - self.eps_low, 1.0 + self.eps_high
        delta = self._delta_cap()
        if delta is not None:
            return lower, min(upper, delta), max(upper, delta)
        return lower, upper, self.dual_clip

    def clip_text(self, ratio: str = "r") -> str:
        """``describe()``'s formula of the clip of ``ratio``, with its dual-clip or delta."""
        clip = f"clip({ratio}, {1 - self.eps_low:g}, {1 + self.eps_high:g})"
        delta = self._delta_cap()
        if delta is not None:
            return f"l = max(-A min({ratio}, {delta:g}), -A {clip}) (two-sided clip, delta)"
        return f"l = max(-A {ratio}, -A {clip})" + self.dual_clip_text()
