"""A tiny real TRL setup built in memory: byte-level BPE tokenizer, LlamaForCausalLM, GRPOConfig, trainers.

Nothing is downloaded (HF_HUB_OFFLINE=1): the tokenizer is trained on a few strings with
``tokenizers.BpeTrainer``, the model is built from a ``LlamaConfig``. Every trainer is the real
``trl.GRPOTrainer`` or rlstab's subclass of it.
"""

from __future__ import annotations

import copy
import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from rlstab.adapters.trl import RlstabGRPOTrainer  # noqa: E402

torch.set_num_threads(1)  # tiny tensors: threads only add overhead (the test machine has 2 shared cores)

CORPUS = ["1+1=2", "2+3=5", "4+4=8", "7+2=9", "3+3=6", "the sum is", "answer: 12"]
PROMPTS = ["1+1=", "2+3=", "4+4=", "7+2=", "3+3=", "5+1=", "6+2=", "8+1="]


@functools.lru_cache(maxsize=1)
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (~280 tokens) trained in memory."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left"
    )


def tiny_model(seed: int = 0, sharpen: float = 1.0) -> LlamaForCausalLM:
    """hidden 32, 2 layers. ``sharpen`` scales the LM head so next-token distributions differ in entropy."""
    tok = tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def dataset(n: int = 8) -> Dataset:
    return Dataset.from_dict({"prompt": [PROMPTS[i % len(PROMPTS)] for i in range(n)]})


def length_reward(completions, **kwargs) -> list[float]:
    """Reward in code: the fraction of digits in the completion (so rewards differ within a group)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def grpo_config(tmp_path, **overrides) -> GRPOConfig:
    """A CPU float32 GRPOConfig for tiny runs; ``overrides`` are GRPOConfig fields."""
    fields = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        bf16=False,
        activation_checkpointing=False,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    fields.update(overrides)
    return GRPOConfig(**fields)


def make_trainer(tmp_path, objective=None, model=None, step_statistics="data_parallel", **config):
    """The real GRPOTrainer (objective None) or RlstabGRPOTrainer on the tiny model."""
    args = grpo_config(tmp_path, **config)
    kwargs = dict(
        model=model if model is not None else tiny_model(),
        reward_funcs=length_reward,
        args=args,
        train_dataset=dataset(),
        processing_class=tokenizer(),
    )
    if objective is None:
        return GRPOTrainer(**kwargs)
    return RlstabGRPOTrainer(objective=objective, step_statistics=step_statistics, **kwargs)


def trainer_pair(
    tmp_path, objective, trl_config: dict, ours_config: dict | None = None, sharpen: float = 8.0
):
    """(TRL's GRPOTrainer, RlstabGRPOTrainer) on two copies of the same tiny model."""
    model = tiny_model(sharpen=sharpen)
    theirs = make_trainer(tmp_path / "trl", None, model=copy.deepcopy(model), **trl_config)
    ours = make_trainer(tmp_path / "rlstab", objective, model=copy.deepcopy(model), **(ours_config or {}))
    return theirs, ours


PROMPT_LEN = 3


def crafted_inputs(
    trainer,
    seed: int,
    *,
    B: int = 6,
    T: int = 7,
    lengths: list[int] | None = None,
    spread: float = 0.8,
    num_items_in_batch: float | None = None,
) -> dict[str, torch.Tensor]:
    """A TRL micro-batch dict as ``_generate_and_score_completions`` builds it, with chosen values.

    Random prompt and completion token ids; ragged completion masks (``lengths``, default with an
    empty and a full row); advantages of both signs; old log-probabilities = the model's current
    ones plus noise of std ``spread`` (so ratios fall below 1 - eps, above 1 + eps and above the
    dual-clip bound). ``num_items_in_batch`` defaults to this micro-batch's token count.
    """
    g = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer())
    prompt_ids = torch.randint(2, vocab, (B, PROMPT_LEN), generator=g)
    completion_ids = torch.randint(2, vocab, (B, T), generator=g)
    if lengths is None:
        lengths = torch.randint(1, T + 1, (B,), generator=g).tolist()
        lengths[0], lengths[-1] = 0, T
    completion_mask = (torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)).long()
    advantages = torch.randn(B, generator=g)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones(B, PROMPT_LEN, dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": torch.tensor(
            float(completion_mask.sum()) if num_items_in_batch is None else float(num_items_in_batch)
        ),
    }
    current = current_logps(trainer, inputs)
    inputs["old_per_token_logps"] = current + spread * torch.randn(B, T, generator=g)
    return inputs


@torch.no_grad()
def current_logps(trainer, inputs) -> torch.Tensor:
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
        inputs["completion_ids"].size(1),
    )
    return logps


def loss_and_grads(trainer, inputs, accumulation: int = 1, training: bool = True):
    """``trainer._compute_loss`` on ``inputs`` as inside TRL's training loop: loss and every parameter's gradient."""
    model = trainer.model
    model.train(training)
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = accumulation
    loss = trainer._compute_loss(model, inputs)
    if training:
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def last_metrics(trainer, mode: str = "train") -> dict[str, float]:
    """The last value of every metric ``_compute_loss`` appended to TRL's ``_metrics``."""
    return {k: v[-1] for k, v in trainer._metrics[mode].items() if v}


def saved_model(directory, sharpen: float = 8.0) -> str:
    """The tiny model saved to ``directory``: TRL builds its reference model (``beta != 0``) from a path."""
    model = tiny_model(sharpen=sharpen)
    model.save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return str(directory)
