"""Mechanism instruments: what the tokens each mask silences carry of the policy gradient, and how a token's
logit gradient varies with its probability and entropy (STAPO's two claims, arXiv 2602.15620), measured
without changing training.

- ``share``: the gradient share and cosine of each mask's silenced tokens, in the parameter space of
  the policy's trainable parameters (:mod:`rlstab.trainer.mechanism.share`);
- ``logit_grad``: each token's logit-gradient norm, binned by probability and by entropy, with its
  rank and linear correlations (:mod:`rlstab.trainer.mechanism.logit_grad`);
- ``meter``: both over the micro-batches of an optimizer step, for the trainer's ``update`` and
  ``rlstab audit --mechanism`` (:class:`~rlstab.trainer.mechanism.meter.StepMeter`).

Importing this package loads torch (the embedded trainer imports it only when
``TrainConfig.instruments`` is on).
"""

from rlstab.trainer.mechanism.meter import StepMeter, mask_free

__all__ = ["StepMeter", "mask_free"]
