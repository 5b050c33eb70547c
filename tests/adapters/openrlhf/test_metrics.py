"""The loss's metrics join ``training_step``'s status under ``rlstab/``, token-weighted, for OpenRLHF to average.

The wrapper is applied to a class whose ``training_step`` returns the status OpenRLHF 0.11.2's returns
(its keys are read from the installed ``ActorPPOTrainer.training_step``, whose module imports vLLM);
the real trainer's step, through the wrapper, is run in test_install.py.
"""

import ast
from types import SimpleNamespace

import torch
from openrlhf_installed import method

from rlstab.adapters.openrlhf.metrics import PREFIX, log_rlstab_metrics
from rlstab.adapters.patching import patched_by


def status_keys_of_openrlhf_training_step() -> set[str]:
    definition = method("trainer/ray/ppo_actor.py", "ActorPPOTrainer", "training_step")
    returned = [node.value for node in ast.walk(definition) if isinstance(node, ast.Return)]
    return {key.value for value in returned if isinstance(value, ast.Dict) for key in value.keys}


class Trainer:
    """``training_step`` returns OpenRLHF's status: ``metrics`` and their ``weights`` (None, 'token' or 'sample')."""

    def __init__(self, last_metrics):
        self.actor_loss_fn = SimpleNamespace(last_metrics=last_metrics)

    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        return {
            "metrics": {"policy_loss": torch.tensor(0.5), "actor_lr": 1e-6},
            "weights": {"policy_loss": "token", "actor_lr": None},
            "num_samples": 2.0,
            "num_action_tokens": 7.0,
        }


def test_openrlhf_training_step_returns_metrics_and_their_weights():
    assert {"metrics", "weights"} <= status_keys_of_openrlhf_training_step()


def test_each_loss_metric_is_added_as_a_token_weighted_float():
    log_rlstab_metrics(Trainer)
    # last_metrics as the loss leaves them (floats, or 0-d tensors)
    trainer = Trainer({"mask/s2t/silenced": 3.0, "tokens/kept_fraction": torch.tensor(0.75)})
    status = trainer.training_step(None, 0.0, 0)
    assert status["metrics"]["rlstab/mask/s2t/silenced"] == 3.0
    assert status["metrics"]["rlstab/tokens/kept_fraction"] == 0.75
    assert type(status["metrics"]["rlstab/tokens/kept_fraction"]) is float
    assert status["weights"]["rlstab/mask/s2t/silenced"] == status["weights"]["rlstab/tokens/kept_fraction"] == "token"
    # OpenRLHF's own entries are left as they were
    assert status["metrics"]["actor_lr"] == 1e-6 and status["weights"]["actor_lr"] is None
    assert status["num_action_tokens"] == 7.0
    # every metric has a weight: ppo_train reads weights[k] for each k of metrics
    assert set(status["metrics"]) == set(status["weights"])


def test_a_loss_without_metrics_leaves_the_status_alone():
    log_rlstab_metrics(Trainer)
    for trainer in (Trainer({}), Trainer(None)):
        status = trainer.training_step(None, 0.0, 0)
        assert not any(name.startswith(PREFIX) for name in status["metrics"])
    plain = Trainer({"loss": 1.0})
    del plain.actor_loss_fn  # OpenRLHF's own PolicyLoss has no last_metrics; a trainer without it neither
    assert set(plain.training_step(None, 0.0, 0)["metrics"]) == {"policy_loss", "actor_lr"}


def test_a_status_of_another_shape_is_returned_unchanged():
    class Other(Trainer):
        def training_step(self, *args, **kwargs):
            return {"policy_loss": 0.5}  # no metrics/weights: not OpenRLHF 0.11.2's status

    log_rlstab_metrics(Other)
    assert Other({"mask/s2t/silenced": 1.0}).training_step(None, 0.0, 0) == {"policy_loss": 0.5}


def test_installing_twice_adds_the_metrics_once():
    class Once(Trainer):
        pass

    Once.training_step = Trainer.__dict__["training_step"]
    log_rlstab_metrics(Once)
    wrapped = Once.training_step
    log_rlstab_metrics(Once)
    assert Once.training_step is wrapped and patched_by(wrapped) == ("rlstab.adapters.openrlhf.metrics",)
