"""The rows of the logits table (section 2 of ``benchmarks/gpu.py``) and the paths it compares.

Paths: rlstab's ``token_stats_from_logits`` (Triton kernels on CUDA), on CUDA also rlstab's torch
path (the same call with the Triton route turned off), on CPU rlstab's Triton kernels called
directly (under Triton's interpreter), the trainer's own way (veRL's ``entropy_from_logits`` and
``logprobs_from_logits`` when ``import verl`` works, else the same formulas written here, in the
autograd graph: veRL's ``torch_functional`` imports tensordict and transformers, so it cannot be
loaded from its files alone as its LM-head kernel is) and Liger-Kernel's ``liger_cross_entropy``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect

import torch

from gpu_sections.common import triton_installed
from gpu_sections.measure import failure

ROWS = [  # name, dtype, mode; the float32 rows first, so that their logits are freed before bf16's
    ("fp32 entropy, in graph", "float32", "entropy_in_graph"),
    ("fp32 no grad", "float32", "no_grad"),
    ("bf16 entropy, in graph", "bfloat16", "entropy_in_graph"),
    ("bf16 no grad", "bfloat16", "no_grad"),
    ("bf16 entropy grad", "bfloat16", "entropy_grad"),
    ("bf16 log-prob grad", "bfloat16", "logprob_grad"),
]
MODES = {
    "entropy_in_graph": "the entropy alone, logits requiring grad, no backward (the issue's 'before' measurement)",
    "no_grad": "log-prob and entropy under torch.no_grad",
    "entropy_grad": "forward + backward of sum(g * entropy) (entropy bonus)",
    "logprob_grad": "log-prob and entropy, forward + backward of sum(g * logprob) (entropy unused by the loss)",
}
GRAD_MODES = ("entropy_grad", "logprob_grad")


class LogitPath:
    """One way to get (log-prob, entropy) from logits. ``stats(x, labels, entropy_grad)``."""

    def __init__(
        self,
        name: str,
        describe: str,
        stats=None,
        status: str = "ok",
        fresh_input: bool = False,
        modes=tuple(MODES),
        context=contextlib.nullcontext,
    ) -> None:
        self.name, self.describe, self.stats, self.status = name, describe, stats, status
        self.fresh_input, self.modes, self.context = fresh_input, modes, context


def formula_entropy(logits):
    """The entropy as trainers write it, in the autograd graph: logsumexp - sum(softmax * logits)."""
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (pd * logits).sum(-1)


def formula_logprob(logits, labels):
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def trainer_path(no_verl: bool) -> LogitPath:
    reason = "--no-verl"
    if not no_verl:
        try:
            import verl
            from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

            kwargs = {}
            if "inplace_backward" in inspect.signature(logprobs_from_logits).parameters:
                # veRL's actor passes False when it computes the entropy too (as here); True would
                # write the gradient into the logits that every path shares.
                kwargs["inplace_backward"] = False

            def verl_stats(x, labels, entropy_grad):
                lp = None if labels is None else logprobs_from_logits(x, labels, **kwargs)
                return lp, entropy_from_logits(x)

            return LogitPath(
                "trainer",
                f"veRL {getattr(verl, '__version__', '?')}: entropy_from_logits, "
                f"logprobs_from_logits({', '.join(f'{k}={v}' for k, v in kwargs.items())})",
                verl_stats,
            )
        except Exception as exc:  # noqa: BLE001 - any failure means "no verl"
            reason = f"veRL not importable: {type(exc).__name__}: {str(exc)[:120]}"

    def formula_stats(x, labels, entropy_grad):
        return (None if labels is None else formula_logprob(x, labels)), formula_entropy(x)

    return LogitPath(
        "trainer",
        f"the trainers' formulas written here, in graph ({reason}): logsumexp - "
        "sum(softmax * logits); log_softmax + gather",
        formula_stats,
    )


def liger_path(device, no_liger: bool) -> LogitPath:
    describe = "Liger-Kernel liger_cross_entropy(reduction='none'): the log-prob alone, a fresh copy of the logits per call"
    if no_liger:
        return LogitPath("liger", describe, status="skipped: --no-liger")
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy
    except Exception as exc:  # noqa: BLE001
        return LogitPath("liger", describe, status=f"unavailable ({type(exc).__name__}: {str(exc)[:120]})")
    if device.type != "cuda":
        return LogitPath("liger", describe, status="skipped: its kernels need CUDA")

    def liger_stats(x, labels, entropy_grad):
        return -liger_cross_entropy(x, labels, reduction="none"), None

    return LogitPath("liger", describe, liger_stats, fresh_input=True, modes=("no_grad", "logprob_grad"))


def triton_entry():
    """``rlstab.stats.triton.token_stats_from_logits_triton`` and ``"ok"``, or None and why not.

    Without Triton the path is ``unavailable (...)``; with Triton installed, kernels that do not
    import are ``failed: ...``: a path that should run and did not.
    """
    try:
        module = importlib.import_module("rlstab.stats.triton")
        return module.token_stats_from_logits_triton, "ok"
    except Exception as exc:  # noqa: BLE001 - no Triton, a broken kernel: said, never raised
        if triton_installed():
            return None, failure(exc)
        return None, f"unavailable ({type(exc).__name__}: {str(exc)[:160]})"


@contextlib.contextmanager
def torch_route():
    """rlstab's torch path on CUDA: the public call with its Triton route turned off, for the same-card comparison."""
    from rlstab.stats import from_logits

    original = from_logits._use_triton
    from_logits._use_triton = lambda logits: False
    try:
        yield
    finally:
        from_logits._use_triton = original


def logit_paths(device, args) -> tuple[list[LogitPath], str]:
    """The paths of the table, in its column order, and the status of rlstab's Triton kernels."""
    from rlstab.stats import token_stats_from_logits

    def public(x, labels, entropy_grad):
        return token_stats_from_logits(x, labels, entropy_grad=entropy_grad)

    entry, status = triton_entry()
    paths = [
        LogitPath(
            "rlstab",
            "rlstab.stats.token_stats_from_logits"
            + (" (Triton on CUDA)" if device.type == "cuda" else " (the CPU reference path)"),
            public,
        )
    ]
    if device.type == "cuda":
        from rlstab.stats import from_logits

        ok = hasattr(from_logits, "_use_triton")
        paths.append(
            LogitPath(
                "rlstab torch path",
                "the same call with the Triton route turned off (GPU-sized chunks)",
                public if ok else None,
                "ok" if ok else "unavailable (no Triton route to turn off)",
                context=torch_route,
            )
        )
    else:
        paths.append(
            LogitPath(
                "rlstab triton",
                "rlstab.stats.triton.token_stats_from_logits_triton under Triton's interpreter",
                (lambda x, labels, entropy_grad: entry(x, labels, entropy_grad=entropy_grad))
                if entry
                else None,
                status if entry or status.startswith("failed") else f"triton path: {status}",
            )
        )
    paths += [trainer_path(args.no_verl), liger_path(device, args.no_liger)]
    return paths, status
