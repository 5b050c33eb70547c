"""The objective's state (STARE's controller, BAPO's bounds) in OpenRLHF's own checkpoints.

OpenRLHF 0.11.2 saves the actor with ``PolicyModelActor.save_checkpoint(tag, client_states)``, which
calls ``DeepspeedStrategy.save_ckpt(self.actor.model, <ckpt.path>/_actor, tag, ..., client_states)``:
DeepSpeed stores ``client_states`` in the checkpoint next to the weights and optimizer. On resume
``PolicyModelActor.init_model_from_pretrained`` calls ``strategy.load_ckpt(self.actor.model, ...)``,
which returns those states (kept as ``checkpoint_states``), and then builds ``ActorPPOTrainer``.

So the state rides in DeepSpeed's ``client_states`` under ``rlstab_objective_state``, saved and
restored by the same calls as the weights, in the same files, rotated with them by ``--ckpt.max_num``:

- ``DeepspeedStrategy.save_ckpt`` is wrapped: when ``model`` is the engine of an actor whose trainer
  trains with ``RlstabPolicyLoss``, the objective's ``state_dict()`` (with its name and fingerprint)
  is added to ``client_state``. ``PolicyModelActor`` is a Ray actor class, which Ray ships to the
  workers pickled from the driver, so the strategy (an ordinary class imported in each worker) is
  the narrowest place to add it.
- ``DeepspeedStrategy.load_ckpt`` is wrapped: what it returns for an engine is kept until the
  trainer of that engine is built (``ActorPPOTrainer.__init__``, wrapped in
  [`step_scope`][rlstab.adapters.openrlhf.step_scope]), whose loss then loads it. A state that does
  not fit the objective raises [`StateError`][rlstab.StateError] naming the checkpoint directory
  and the objective it was saved from.

With ``step_statistics="optimizer_step"`` every rank holds the same state, so DeepSpeed's single
copy of ``client_states`` restores all of them exactly.
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref

from rlstab.adapters.patching import patch_once
from rlstab.errors import StateError

STATE_KEY = "rlstab_objective_state"
"""The key of the objective's state in DeepSpeed's ``client_states``."""

_log = logging.getLogger(__name__)
_LOSSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # actor engine -> RlstabPolicyLoss
_LOADED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> (saved entry or None, load path)


def saved_state(loss) -> dict:
    """What goes into ``client_states``: the objective's name and fingerprint, and its ``state_dict()``."""
    compiled = loss.compiled
    return {"objective": loss.objective.name or "custom", "fingerprint": compiled.fingerprint,
            "state": compiled.state_dict()}


def restore(loss, entry: dict | None, where: str) -> None:
    """Load a saved ``entry`` into ``loss``'s objective; a StateError naming ``where`` when it does not fit."""
    compiled = loss.compiled
    if entry is None:
        if compiled.state_dict():
            _log.warning("rlstab: checkpoint %s carries no rlstab objective state; %s start from their initial state",
                         where, ", ".join(compiled.state_dict()))
        return
    saved_from = entry.get("objective", "?") if isinstance(entry, dict) else "?"
    state = entry.get("state") if isinstance(entry, dict) else entry
    try:
        compiled.load_state_dict(state)
    except StateError as err:
        raise StateError(
            f"the rlstab state in OpenRLHF checkpoint {where} (saved by objective {saved_from!r}) does not fit "
            f"objective {loss.objective.name or 'custom'!r}: {err}"
        ) from None


def attach(trainer, loss) -> None:
    """Link the trainer's actor engine to its loss (for saving), and restore a state loaded for that engine."""
    engine = getattr(trainer.actor, "model", None)
    if engine is None:
        return
    _LOSSES[engine] = loss
    loaded = _LOADED.pop(engine, None)
    if loaded is not None:
        restore(loss, *loaded)


def wrap_strategy(strategy_class) -> None:
    """Wrap ``DeepspeedStrategy.save_ckpt`` and ``load_ckpt`` (idempotent)."""
    patch_once(strategy_class, "save_ckpt", _saving_state, key=__name__)
    patch_once(strategy_class, "load_ckpt", _loading_state, key=__name__)


def _saving_state(save_ckpt):
    save_signature = inspect.signature(save_ckpt)

    @functools.wraps(save_ckpt)
    def save_ckpt_with_objective_state(self, *args, **kwargs):
        bound = save_signature.bind(self, *args, **kwargs)
        loss = _LOSSES.get(bound.arguments["model"])
        if loss is not None:
            bound.arguments["client_state"] = {**(bound.arguments.get("client_state") or {}), STATE_KEY: saved_state(loss)}
        return save_ckpt(*bound.args, **bound.kwargs)

    return save_ckpt_with_objective_state


def _loading_state(load_ckpt):
    @functools.wraps(load_ckpt)
    def load_ckpt_with_objective_state(self, model, load_dir, *args, **kwargs):
        load_path, states = load_ckpt(self, model, load_dir, *args, **kwargs)
        if load_path is not None:
            entry = (states or {}).get(STATE_KEY)
            if model in _LOSSES:  # the trainer exists already: restore now
                restore(_LOSSES[model], entry, str(load_path))
            else:
                _LOADED[model] = (entry, str(load_path))
        return load_path, states

    return load_ckpt_with_objective_state
