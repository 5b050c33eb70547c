"""A mask written as a condition over token features (see docs/expressions.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlstab.expression import ExpressionError, Program, compile_expression
from rlstab.lazy import torch
from rlstab.masks.base import Mask
from rlstab.masks.s2t import Interpolation
from rlstab.tokens import Tokens


class Expression(Mask):
    r"""A token mask given as a condition, e.g. S2T (STAPO, arXiv 2602.15620) in one line:

    ```yaml
    masks:
      - kind: expression
        silence: "advantage > 0 and probability < 0.002 and entropy < quantile(entropy, 0.8)"
    ```

    Give exactly one of ``silence`` (the condition names the tokens that do *not* train:
    $M_{i,t} = 1 - [\text{cond}]$) and ``keep`` (it names the tokens that train:
    $M_{i,t} = [\text{cond}]$). Padding never trains either way.

    The condition reads per-token features (``probability``, ``logprob``, ``entropy``,
    ``surprisal``, ``advantage``, ``ratio``, ``old_probability``, ``old_logprob``,
    ``rollout_probability``, ``rollout_logprob``, ``ref_logprob``, ``position``, ``length``) with
    comparisons, ``and``/``or``/``not``, ``+ - * /``, ``abs log exp min max``, and step quantiles
    ``quantile(x, q[, where])``: the q-quantile of ``x`` over every valid token of the step
    [where the condition holds], exact over micro-batches and ranks (the same
    [`Population`][rlstab.quantile.Population] as S2T), one ``mask/<label>/<name>`` metric each
    (``quantile(entropy, 0.8)`` reports as ``quantile_entropy_0.8``). When a quantile's
    population is empty in a step, the mask keeps every token that step (as S2T does).

    The expression is parsed by rlstab's own parser and compiled to torch operations; nothing in
    it is evaluated by Python. Errors name the YAML path and point at the column.
    """

    # Exactly one of silence and keep (the validator below), said in the JSON Schema too.
    model_config = ConfigDict(
        serialize_by_alias=True,
        json_schema_extra={"oneOf": [
            {"required": [name], "properties": {name: {"type": "string"}}} for name in ("silence", "keep")
        ]},
    )

    kind: Literal["expression"] = "expression"
    silence: str | None = None
    """Condition on the tokens that do not train (exclusive with ``keep``)."""
    keep_when: str | None = Field(None, alias="keep")
    """``keep:`` in YAML: condition on the tokens that train (exclusive with ``silence``)."""
    interpolation: Interpolation = "linear"
    """How ``quantile(...)`` interpolates between order statistics (as ``torch.quantile``)."""

    _program: Program = PrivateAttr()

    @field_validator("silence", "keep_when")
    @classmethod
    def _parses(cls, text: str | None) -> str | None:
        if text is not None:
            try:
                compile_expression(text)
            except ExpressionError as err:
                raise PydanticCustomError("expression", "{message}", {"message": err.line}) from None
        return text

    @model_validator(mode="after")
    def _exactly_one(self) -> Expression:
        if (self.silence is None) == (self.keep_when is None):
            raise PydanticCustomError(
                "expression", "give exactly one of 'silence' (tokens that do not train) and 'keep' (tokens that train)"
            )
        return self

    def model_post_init(self, context) -> None:
        text = self.silence if self.silence is not None else self.keep_when
        if text is not None:  # None: _exactly_one, which pydantic runs after this, refuses the mask
            self._program = compile_expression(text)

    @property
    def program(self) -> Program:
        """The compiled condition."""
        return self._program

    @property
    def reads(self) -> frozenset[str]:  # depends on the features the condition uses
        return self._program.reads

    @property
    def threshold_names(self) -> tuple[str, ...]:
        """Metric name of each step quantile, in the order of ``quantile_request``."""
        return tuple(spec.metric for spec in self._program.quantiles)

    def quantile_request(self, t: Tokens):
        """A list of ``(values, include, q)``, one per ``quantile(...)``, or None when there is none."""
        return self._program.quantile_requests(t) or None

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        if self._program.quantiles and (threshold is None or any(thr is None for thr in threshold)):
            return torch.ones_like(t.logprobs)  # a quantile over an empty population: nothing is silenced
        holds = self._program.evaluate(t, () if threshold is None else tuple(threshold))
        return holds if self.silence is None else holds.neg_().add_(1.0)  # holds is a fresh tensor

    def describe(self) -> str:
        verb = "silence" if self.silence is not None else "keep"
        where = ""
        if self._program.quantiles:
            where = f" (quantiles over the step's valid tokens, {self.interpolation})"
        return f"expression: {verb} iff {self._program.canonical}{where}"
