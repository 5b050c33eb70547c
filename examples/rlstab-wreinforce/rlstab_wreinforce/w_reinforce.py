"""W-REINFORCE: the loss of positive-advantage tokens scaled by lambda, as a reweighter."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from rlstab.lazy import torch  # imported at its first use: validating an objective needs no torch
from rlstab.reweighters import Reweighter
from rlstab.tokens import Tokens


class WReinforce(Reweighter):
    r"""W-REINFORCE's weight on positive samples (Zhu, Xia, Wei, Chen, Chen and Meng, "The Surprising
    Effectiveness of Negative Reinforcement in LLM Reasoning", arXiv 2506.01347, NeurIPS 2025).

    The paper splits the RLVR objective into positive sample reinforcement (PSR: raise the
    likelihood of correct responses) and negative sample reinforcement (NSR: lower that of wrong
    ones), finds that NSR alone keeps the model's Pass@k over the whole range of k while PSR alone
    narrows it, and recommends weighting the two:

    $$\mathcal{L}_{W\text{-}REINFORCE}(\theta) = \lambda\,\mathcal{L}_{PSR}(\theta) + \mathcal{L}_{NSR}(\theta),
    \qquad \lambda = 0.1$$

    As a reweighter, each token's policy loss is multiplied by

    $$w_{i,t} = \begin{cases}\lambda & A_{i,t} > 0\\ 1 & A_{i,t} \le 0\end{cases}$$

    Every rlstab surrogate is linear in a positive scale of $A$, so this equals scaling the
    positive advantages by $\lambda$, which is how the authors' code does it
    (github.com/TianHongZXY/RLVR-Decomposed, ``verl/trainer/ppo/core_algos.py``,
    ``compute_psr_nsr_outcome_advantage`` with ``advantage == 'weighted'``: a correct response's
    advantage is ``positive_advantage_weight * R``, a wrong one's ``R - 1``, with rewards 1 / 0,
    i.e. $\lambda$ and $-1$). With advantages $\pm 1$ (binary rewards, no baseline) it is the
    paper's W-REINFORCE exactly; on GRPO's group-normalised advantages the sign of $A$ is
    correctness within a group of mixed rewards, and the weight down-weights the correct responses
    of each group by $\lambda$. A token with $A = 0$ gets weight 1 (its loss is 0 anyway).

    **Default and its source.** ``positive_weight = 0.1``: the paper's recommended $\lambda$
    and the authors' README (``positive_advantage_weight``, "recommended value is 0.1").
    $\lambda = 1$ weights nothing (plain REINFORCE/GRPO); pure NSR ($\lambda = 0$) silences
    tokens rather than weighting them: a mask (``expression``: ``advantage <= 0``).
    """

    kind: Literal["w_reinforce"] = "w_reinforce"
    positive_weight: float = Field(0.1, gt=0.0, le=1.0)
    """lambda: the factor on the loss of tokens with a positive advantage (paper: 0.1); 1 weights nothing."""

    def weights(self, t: Tokens, step) -> torch.Tensor:
        # [B, 1] for per-response advantages, [B, T] for per-token ones. Padding may hold NaN:
        # NaN > 0 is False, so padding gets the finite factor 1.
        return torch.where(t.advantage_rows > 0, self.positive_weight, 1.0)

    def describe(self) -> str:
        return f"w_reinforce: w = {self.positive_weight:g} if A > 0 else 1"
