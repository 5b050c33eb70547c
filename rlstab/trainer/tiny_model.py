"""A ~0.8M-parameter causal transformer over characters, and the demo's :class:`TinyPolicy`.

Small enough to train from scratch in seconds on two CPU cores, so the demo downloads nothing
and every run is reproducible from its seed. It is a plain pre-LayerNorm GPT: learned token and
position embeddings, ``n_layer`` blocks of causal self-attention and a GELU MLP, a final
LayerNorm and an output head tied to the token embedding.

Prompts of different lengths are left-padded; padding is masked out of attention and positions
count real tokens only, so a prompt's tokens see the same positions whatever the padding.
Sampling keeps a key/value cache (one new token per forward), which makes a step's rollout cost
about as much as one forward pass over it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from rlstab.clipping.lp_reg import min_p_proxy_logprobs
from rlstab.lazy import torch
from rlstab.trainer.policy import Rollout, TokenDistribution, next_token, sampled_logprob

nn = torch.nn  # loads torch: this module is imported by the commands that train, never to validate
F = torch.nn.functional


@dataclass(frozen=True)
class TinyConfig:
    """The transformer's shape; part of the warm-start cache key."""

    vocab_size: int
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    d_ff: int = 512
    max_len: int = 64

    def as_dict(self) -> dict:
        return asdict(self)


class _Block(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x, attn_mask, past):
        N, L, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(N, L, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = x + self.proj(y.transpose(1, 2).reshape(N, L, D))
        return x + self.mlp(self.ln2(x)), (k, v)


class TinyTransformer(nn.Module):
    """``forward(ids, positions, attn_mask, past) -> (logits, present)``; ``attn_mask`` True = may attend."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2's scaled init of the residual projections
            for proj in (block.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids, positions, attn_mask, past=None):
        x = self.tok(ids) + self.pos(positions)
        present = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, attn_mask, None if past is None else past[i])
            present.append(kv)
        return self.ln_f(x) @ self.tok.weight.T, present


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, real)``, both ``[N, L]``: rows right-aligned, ``real`` False on the padding."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row)
            real[i, width - len(row) :] = True
    return ids, real


def _full_attention_mask(real: torch.Tensor) -> torch.Tensor:
    """``[N, 1, L, L]``: causal, padding keys hidden; every position sees itself (no empty softmax row)."""
    L = real.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    return (causal & (real[:, None, :] | torch.eye(L, dtype=torch.bool)))[:, None]


def _positions(real: torch.Tensor) -> torch.Tensor:
    return (real.long().cumsum(-1) - 1).clamp(min=0)


def response_mask_until_eos(response_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """True on each row's tokens up to and including its first EOS (every token when there is none)."""
    is_eos = (response_ids == eos_id).long()
    return (is_eos.cumsum(-1) - is_eos) == 0


class TinyPolicy(TokenDistribution):
    """The tiny transformer as a ``rlstab.trainer.policy.Policy``.

    ``temperature <= 0`` in :meth:`sample` means greedy decoding (what the held-out evaluation uses).
    ``warm_start`` is set by the warm start (where the weights came from, whether from the cache).
    """

    def __init__(self, model: TinyTransformer, codec):
        self.model = model
        self.codec = codec
        self.warm_start = None

    @classmethod
    def create(cls, codec, config: TinyConfig | None = None) -> TinyPolicy:
        """A freshly initialised policy (initialised from torch's global RNG: seed it first)."""
        return cls(TinyTransformer(config or TinyConfig(vocab_size=codec.vocab_size)), codec)

    @property
    def config(self) -> TinyConfig:
        return self.model.cfg

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def num_parameters(self) -> int:
        # The output head is tied to the token embedding, so this counts every weight once.
        return sum(p.numel() for p in self.model.parameters())

    @torch.no_grad()
    def sample(
        self, prompt_ids: list[list[int]], *, max_new_tokens: int, temperature: float, generator: torch.Generator
    ) -> Rollout:
        model = self.model
        ids, real = _left_pad(prompt_ids, self.codec.pad_id)
        N, width = ids.shape
        if width + max_new_tokens > model.cfg.max_len:
            raise ValueError(f"prompt ({width}) + max_new_tokens ({max_new_tokens}) exceeds max_len {model.cfg.max_len}")
        logits, cache = model(ids, _positions(real), _full_attention_mask(real))
        next_logits = logits[:, -1]
        next_position = real.sum(-1)
        key_real = real
        finished = torch.zeros(N, dtype=torch.bool)
        out, logprobs = [], []
        for t in range(max_new_tokens):
            token = next_token(next_logits, temperature, generator)
            token = torch.where(finished, torch.full_like(token, self.codec.pad_id), token)
            out.append(token)
            logprobs.append(sampled_logprob(next_logits, token))
            finished |= token == self.codec.eos_id
            if bool(finished.all()) or t == max_new_tokens - 1:
                break
            key_real = torch.cat([key_real, torch.ones(N, 1, dtype=torch.bool)], dim=1)
            logits, cache = model(token[:, None], (next_position + t)[:, None], key_real[:, None, None, :], cache)
            next_logits = logits[:, -1]
        response_ids = torch.stack(out, dim=1)
        return Rollout(
            prompt_ids=[list(p) for p in prompt_ids],
            response_ids=response_ids,
            response_mask=response_mask_until_eos(response_ids, self.codec.eos_id),
            logprobs=torch.stack(logprobs, dim=1),
        )

    def _distribution(self, rollout: Rollout, sum_squares: bool, min_p: float | None = None, entropy_grad: bool = False):
        prompt, real = _left_pad(rollout.prompt_ids, self.codec.pad_id)
        response = rollout.response_ids
        seq = torch.cat([prompt, response], dim=1)
        seq_real = torch.cat([real, torch.ones_like(response, dtype=torch.bool)], dim=1)
        # A row's padding after its response may run past max_len (DEEP-GRPO's branch rows: prompt and prefix, then
        # the rollout's full response width); its positions are clamped, as its logits are never read.
        positions = _positions(seq_real).clamp(max=self.model.cfg.max_len - 1)
        logits, _ = self.model(seq, positions, _full_attention_mask(seq_real))
        width, T = prompt.shape[1], response.shape[1]
        logp = torch.log_softmax(logits[:, width - 1 : width + T - 1].float(), dim=-1)
        logprobs = logp.gather(-1, response[..., None]).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1) if entropy_grad else None  # with its gradient (an entropy bonus)
        with torch.no_grad():
            p = logp.exp()
            if entropy is None:
                entropy = -(p * logp).sum(-1)
            third = None
            if sum_squares:
                third = (p * p).sum(-1)
            elif min_p is not None:  # Lp-Reg's proxy (TokenBatch.proxy_logprobs)
                third = min_p_proxy_logprobs(logp, response, min_p)
        return logprobs, entropy, third
