"""One gloo rank of test_training_worker.py: a real veRL 0.9.1 actor update on CPU.

A module of its own so that ``torch.multiprocessing`` spawn can import it in a fresh process. Every rank
runs in such a process, even with one rank, because what it sets up is process-global and must not leak
into the rest of the pytest session: veRL's platform singleton, the modules that cache the device name
at import, the default process group.
"""

from __future__ import annotations

import os
import sys
import types
from contextlib import contextmanager

import torch

# --------------------------------------------------------------------------------------------------
# The CPU platform
# --------------------------------------------------------------------------------------------------


def cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls veRL makes through ``get_torch_device()`` on this path.

    ``TrainingWorker._postprocess_output`` reads ``max_memory_allocated``/``max_memory_reserved`` for
    its perf metrics, ``log_gpu_memory_usage`` reads ``memory_allocated``/``memory_reserved``/
    ``mem_get_info``, and ``flops_counter.get_device_flops`` asks ``get_device_name`` (it names
    ``torch.cpu`` "CPU" itself, but only when the module *is* ``torch.cpu``, which lacks the rest).
    torch.cpu has none of them: here the memory figures are zero and the name is "CPU".
    """
    module = types.ModuleType("verl_test_cpu_device")
    module.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("_")})
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, lambda *args, **kwargs: 0)
    module.mem_get_info = lambda *args, **kwargs: (0, 0)
    module.empty_cache = lambda: None
    module.manual_seed = module.manual_seed_all = torch.manual_seed
    module.get_device_name = lambda *args, **kwargs: "CPU"
    return module


def install_cpu_platform() -> None:
    """Register a ``cpu`` platform with veRL and make it the current one.

    veRL 0.9.1 resolves every device question (``verl.utils.device.get_device_name``,
    ``get_torch_device``, ``get_device_id``, ``get_nccl_backend``) through one platform singleton
    (``verl.plugin.platform.get_platform``) and ships only nvidia, npu and rocm platforms; without
    an accelerator it falls back to nvidia. ``PlatformRegistry.register`` and ``set_platform`` are its
    public plugin API, so this is an addition, not a patch. It must run before
    ``verl.workers.engine.fsdp.transformer_impl`` is imported: that module caches the device name at
    import.
    """
    from verl.plugin.platform import PlatformBase, PlatformRegistry, set_platform

    assert "verl.workers.engine.fsdp.transformer_impl" not in sys.modules, "install the platform first"

    @PlatformRegistry.register(platform="cpu")
    class CpuPlatform(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = cpu_device_module()

        def is_available(self) -> bool:
            return True

        # "cpu", not 0: veRL moves tensors with ``.to(get_device_id())``, and ``.to(0)`` means cuda:0.
        def current_device(self):
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    set_platform(CpuPlatform())


def register_fsdp_engine_for_cpu() -> None:
    """Let veRL's ``EngineRegistry`` find its FSDP language-model engine on the ``cpu`` device.

    ``FSDPEngineWithLMHead`` registers itself for ``device=["cuda", "npu"]`` only, and
    ``EngineRegistry.get_engine_cls`` looks the engine up by ``get_device_name()``. Registering the same
    class for ``cpu`` goes through the registry's public decorator; the engine itself is unchanged.
    """
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
        FSDPEngineWithLMHead
    )


# --------------------------------------------------------------------------------------------------
# The tiny model
# --------------------------------------------------------------------------------------------------

VOCAB = 64


def save_tiny_llama(path: str) -> None:
    """Write a randomly initialised 2-layer Llama and a word-level tokenizer to ``path``.

    ``HFModelConfig`` loads config, tokenizer and generation config from a local path, and the FSDP
    engine calls ``from_pretrained`` on it; nothing here touches the hub. ``initializer_range=0.3``
    (not 0.02) makes the next-token distributions peaked: about a third of uniformly drawn tokens
    get probability below STAPO's 0.002 and the entropies spread out, so STAPO's S2T mask has
    tokens to silence.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    specials = ["<pad>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"t{i}" for i in range(VOCAB - len(specials))])}
    backend = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    )
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        initializer_range=0.3,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


# --------------------------------------------------------------------------------------------------
# Configs, as veRL's trainer composes them
# --------------------------------------------------------------------------------------------------

BATCH = 8  # sequences per update, over all ranks
MINI_BATCH = 4  # ppo_mini_batch_size: two optimizer steps per update
MICRO_BATCH = 2  # ppo_micro_batch_size_per_gpu: gradient accumulation inside each step


