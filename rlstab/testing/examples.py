"""One or more instances of every built-in kind, configured so that the kit's checks exercise them.

Defaults are used where they do something on the kit's batch (``rlstab.testing.batches``); where
they would not, the example says why it departs from them:

- a mask must silence some valid tokens and keep others, or the silenced-token check proves
  nothing: ``rollout_veto`` at 0.05 (the default 1e-4 vetoes no response of a random batch),
  ``rollout_rejection`` (its ``high`` is required) at token level and over whole responses;
- Clip-Cov and KL-Cov select ``fraction`` of a micro-batch's tokens: 2% instead of 0.02%, so
  something is selected in a 16 x 24 batch; Clip-Cov with a ``seed`` (``seed: null`` draws from
  torch's global generator, differently on every call, so no two computations could be compared);
- aggregations have no default ``count``: both values appear;
- regularisers at ``coef = 0.1``, so their term is not lost in the tolerances;
- DAPO's overlong penalty with a budget of 20 tokens (the default 20,480 never binds on 24);
- STARE adaptive with a target entropy inside the batch's (1.0), so its controller and gate move;
- Goldilocks with a smaller teacher (the checks drive it for several steps).
"""

from __future__ import annotations

from rlstab.registry import registrations

BUILTIN = "rlstab"


def builtin_components() -> list:
    """Example instances of rlstab's own kinds, at least one per kind (each a fresh instance)."""
    from rlstab.advantages.gdpo import GDPO
    from rlstab.advantages.given import Given
    from rlstab.advantages.gpg import GPG
    from rlstab.advantages.group import GRPO, RLOO
    from rlstab.advantages.grpo_passk import GRPOPassK
    from rlstab.advantages.gtpo import GTPOAdvantage
    from rlstab.advantages.maxrl import MaxRL
    from rlstab.advantages.opo import OPO
    from rlstab.advantages.opob import OffPolicyOptimalBaseline
    from rlstab.advantages.optimal_token_baseline import MultiTurnOptimalTokenBaseline, OptimalTokenBaseline
    from rlstab.advantages.reinforce_pp import ReinforcePP
    from rlstab.aggregation import SeqMeanTokenMean, SeqMeanTokenSum, SeqMeanTokenSumNorm, TokenMean, TokenSum
    from rlstab.clipping.aspo import ASPO
    from rlstab.clipping.bapo import BAPO
    from rlstab.clipping.cfpo import CFPO
    from rlstab.clipping.cispo import CISPO
    from rlstab.clipping.clip_cov import ClipCov
    from rlstab.clipping.dppo import DPPOBinaryKL, DPPOBinaryTV
    from rlstab.clipping.dro import DRO
    from rlstab.clipping.gmpo import GMPO
    from rlstab.clipping.gppo import GPPO
    from rlstab.clipping.gspo import GSPO
    from rlstab.clipping.kl_cov import KLCov
    from rlstab.clipping.lp_reg import LpReg
    from rlstab.clipping.m2po import M2PO
    from rlstab.clipping.maspo import MASPO
    from rlstab.clipping.pmd_mean import PMDMean
    from rlstab.clipping.ppo import NoClip, PPOClip
    from rlstab.clipping.reinforce import Reinforce
    from rlstab.clipping.sapo import SAPO
    from rlstab.clipping.target_po import TargetPO
    from rlstab.clipping.topr import TOPR
    from rlstab.clipping.vespo import VESPO
    from rlstab.exploration.deep_grpo import DeepGRPO
    from rlstab.exploration.dual_stream import DualStream
    from rlstab.masks.bypass import BypassRejection
    from rlstab.masks.entropy_quantile import EntropyQuantile
    from rlstab.masks.expression import Expression
    from rlstab.masks.gtpo_entropy import GTPOEntropyFilter
    from rlstab.masks.lopti import Lopti
    from rlstab.masks.off_policy_sequence import OffPolicySequence
    from rlstab.masks.random_silence import RandomSilence
    from rlstab.masks.rollout import IcePop, RolloutRejection, RolloutVeto
    from rlstab.masks.s2t import S2T, LowProbability
    from rlstab.regularisers.adaptive_entropy import AdaptiveEntropy
    from rlstab.regularisers.entropy_bonus import EntropyBonus
    from rlstab.regularisers.kl import KLPenalty
    from rlstab.reweighters.decoupled_ppo import DecoupledPPO
    from rlstab.reweighters.gtpo_conflict import GTPOConflict
    from rlstab.reweighters.low_probability import LowProbabilityReweight
    from rlstab.reweighters.stare import STARE
    from rlstab.reweighters.tis import TruncatedIS
    from rlstab.sampling.goldilocks import Goldilocks
    from rlstab.step.dynamic_sampling import DynamicSampling
    from rlstab.step.ess import ESSLearningRateScale
    from rlstab.step.overlong import OverlongPenalty

    return [
        # advantage
        GRPO(), RLOO(), ReinforcePP(), OffPolicyOptimalBaseline(), Given(),
        GRPO(eps=0.0, std="population", std_floor=1e-6),  # issue 41: Target PO's standardisation
        GPG(), GPG(alpha="nonzero_rewards"), OPO(), GRPOPassK(), GRPOPassK(k=2),  # issue 31, H2
        GDPO(), GDPO(weights=[1.0, 2.0, 0.5]), GDPO(source="rewards"),  # issue 31, H2
        OptimalTokenBaseline(), OptimalTokenBaseline(zero_tail=False), MultiTurnOptimalTokenBaseline(),  # issue 31, H3
        MaxRL(), MaxRL(divide_by_group_size=False),  # issue 31, H6
        GTPOAdvantage(),  # issue 41
        # masks
        S2T(), LowProbability(), EntropyQuantile(), EntropyQuantile(rho=0.5, side="bottom"),
        Expression(silence="advantage > 0 and probability < 0.002 and entropy < quantile(entropy, 0.8)"),
        IcePop(), RolloutRejection(high=2.0), RolloutRejection(level="sequence_max", divergence="k2", high=0.5, rejected="masked"),
        RolloutVeto(threshold=0.05), Lopti(), Lopti(phase="high"), RandomSilence(fraction=0.3),
        OffPolicySequence(threshold=0.05), OffPolicySequence(threshold=0.01, behaviour="old"),  # issue 31, H4
        # (0.01 with old: the kit's old log-probs are at most 0, so drawn below the current ones near 0; issue 38)
        IcePop(low=0.0, high=2.0),  # issue 31, H4: TRL's token_mask without a lower bound
        BypassRejection(high=2.0), BypassRejection(level="sequence_mean", divergence="k3", high=0.05, rejected="padding"),  # H1
        GTPOEntropyFilter(bound=1.0),  # issue 41: near the kit's mean entropy (1), so some responses go
        # reweighters
        LowProbabilityReweight(), TruncatedIS(), TruncatedIS(level="sequence", cap=1.5),
        STARE(variant="C2", adaptive=True, alpha=0.05, target_entropy=1.0),
        TruncatedIS(floor=0.8, cap=1.5),  # issue 31, H4: TRL's *_truncate with clip_min
        DecoupledPPO(cap=2.0), DecoupledPPO(cap=2.0, above_cap="clamp"),  # issue 31, H6: a cap that binds on the kit's batch
        GTPOConflict(), GTPOConflict(normalise="conflict_count"),  # issue 41
        # surrogate
        PPOClip(), PPOClip(eps_high=0.28, dual_clip=3.0), NoClip(), GSPO(), SAPO(), CISPO(), ASPO(), DPPOBinaryTV(),
        DPPOBinaryKL(), ClipCov(fraction=0.02, seed=0), KLCov(fraction=0.02), MASPO(), BAPO(),
        PPOClip(eps_high=0.28, delta=1.1),  # issue 31, H4: delta below 1 + eps_high (caps A > 0 too)
        CFPO(),  # issue 31, H6
        M2PO(), M2PO(rule="remove", population="valid", threshold=0.005),  # issue 31, H5
        TOPR(), TOPR(ratio_level="sequence", negative_weight=0.5),  # issue 31, H5
        GPPO(), GPPO(eps_high=0.2, beta_low=0.75),  # issue 31, H5 (GPPO; CE-GPPO)
        LpReg(negative_fraction=0.2, positive_fraction=0.1, eps_low=0.2, eps_high=0.28),  # issue 31, H5
        Reinforce(), Reinforce(is_weight="token", is_cap=1.5), Reinforce(is_weight="sequence"),  # issue 31, H1
        GMPO(), GMPO(eps_low=0.1, eps_high=0.2), DRO(), DRO(beta=0.5),  # issue 31, H1
        TargetPO(), TargetPO(eta=0.5, length="mean"), PMDMean(), PMDMean(tau=2.0),  # issue 41
        VESPO(), DPPOBinaryTV(sides="both", value="ratio"),  # issue 41
        # aggregation
        TokenMean(count="kept"), TokenMean(count="valid"), TokenSum(count="valid"), SeqMeanTokenMean(count="kept"),
        SeqMeanTokenSum(count="valid"), SeqMeanTokenSumNorm(count="kept"), SeqMeanTokenSumNorm(count="valid", norm=16),
        # regularisers
        EntropyBonus(coef=0.1), KLPenalty(coef=0.1),
        KLPenalty(coef=0.1, anchor="old", estimator="squared", tokens="kept"),  # issue 41: K2.5's, on kept tokens
        # issue 31, H4: the controller on both sides of a target near the kit's mean entropy (1)
        AdaptiveEntropy(coef=0.1, delta=0.05, coef_max=0.5, target_entropy=1.0, measure="entropy"),
        AdaptiveEntropy(coef=0.1, delta=0.05, coef_max=0.5, target_entropy=1.0, boundary="at_or_below", first_step="off"),
        # step level
        OverlongPenalty(max_length=20, buffer=8), DynamicSampling(), ESSLearningRateScale(), DualStream(branch_weight=0.5),
        # trainer executed
        Goldilocks(teacher_steps=2), DeepGRPO(),
    ]


def builtin_kinds() -> dict[str, list[str]]:
    """``{family: [kind, ...]}`` of the kinds rlstab itself registers (distribution ``rlstab``)."""
    out: dict[str, list[str]] = {}
    for reg in registrations():
        if reg.distribution == BUILTIN:
            out.setdefault(reg.family, []).append(reg.kind)
    return {family: sorted(kinds) for family, kinds in out.items()}


def missing_examples(components) -> list[str]:
    """``family/kind`` of every built-in kind that ``components`` has no instance of."""
    from rlstab.testing.hosting import family_name

    have = {(family_name(c), c.kind) for c in components}
    return [f"{family}/{kind}" for family, kinds in builtin_kinds().items() for kind in kinds if (family, kind) not in have]
