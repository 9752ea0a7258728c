"""`gpt` (issue 50): a decoder-only transformer language model in the manner of GPT-2.

Token and learned position embeddings, `n_layer` pre-norm blocks (causal self-attention, a 4x
GELU MLP), a final LayerNorm and logits through the token embedding's own matrix (tied). Sizes
and model_args: dpstudy.models.gpt_config.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from dpstudy.models import check_vocab, check_window
from dpstudy.models.gpt_config import GPTConfig, resolve


class CausalSelfAttention(nn.Module):
    """Multi-head attention over the earlier positions, through scaled_dot_product_attention: a
    fused kernel where the device has one (flash attention on CUDA)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.heads, self.dropout = config.n_head, config.dropout
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.proj.residual = True  # scaled at initialisation (GPT.reset_parameters)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class Block(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        d = config.d_model
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(config.dropout))
        self.mlp[2].residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT for a vocabulary of `vocab` symbols (the data's tokenizer) and windows of `window`
    tokens (the cell's seq_len); `args` are the cell's model_args (gpt_config.ARGS): model_args
    vocab_size and seq_len size the embedding tables, and must be at least `vocab` and `window`.

    The embeddings are the root's own Parameters `wte` and `wpe`, and the output projection is
    F.linear on `wte` (tied), no module of its own: FSDP shards every top-level child that holds
    parameters as a unit (dpstudy.engine.modes.fsdp.shard_units). A module holding wte's
    Parameter beside the embedding would shard it twice; and an nn.Embedding unit is resharded
    after its own forward, so the root's F.linear on its weight would meet a shard (a DTensor).
    At the root, the table stays gathered from the lookup to the logits. The blocks are the
    ModuleList `blocks`: one FSDP unit each.
    """

    def __init__(self, vocab: int, window: int, **args: Any):
        super().__init__()
        config = resolve(args)
        if config.vocab_size is None:
            config = GPTConfig(**{**vars(config), "vocab_size": vocab})
        check_vocab(vocab, config.vocab_size, "gpt")
        check_window(window, config.seq_len, "gpt")
        self.config = config
        self.wte = nn.Parameter(torch.empty(config.vocab_size, config.d_model))  # token embeddings, tied
        self.wpe = nn.Parameter(torch.empty(config.seq_len, config.d_model))  # learned positions
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # GPT-2's: normal(0, 0.02) weights and embeddings, zero biases; the projections that add to
        # the residual stream (two per block) scaled by 1/sqrt(2 n_layer), so that the stream's
        # variance does not grow with depth.
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        nn.init.normal_(self.wte, std=0.02)
        nn.init.normal_(self.wpe, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=residual_std if getattr(m, "residual", False) else 0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab_size] of the next token at every position of `ids` [B, T]."""
        t = ids.shape[1]
        if t > self.config.seq_len:
            raise ValueError(f"gpt: {t} tokens exceed the context length {self.config.seq_len}")
        positions = torch.arange(t, device=ids.device)
        x = self.drop(F.embedding(ids, self.wte) + F.embedding(positions, self.wpe))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte)