def compose_actor_rollout_ref(model_path: str, overrides: list[str]):
    """``actor_rollout_ref`` of veRL's own ``ppo_trainer.yaml``, composed by Hydra as ``main_ppo`` does."""
    import verl.trainer.config
    from hydra import compose, initialize_config_dir

    config_dir = os.path.dirname(verl.trainer.config.__file__)
    base = [
        f"actor_rollout_ref.model.path={model_path}",
        # flash_attention_2 is veRL's default and CUDA-only.
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH}",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        # torch.compile of the entropy kernel needs a C++ toolchain on CPU and costs seconds per case.
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO_BATCH}",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=base + overrides)
    return config.actor_rollout_ref


def training_worker_config(arr):
    """The actor's ``TrainingWorkerConfig``, built as ``ActorRolloutRefWorker.init_model`` builds it.

    Returns it with the ``ActorConfig`` that ``ppo_loss`` takes.
    """
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig

    model_config = omega_conf_to_dataclass(arr.model)
    actor_config = omega_conf_to_dataclass(arr.actor)
    actor_config.model_config = model_config
    config = TrainingWorkerConfig(
        model_type=model_config.get("model_type", "language_model"),
        model_config=model_config,
        engine_config=actor_config.engine,
        optimizer_config=actor_config.optim,
        checkpoint_config=actor_config.checkpoint,
        profiler_config=None,
    )
    engine = config.engine_config
    engine.use_dynamic_bsz = arr.actor.use_dynamic_bsz
    engine.infer_max_token_len_per_gpu = arr.rollout.log_prob_max_token_len_per_gpu
    engine.infer_micro_batch_size_per_gpu = arr.rollout.log_prob_micro_batch_size_per_gpu
    engine.max_token_len_per_gpu = arr.actor.ppo_max_token_len_per_gpu
    engine.micro_batch_size_per_gpu = arr.actor.ppo_micro_batch_size_per_gpu
    engine.use_remove_padding = model_config.get("use_remove_padding", False)
    return config, actor_config


# --------------------------------------------------------------------------------------------------
# The batch, as veRL's trainer hands it to update_actor
# --------------------------------------------------------------------------------------------------

PROMPT_LEN = 6
RESPONSE_LEN = 8


def rollout_batch(model_path: str, seed: int = 0):
    """A rollout ``DataProto`` as ``RayPPOTrainer`` holds it before ``_update_actor``.

    Prompts left-padded, responses right-padded, ragged lengths, advantages of both signs. The old
    log-probs are the saved model's own, from a plain transformers forward over the padded batch: the
    first mini-batch then starts at ratio 1, which only holds if veRL's packed CPU forward computes the
    same log-probs.
    """
    from transformers import AutoModelForCausalLM
    from verl import DataProto

    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(2, PROMPT_LEN + 1, (BATCH,), generator=g)
    response_lens = torch.randint(3, RESPONSE_LEN + 1, (BATCH,), generator=g)
    prompts = torch.zeros(BATCH, PROMPT_LEN, dtype=torch.long)
    responses = torch.zeros(BATCH, RESPONSE_LEN, dtype=torch.long)
    prompt_mask = torch.zeros(BATCH, PROMPT_LEN, dtype=torch.long)
    response_mask = torch.zeros(BATCH, RESPONSE_LEN, dtype=torch.long)
    for i in range(BATCH):
        p, r = int(prompt_lens[i]), int(response_lens[i])
        prompts[i, PROMPT_LEN - p :] = torch.randint(3, VOCAB, (p,), generator=g)
        prompt_mask[i, PROMPT_LEN - p :] = 1
        responses[i, :r] = torch.randint(3, VOCAB, (r,), generator=g)
        response_mask[i, :r] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    advantages = torch.randn(BATCH, 1, generator=g).expand(BATCH, RESPONSE_LEN) * response_mask

    model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa")
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logprobs = torch.log_softmax(logits[:, PROMPT_LEN - 1 : -1].float(), dim=-1)
    old_log_probs = logprobs.gather(-1, responses.unsqueeze(-1)).squeeze(-1) * response_mask

    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
            "old_log_probs": old_log_probs,
            "advantages": advantages.contiguous(),
        },
        meta_info={"temperature": 1.0, "multi_turn": False},
    )


