"""DPPO: a trust region measured as a divergence between the old and new token distributions."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class _DPPO(Surrogate):
    r"""Shared by the Binary-TV and Binary-KL variants; ``_outside`` says which tokens left the region."""

    divergence: ClassVar[str]
    delta_low: float
    delta_high: float
    is_cap: float | None = Field(None, gt=0.0)
    """Truncation C of the (detached) importance weight, min(r, C); null: none (the paper's runs)."""
    sides: Literal["advantage", "both"] = "advantage"
    """Which side of the region masks: the one the advantage pushes towards (the paper), or both whatever the sign (IPO)."""
    value: Literal["log_prob", "ratio"] = "log_prob"
    """The loss value: veRL's -M A sg(w) log p, or prime-rl's -M A r (the same gradient; needs is_cap null)."""

    _later_fields: ClassVar[tuple[str, ...]] = ("sides", "value")

    @model_validator(mode="after")
    def _ratio_value_untruncated(self):
        if self.value == "ratio" and self.is_cap is not None:
            raise ValueError(f"value: ratio needs is_cap: null (-M A min(r, {self.is_cap:g}) has another gradient)")
        return self

    def _keep(self, t: Tokens) -> torch.Tensor:
        """1.0 where the token's update stays inside the trust region (or, one-sided, moves back towards it)."""
        p, p_old = torch.exp(t.logprobs), torch.exp(t.old_logprobs)
        keep_up, keep_down = self._inside(t, p, p_old)
        if self.sides == "both":
            return (keep_up & keep_down).to(torch.float32)
        return torch.where(t.advantage_rows > 0, keep_up, keep_down).to(torch.float32)

    def _inside(self, t: Tokens, p: torch.Tensor, p_old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        r, adv = t.ratio, t.advantage_rows
        keep = self._keep(t)
        is_weight = r if self.is_cap is None else torch.clamp(r, max=self.is_cap)
        grad = (weight * adv.neg()) * keep * is_weight  # weight first: a zero weight silences padding
        # The value in veRL's (prime-rl's) order of products (float32 rounding then matches to ~1e-7 of each
        # term); `where` rather than a multiply, so that huge finite padding cannot turn into inf * 0.
        if self.value == "ratio":
            per_token = torch.where(t.valid_bool, (keep * adv * r).neg(), 0.0)
        else:
            per_token = torch.where(t.valid_bool, adv.neg() * is_weight * t.logprobs * keep, 0.0)
        loss = torch.dot(weight.reshape(-1), per_token.reshape(-1))

        valid = t.valid
        outside = (1.0 - keep) * valid
        pos = indicator(torch.gt, adv, 0.0).expand_as(valid)
        n_pos = (outside * pos).sum()
        counts = {"clip/high_fraction": n_pos, "clip/low_fraction": outside.sum() - n_pos}
        if self.is_cap is not None:
            counts["clip/truncated_fraction"] = (indicator(torch.gt, r, self.is_cap) * keep * valid).sum()
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        weight = "r" if self.is_cap is None else f"min(r, {self.is_cap:g})"
        loss = "-M A r (gradient -M A r grad log p)" if self.value == "ratio" else f"-M A sg({weight}) log p"
        region = (f"up {self.delta_high:g}, down {self.delta_low:g}, whatever the sign of A" if self.sides == "both"
                  else f"A > 0: {self.delta_high:g}, A <= 0: {self.delta_low:g}")
        return f"{self.kind}: l = {loss}, M = 0 where the update leaves the {self.divergence} trust region ({region})"


class DPPOBinaryTV(_DPPO):
    r"""DPPO-Binary-TV (Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv 2602.04879).

    PPO bounds the ratio $r = \pi/\pi_{old}$ of the sampled token, which over-restricts rare
    tokens (1e-5 to 1e-3 is a ratio of 100 but a negligible move) and under-restricts common ones
    (0.99 to 0.8 is a ratio of 0.81 but a large move). DPPO bounds the divergence between the
    old and new distributions instead, approximated on the binary split {sampled token, the
    rest}, where total variation is $|p - p_{old}|$ with $p = \pi_\theta(y_t)$. A token is masked
    only when the update moves it out of the region in the direction its advantage pushes:

    $$M = \begin{cases} \mathbb{1}[p - p_{old} \le \delta_{high}] & A > 0\\
    \mathbb{1}[p - p_{old} \ge -\delta_{low}] & A \le 0\end{cases}
    \qquad l = -M\,A\,\mathrm{sg}[\min(r, C)]\,\log\pi_\theta(y_t)$$

    whose gradient $-M A \min(r, C)$ is the masked importance-weighted policy gradient
    ($\nabla r = r\,\nabla\log\pi$). The loss *value* is veRL 0.9.1's ``dppo_tv`` (with
    $\log\pi$ in it), not $-MAr$: only the gradient is the method's.

    **Defaults and their source.** ``delta_low = delta_high = 0.15``: the authors' veRL example
    (``examples/dppo_trainer/run_qwen30b_dppo.sh``, "the TV divergence threshold for DPPO";
    veRL reads it from ``clip_ratio_low``/``clip_ratio_high``). ``is_cap = null``: the authors set
    ``clip_ratio_c = 10000`` "to disable dual-clip PPO and TIS" (veRL's ``dppo_tv`` cites the
    paper's section 5.4: a large threshold avoids the truncation bias); veRL's function
    truncates at ``clip_ratio_c``, which an ``ActorConfig`` defaults to 3. The ``dppo_tv``
    preset follows the same script: Dr.GRPO advantages (no std) and ``seq-mean-token-sum-norm``.
    $A = 0$ takes the $A \le 0$ rule, as in veRL (its loss is 0 either way). The authors
    recommend anchoring the region to the *rollout* policy (section 5.2; veRL ``bypass_mode``):
    pass the inference engine's log-probabilities as ``old_logprobs`` to do the same.

    **IPO's two-sided region** (INTELLECT's IPO; prime-rl ``ipo_loss_fn`` in
    ``src/prime_rl/trainer/rl/loss.py``, merged in PR #2798, v0.5.1): ``sides: both`` masks a token
    whose probability moved more than the bound in *either* direction, whatever the sign of its
    advantage, $M = \mathbb{1}[-\delta_{low} \le p - p_{old} \le \delta_{high}]$ (prime-rl:
    ``is_masked = |p - p_infer| > ipo_threshold``, one threshold). ``value: ratio`` reports prime-rl's
    loss value $-M A r$ (``pg_loss = keep_mask * advantages * importance_ratio``), whose gradient
    $-M A r\,\nabla\log\pi$ is this surrogate's; it needs ``is_cap: null``. Defaults ``advantage`` and
    ``log_prob`` are the paper's method and veRL's value.

    Metrics: ``clip/high_fraction`` (A > 0, masked), ``clip/low_fraction`` (A <= 0, masked);
    with ``is_cap``, ``clip/truncated_fraction`` (unmasked tokens with r > C).
    """

    kind: Literal["dppo_tv"] = "dppo_tv"
    divergence: ClassVar[str] = "binary TV"
    delta_low: float = Field(0.15, gt=0.0, le=1.0)
    """TV bound for tokens with A <= 0: masked when p - p_old < -delta_low (authors: 0.15)."""
    delta_high: float = Field(0.15, gt=0.0, le=1.0)
    """TV bound for tokens with A > 0: masked when p - p_old > delta_high (authors: 0.15)."""

    def _inside(self, t, p, p_old):
        move = p - p_old
        return move <= self.delta_high, move >= -self.delta_low


class DPPOBinaryKL(_DPPO):
    r"""DPPO-Binary-KL (Qi et al., arXiv 2602.04879): DPPO with the binary KL divergence as the trust region.

    As [`DPPOBinaryTV`][rlstab.clipping.DPPOBinaryTV], with the divergence between the old and
    new Bernoulli distributions {sampled token, the rest}:

    $$D = p_{old}\log\frac{p_{old}}{p} + (1 - p_{old})\log\frac{1 - p_{old} + 10^{-8}}{1 - p + 10^{-8}}$$

    $$M = \begin{cases} \mathbb{1}[D \le \delta_{high} \ \lor\ p \le p_{old}] & A > 0\\
    \mathbb{1}[D \le \delta_{low} \ \lor\ p \ge p_{old}] & A \le 0\end{cases}
    \qquad l = -M\,A\,\mathrm{sg}[\min(r, C)]\,\log\pi_\theta(y_t)$$

    The $10^{-8}$ keeps the second term finite when a probability reaches 1, as in veRL 0.9.1's
    ``dppo_kl`` (the first term is computed from log-probabilities). Loss value and gradient
    are veRL's.

    **Defaults and their source.** ``delta_low = delta_high = 0.05``: the authors' veRL example
    ("the KL divergence threshold for DPPO"). ``is_cap = null``, the preset's Dr.GRPO advantages
    and ``seq-mean-token-sum-norm``: as for Binary-TV.

    Metrics: as for Binary-TV.
    """

    kind: Literal["dppo_kl"] = "dppo_kl"
    divergence: ClassVar[str] = "binary KL"
    delta_low: float = Field(0.05, gt=0.0, le=10.0)
    """Binary-KL bound for tokens with A <= 0 moving down (authors: 0.05)."""
    delta_high: float = Field(0.05, gt=0.0, le=10.0)
    """Binary-KL bound for tokens with A > 0 moving up (authors: 0.05)."""

    def _inside(self, t, p, p_old):
        kl = p_old * (t.old_logprobs - t.logprobs) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        return (kl <= self.delta_high) | (p <= p_old), (kl <= self.delta_low) | (p >= p_old)
