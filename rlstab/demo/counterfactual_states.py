"""The saved states the counterfactual audit starts from: a lab run's kept checkpoints, or a model as loaded.

A state is what one optimizer update depends on: the trainable weights, Adam's state (its moments and step
count; a fresh Adam for a model as loaded), the learning rate and the gradient-norm clip. A lab run keeps its
checkpoints with ``rlstab compare --keep-checkpoints`` (``checkpoints/stepNNNNNN.pt`` in the run's folder, each
``rlstab.trainer.run.Run.state_dict()``); an unfinished run's ``checkpoint.pt`` counts too. The run's
``spec.json`` names its model, task, seed and regime (the clip, the temperature and the held-out set's size).

Everything a ``--from`` folder can get wrong is found by :func:`lab_runs` before anything is loaded or sampled,
each as one line (a ``StateError``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rlstab.lazy import torch


class StateError(ValueError):
    """A ``--from`` folder or ``--states`` value that cannot be audited (one line: which, and why)."""


@dataclass
class LabRun:
    """One lab run's folder: what its ``spec.json`` says and the checkpoints to audit, ``{step: path}``."""

    folder: Path
    label: str
    model: str
    task: str
    seed: int
    regime: dict
    checkpoints: dict[int, Path]

    @property
    def max_grad_norm(self) -> float:
        return float(self.regime.get("max_grad_norm", 1.0))


@dataclass
class State:
    """One saved state: ``weights`` (the trainable parameters, in ``Policy.trainable_parameters()`` order) and
    ``optimizer`` (Adam's ``state_dict()``, None for a fresh Adam at ``lr``)."""

    label: str
    weights: list[torch.Tensor] = field(repr=False)
    optimizer: dict | None = field(repr=False)
    lr: float
    max_grad_norm: float
    run: str | None = None
    """The lab run's folder, None for a model as loaded."""
    run_seed: int | None = None
    step: int | None = None


def lab_runs(folders: list[str], steps: list[int] | None) -> list[LabRun]:
    """Each ``--from`` folder as a :class:`LabRun`, with the checkpoints of ``steps`` (all of them when None).

    Raises ``StateError`` naming the first problem: no ``spec.json``, an unreadable one, no checkpoint, a
    step it does not hold, runs of different models or tasks.
    """
    from rlstab.lab.checkpoint import CHECKPOINT_FILE, kept_checkpoints

    runs = []
    for text in folders:
        folder = Path(text)
        spec_path = folder / "spec.json"
        if not spec_path.is_file():
            raise StateError(f"--from {text}: not a lab run's folder (it has no spec.json); give "
                             "runs/REGIME/OBJECTIVE/seedN of an rlstab compare --out")
        try:
            spec = json.loads(spec_path.read_text())
            run = LabRun(folder, str(spec["label"]), str(spec["model"]), str(spec["task"]), int(spec["seed"]),
                         dict(spec["regime"]), kept_checkpoints(folder))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise StateError(f"--from {text}: its spec.json is unreadable ({type(err).__name__}: {err})") from None
        latest = folder / CHECKPOINT_FILE
        if latest.is_file():  # an unfinished run's latest checkpoint
            step = _checkpoint_step(latest, text)
            run.checkpoints.setdefault(step, latest)
            run.checkpoints = dict(sorted(run.checkpoints.items()))
        if not run.checkpoints:
            raise StateError(f"--from {text}: holds no checkpoint; train the run with rlstab compare --keep-checkpoints "
                             "(in a new --out: a finished run is not retrained)")
        if steps is not None:
            missing = [s for s in steps if s not in run.checkpoints]
            if missing:
                held = ", ".join(str(s) for s in run.checkpoints)
                raise StateError(f"--states {missing[0]}: --from {text} holds checkpoints of steps {held} only")
            run.checkpoints = {s: run.checkpoints[s] for s in sorted(set(steps))}
        runs.append(run)
    kinds = {(r.model, r.task) for r in runs}
    if len(kinds) > 1:
        raise StateError("--from: the runs are of different models or tasks ("
                         + ", ".join(f"{m} on {t}" for m, t in sorted(kinds)) + "); audit one model and task at a time")
    return runs


def _checkpoint_step(path: Path, text: str) -> int:
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(saved["step"])
    except Exception as err:  # any damage is the same answer: this checkpoint cannot be used
        raise StateError(f"--from {text}: {path.name} is unreadable ({type(err).__name__})") from None


def load_state(run: LabRun, step: int) -> State:
    """The checkpoint of ``step`` of ``run``, as a :class:`State` (Adam's learning rate is the checkpoint's)."""
    path = run.checkpoints[step]
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        weights, optimizer = list(saved["weights"]), saved["optimizer"]
        lr = float(optimizer["param_groups"][0]["lr"])
    except Exception as err:  # any damage is the same answer: this checkpoint cannot be used
        raise StateError(f"--from {run.folder}: {path.name} is unreadable ({type(err).__name__}: {err})") from None
    return State(label=f"seed{run.seed}/step{step}", weights=weights, optimizer=optimizer, lr=lr,
                 max_grad_norm=run.max_grad_norm, run=str(run.folder), run_seed=run.seed, step=step)


def model_state(policy, *, label: str, lr: float, max_grad_norm: float) -> State:
    """``policy`` as it is, with a fresh Adam at ``lr``: the state of a model plus a batch of its own rollouts."""
    return State(label=label, weights=[p.detach().clone() for p in policy.trainable_parameters()], optimizer=None,
                 lr=lr, max_grad_norm=max_grad_norm)


def policy_for(model: str, task, *, progress=None):
    """An untrained policy of ``model`` whose trainable weights a :class:`State` then sets: the tiny transformer of
    the trainer's shape (no warm start: every weight of it is trainable, so the state sets them all), or SmolLM2
    as loaded (its frozen layers are the model's; the state sets the trained ones)."""
    if model == "tiny":
        from rlstab.trainer.tasks import CharCodec
        from rlstab.trainer.tiny_model import TinyConfig, TinyPolicy

        codec = CharCodec()
        return TinyPolicy.create(codec, TinyConfig(vocab_size=codec.vocab_size))
    from rlstab.trainer.models import load_policy

    return load_policy(model, task, progress=progress)


def set_weights(policy, weights: list[torch.Tensor]) -> None:
    """Copy ``weights`` into ``policy``'s trainable parameters; ``StateError`` when their shapes differ."""
    params = policy.trainable_parameters()
    shapes = [tuple(p.shape) for p in params]
    if [tuple(w.shape) for w in weights] != shapes:
        raise StateError(f"the checkpoint's {len(weights)} weight tensors do not fit the model's {len(params)} "
                         "trainable parameters (another model shape)")
    with torch.no_grad():
        for p, w in zip(params, weights):
            p.copy_(w)