def update_actor_input(batch, actor):
    """``RayPPOTrainer._update_actor``'s conversion of the batch, up to the ``update_actor`` call."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    batch_td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        batch_td,
        calculate_entropy=actor.calculate_entropy or actor.entropy_coeff != 0.0,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=actor.ppo_mini_batch_size,
        mini_batch_size=actor.ppo_mini_batch_size,
        epochs=actor.ppo_epochs,
        seed=actor.data_loader_seed,
        dataloader_kwargs={"shuffle": actor.shuffle},
        compute_loss=True,
    )
    return batch_td


# --------------------------------------------------------------------------------------------------
# One rank
# --------------------------------------------------------------------------------------------------


def rank_rows(rank: int, world_size: int) -> list[int]:
    """The batch rows rank ``rank`` trains on.

    The Ray dispatch hands each data-parallel rank a contiguous chunk and each rank cuts its chunk
    into mini-batches of ``MINI_BATCH / world_size`` rows, so handing out rows in the order
    0,1 | 4,5 (rank 0) and 2,3 | 6,7 (rank 1) gives two ranks the same two global mini-batches
    (rows 0-3, then 4-7) and the same micro-batches as one rank has. The trainer reorders its batch
    too (``balance_batch``).
    """
    per_rank_mini = MINI_BATCH // world_size
    return [
        start + rank * per_rank_mini + i
        for start in range(0, BATCH, MINI_BATCH)
        for i in range(per_rank_mini)
    ]


def join_cpu_group(rank: int, world_size: int) -> bool:
    """Make this process rank ``rank`` of a gloo group on veRL's CPU test platform; whether ``import verl`` loaded rlstab.

    ``MASTER_ADDR``/``MASTER_PORT`` are set by ``rlstab.testing.spawned_ranks.run_ranks``, which spawned it.
    """
    os.environ.update(
        HF_HUB_OFFLINE="1",
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)  # two ranks on a two-core machine
    install_cpu_platform()  # the first `import verl`, which loads the verl.plugins entry points
    plugin_loaded = "rlstab.adapters.verl" in sys.modules
    register_fsdp_engine_for_cpu()
    # TrainingWorker calls verl.utils.distributed.initialize_global_process_group_ray, which asks for
    # the backend "cpu:gloo,<device>:<comm backend>"; with device cpu that is "cpu:gloo,cpu:gloo", which
    # torch rejects as a duplicate. It only initialises when no default group exists, so start one here.
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    return plugin_loaded


def rlstab_training_worker(model_path: str, overrides: list[str]):
    """``(worker, actor_rollout_ref config, actor config)``: a built ``TrainingWorker`` whose loss is verl's ``ppo_loss``."""
    from functools import partial

    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils import losses

    arr = compose_actor_rollout_ref(model_path, overrides)
    config, actor_config = training_worker_config(arr)
    worker = TrainingWorker(config=config)
    worker.reset()  # builds model, optimizer and scheduler, as ActorRolloutRefWorker.init_model does
    # Looked up at call time: rlstab's adapter, loaded by `import verl`, replaces losses.ppo_loss.
    worker.set_loss_fn(partial(losses.ppo_loss, config=actor_config))
    return worker, arr, actor_config


def run_rank(rank: int, world_size: int, model_path: str, overrides: list[str]) -> dict:
    """Build a ``TrainingWorker`` on this rank and run one actor update: what it did (``spawned_ranks.run_ranks``)."""
    plugin_loaded = join_cpu_group(rank, world_size)

    from torch.distributed.tensor import DTensor
    from verl.utils import tensordict_utils as tu

    worker, arr, actor_config = rlstab_training_worker(model_path, overrides)
    params = dict(worker.engine.module.named_parameters())
    before = {k: p.full_tensor().detach().clone() for k, p in params.items()}
    batch = rollout_batch(model_path)[rank_rows(rank, world_size)]
    output = worker.train_mini_batch(update_actor_input(batch, arr.actor))
    after = {k: p.full_tensor().detach().clone() for k, p in params.items()}
    return {
        "before": before,
        "after": after,
        "local_numel": sum(
            p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params.values()
        ),
        "metrics": {k: _plain(v) for k, v in tu.get(output, "metrics").items()},
        "plugin_loaded_by_import_verl": plugin_loaded,
        "entropy_function": worker.engine.compute_entropy_from_logits.__module__,
    }


def _plain(value):
    """Metric values as floats: they cross a process boundary."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    try:
        return float(value)
    except (TypeError, ValueError):
        return value
