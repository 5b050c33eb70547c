"""The objective's state rides in DeepSpeed's ``client_states`` through OpenRLHF's ``save_ckpt`` / ``load_ckpt``.

The wrappers bind their arguments by the signatures of OpenRLHF 0.11.2's real
``DeepspeedStrategy.save_ckpt`` and ``load_ckpt`` (read from the installed file: the module imports
flash-attn); what a wrapped method receives and returns is recorded, not saved by DeepSpeed.
Whole save-and-resume runs are in test_ray_worker.py.
"""

import logging
from types import SimpleNamespace

import pytest
from openrlhf_installed import method, with_signature_of

from rlstab import StateError
from rlstab.adapters.openrlhf import RlstabPolicyLoss, checkpoint
from rlstab.adapters.openrlhf.checkpoint import STATE_KEY, attach, restore, saved_state, wrap_strategy
from rlstab.adapters.patching import patched_by

DEEPSPEED = "utils/deepspeed/deepspeed.py"
BAPO = "surrogate (bapo)"
MOVED = {BAPO: {"clip_low": 0.7, "clip_high": 1.3, "steps": 5}}  # bounds within BAPO's search, after 5 steps


class Engine:
    """A DeepSpeed engine's identity: the wrappers key their maps by it (weakly)."""


def recording_strategy():
    """A class with OpenRLHF's two methods' exact signatures: save returns the client_state it got,
    load returns ``self.found`` for a directory with a checkpoint, ``(None, {})`` for one without (as OpenRLHF)."""
    save = with_signature_of(method(DEEPSPEED, "DeepspeedStrategy", "save_ckpt"), "return client_state")
    load = with_signature_of(
        method(DEEPSPEED, "DeepspeedStrategy", "load_ckpt"),
        "return self.found if load_dir == 'ckpt' else (None, {})",
    )
    strategy_class = type("DeepspeedStrategy", (), {"save_ckpt": save, "load_ckpt": load})
    wrap_strategy(strategy_class)
    return strategy_class


def bapo_loss():
    return RlstabPolicyLoss(objective="bapo", step_statistics="local")


def trainer_of(engine):
    return SimpleNamespace(actor=SimpleNamespace(model=engine))


def test_openrlhf_save_ckpt_takes_the_model_and_client_state_the_wrapper_binds():
    parameters = [a.arg for a in method(DEEPSPEED, "DeepspeedStrategy", "save_ckpt").args.args]
    assert parameters[:2] == ["self", "model"] and "client_state" in parameters
    assert [a.arg for a in method(DEEPSPEED, "DeepspeedStrategy", "load_ckpt").args.args][:3] == ["self", "model", "load_dir"]


def test_saved_state_names_the_objective_and_its_fingerprint():
    loss = bapo_loss()
    entry = saved_state(loss)
    assert entry == {"objective": "bapo", "fingerprint": loss.compiled.fingerprint,
                     "state": {BAPO: {"clip_low": 0.6, "clip_high": 1.2, "steps": 0}}}


def test_save_ckpt_adds_the_state_of_an_attached_engine_only():
    strategy = recording_strategy()()
    engine, other = Engine(), Engine()
    loss = bapo_loss()
    attach(trainer_of(engine), loss)
    # no client_state: the state alone
    assert strategy.save_ckpt(engine, "out", "global_step1") == {STATE_KEY: saved_state(loss)}
    # client_state positionally (6th, after model, save_dir, tag, max_num, max_mem), then by name: kept, not mutated
    theirs = {"consumed_samples": 8}
    assert strategy.save_ckpt(engine, "out", "t", 3, 1000, theirs) == {"consumed_samples": 8, STATE_KEY: saved_state(loss)}
    assert strategy.save_ckpt(engine, "out", client_state=theirs)[STATE_KEY]["objective"] == "bapo"
    assert theirs == {"consumed_samples": 8}
    # an engine no rlstab loss trains (the critic, the reference model): untouched
    assert strategy.save_ckpt(other, "out", "t", 3, 1000, theirs) is theirs
    assert strategy.save_ckpt(other, "out") is None


def test_a_state_loaded_before_the_trainer_exists_is_restored_when_it_attaches():
    strategy = recording_strategy()()
    engine = Engine()
    strategy.found = ("ckpt/global_step5", {"consumed_samples": 40, STATE_KEY: {"objective": "bapo", "state": MOVED}})
    assert strategy.load_ckpt(engine, "ckpt") == strategy.found  # OpenRLHF's result is passed on unchanged
    loss = bapo_loss()
    assert loss.compiled.state_dict()[BAPO]["steps"] == 0
    attach(trainer_of(engine), loss)
    assert loss.compiled.state_dict() == MOVED


def test_a_state_loaded_after_the_trainer_exists_is_restored_at_once():
    strategy = recording_strategy()()
    engine, loss = Engine(), bapo_loss()
    attach(trainer_of(engine), loss)
    strategy.found = ("ckpt/global_step5", {STATE_KEY: {"objective": "bapo", "state": MOVED}})
    strategy.load_ckpt(engine, "ckpt")
    assert loss.compiled.state_dict() == MOVED


def test_no_checkpoint_found_leaves_nothing_to_restore():
    strategy = recording_strategy()()
    engine = Engine()
    assert strategy.load_ckpt(engine, "empty") == (None, {})
    loss = bapo_loss()
    attach(trainer_of(engine), loss)
    assert loss.compiled.state_dict()[BAPO]["steps"] == 0
    assert engine not in checkpoint._LOADED


def test_a_state_that_does_not_fit_names_the_checkpoint_and_the_objective_it_came_from():
    stare = RlstabPolicyLoss(objective="stare", step_statistics="local")
    with pytest.raises(StateError, match=r"OpenRLHF checkpoint ckpt/global_step5 \(saved by objective 'bapo'\) "
                                         r"does not fit objective 'stare'"):
        restore(stare, {"objective": "bapo", "state": MOVED}, "ckpt/global_step5")


def test_a_checkpoint_without_the_state_warns_only_for_a_stateful_objective(caplog):
    grpo, bapo = RlstabPolicyLoss(objective="grpo", step_statistics="local"), bapo_loss()
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        restore(grpo, None, "ckpt/a")
        restore(bapo, None, "ckpt/b")
    warnings = [r.getMessage() for r in caplog.records if r.name == checkpoint.__name__]
    assert warnings == [
        "rlstab: checkpoint ckpt/b carries no rlstab objective state; surrogate (bapo) start from their initial state"
    ]
    assert bapo.compiled.state_dict()[BAPO]["steps"] == 0


def test_wrapping_twice_wraps_once():
    strategy_class = recording_strategy()
    save, load = strategy_class.save_ckpt, strategy_class.load_ckpt
    wrap_strategy(strategy_class)
    assert strategy_class.save_ckpt is save and strategy_class.load_ckpt is load
    assert patched_by(save) == patched_by(load) == ("rlstab.adapters.openrlhf.checkpoint",)
