"""The actor engine's entropy from ``rlstab.stats`` against veRL's own ``entropy_from_logits``.

The whole path (a real ``TrainingWorker`` whose engine computes entropy with rlstab's function and
trains to the same parameters as with veRL's) is in ``test_training_worker.py``; here: the values
and gradients, what autograd keeps, and which configs switch the engine's function.
"""

from functools import partial

import pytest
import torch
from test_config import ACTOR, SELECT, actor, run_fresh
from verl.utils import torch_functional as verl_F
from verl.workers.utils import losses

from rlstab.adapters.verl.entropy import entropy_from_logits, use_rlstab_entropy


def random_logits(n=37, vocab=1000, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(n, vocab, generator=g)).to(dtype)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_and_entropy_bonus_gradient_equal_verls(seed):
    logits = random_logits(seed=seed).double().requires_grad_()
    g = torch.randn(logits.shape[0], generator=torch.Generator().manual_seed(10 + seed), dtype=torch.float64)
    ours = entropy_from_logits(logits)
    (grad_ours,) = torch.autograd.grad((g * ours).sum(), logits)
    verls = verl_F.entropy_from_logits(logits)
    (grad_verl,) = torch.autograd.grad((g * verls).sum(), logits)
    assert torch.allclose(ours, verls, atol=1e-12, rtol=0)
    assert torch.allclose(grad_ours, grad_verl, atol=1e-12, rtol=0)


def test_bf16_logits_give_float32_entropy_of_the_bf16_values():
    logits = random_logits(dtype=torch.bfloat16)
    ours = entropy_from_logits(logits, chunk_size=2048)  # veRL's chunked signature
    assert ours.dtype == torch.float32
    # veRL's own function in float32 on the same bf16 values (its bf16 result is rounded to ~3 digits)
    assert torch.allclose(ours, verl_F.entropy_from_logits(logits.float()), atol=1e-5, rtol=0)


def saved_bytes(fn, logits) -> int:
    """Bytes of the tensors autograd saves for backward, other than the logits themselves."""
    sizes = []

    def pack(t):
        if t.data_ptr() != logits.data_ptr():
            sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(logits)
    return sum(sizes)


def test_autograd_keeps_no_vocabulary_sized_tensor():
    n, vocab = 64, 4096
    logits = random_logits(n, vocab).requires_grad_()
    # veRL's: the [n, V] softmax (and the product's operands) for a backward the rlstab loss never takes
    assert saved_bytes(verl_F.entropy_from_logits, logits) >= n * vocab * 4
    # rlstab's: the logits (already kept for the log-probs) and a few numbers per token
    assert saved_bytes(entropy_from_logits, logits) <= 4 * n * 8


def test_only_an_rlstab_actor_with_the_default_gets_rlstab_entropy():
    def engine():
        return type("Engine", (), {"compute_entropy_from_logits": staticmethod(verl_F.entropy_from_logits)})()

    cases = {
        (): False,  # veRL's vanilla loss
        tuple(SELECT): True,
        tuple(SELECT) + (f"+{ACTOR}.policy_loss.entropy_function=verl",): False,
    }
    for overrides, expected in cases.items():
        config = actor(*overrides, f"{ACTOR}.calculate_entropy=True")
        e = engine()
        assert use_rlstab_entropy(e, partial(losses.ppo_loss, config=config)) is expected, overrides
        assert (e.compute_entropy_from_logits is entropy_from_logits) is expected
    # An engine without the attribute (Megatron's vocabulary-parallel entropy) is left alone.
    rlstab_actor = actor(*SELECT, f"{ACTOR}.calculate_entropy=True")
    assert use_rlstab_entropy(object(), partial(losses.ppo_loss, config=rlstab_actor)) is False


def test_bad_entropy_function_is_named():
    with pytest.raises(Exception, match=r"policy_loss.entropy_function = 'triton': allowed rlstab, verl"):
        actor(*SELECT, f"{ACTOR}.calculate_entropy=True", f"+{ACTOR}.policy_loss.entropy_function=triton")


def test_set_loss_fn_is_wrapped_when_verls_worker_module_is_imported():
    """``import verl`` loads the adapter without importing the worker module; importing it later wraps
    ``TrainingWorker.set_loss_fn``, keeping veRL's dispatch registration."""
    code = (
        "import sys, verl\n"
        "assert 'rlstab.adapters.verl' in sys.modules\n"
        "assert 'verl.workers.engine_workers' not in sys.modules\n"
        "from verl.single_controller.base.decorator import MAGIC_ATTR\n"
        "from verl.workers.engine_workers import TrainingWorker\n"
        "assert TrainingWorker.set_loss_fn.__rlstab_wrapped__\n"
        "assert hasattr(TrainingWorker.set_loss_fn, MAGIC_ATTR)\n"
    )
    run_fresh(code)


def test_a_gpu_without_the_kernels_gets_verls_function(monkeypatch):
    # Logits off the CPU for which rlstab would run its torch path (no Triton): veRL's function is the faster
    # one there, so rlstab's calls it. The meta device stands for such a GPU (no values, only the call).
    from rlstab.adapters.verl import entropy

    calls = []
    monkeypatch.setattr(entropy, "runs_fused", lambda logits: False)
    monkeypatch.setattr(verl_F, "entropy_from_logits", lambda logits: calls.append(logits.device.type) or logits.sum(-1))
    entropy_from_logits(torch.zeros(3, 8, device="meta"))
    assert calls == ["meta"]
    entropy_from_logits(torch.zeros(3, 8))  # the CPU: rlstab's own path
    assert calls == ["meta"]
