"""``install()`` hooks rlstab into the real verl once: the loss, the ppo_loss wrapper, the ActorConfig check, the range."""

import warnings

import pytest
import verl
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
from verl.workers.config import ActorConfig
from verl.workers.utils import losses

from rlstab.adapters.patching import patched_by
from rlstab.adapters.verl.install import LOSS_MODE, SUPPORTED_VERL, _supported, install
from rlstab.adapters.verl.loss import rlstab_policy_loss


@pytest.mark.parametrize("version, supported", [
    ("0.9.0", True), ("0.9.1", True), ("0.9.1.dev0", True), ("0.10.0", False), ("0.8.5", False), ("1.9.0", False),
    ("0", False), ("x.y", False), ("", False),
])
def test_supported_releases_are_0_9(version, supported):
    assert _supported(version) is supported
    assert SUPPORTED_VERL == (">=0.9.0", "<0.10")


def test_the_installed_verl_has_the_loss_the_wrapper_and_the_check():
    assert _supported(verl.__version__)
    assert LOSS_MODE == "rlstab" and get_policy_loss_fn("rlstab") is rlstab_policy_loss
    assert patched_by(losses.ppo_loss) == ("rlstab.adapters.verl.model_output",)
    assert "rlstab.adapters.verl.config" in patched_by(ActorConfig.__post_init__)


def test_installing_again_wraps_nothing_twice():
    ppo_loss, post_init = losses.ppo_loss, ActorConfig.__post_init__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a supported verl: no warning
        install()
    assert losses.ppo_loss is ppo_loss and ActorConfig.__post_init__ is post_init
    assert POLICY_LOSS_REGISTRY["rlstab"] is rlstab_policy_loss


def test_an_unsupported_verl_warns_with_both_versions_and_still_installs(monkeypatch):
    monkeypatch.setattr(verl, "__version__", "0.10.2")  # the module install() reads
    with pytest.warns(UserWarning, match=r"tested with verl >=0\.9\.0,<0\.10; this is verl 0\.10\.2"):
        install()
    assert get_policy_loss_fn("rlstab") is rlstab_policy_loss
