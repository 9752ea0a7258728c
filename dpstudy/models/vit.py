"""A small vision transformer (issue 16): patch embedding, class token, pre-norm encoder blocks.

Patches are 4x4 on 28x28 and 32x32 inputs (49 and 64 tokens); larger images get the smallest
larger patch that keeps the token count at 64 or below (12x12 on 96x96), see `patch_size`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

MIN_PATCH = 4
MAX_TOKENS = 64  # patch tokens, the class token not counted
MIN_GRID = 2  # patches a side: one patch for the whole image would be an MLP, not a transformer


def patch_size(size: int) -> int:
    """The smallest p >= MIN_PATCH dividing `size` whose grid has 2..8 patches a side (<= 64 tokens)."""
    for p in range(MIN_PATCH, size // MIN_GRID + 1):
        if size % p == 0 and (size // p) ** 2 <= MAX_TOKENS:
            return p
    raise ValueError(
        f"vit: no patch size for {size}x{size} images: it needs a divisor p >= {MIN_PATCH} of {size} "
        f"that gives {MIN_GRID} to {int(MAX_TOKENS**0.5)} patches a side (at most {MAX_TOKENS} tokens)"
    )


class Attention(nn.Module):
    """Multi-head self-attention, written out: torch's FLOP counter sees its matmuls on every
    device (it does not count CPU's fused scaled_dot_product_attention), and at <= 65 tokens a
    fused kernel would save little."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"vit: width {dim} is not divisible by {heads} heads")
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        weights = ((q * self.scale) @ k.transpose(-2, -1)).softmax(-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm encoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, mlp_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """ViT-Tiny's width and heads (192, 3) at half its depth (6 blocks): 2.8 million parameters at
    32x32. Patch embedding (conv, stride = patch), learned position embedding, `depth` pre-norm
    blocks in the ModuleList `blocks` (FSDP shards one unit per block), final LayerNorm and a
    linear head.

    pool picks what the head reads: "flatten" (default) every token, in order, like the
    classifier of a CNN that flattens its last feature map; "cls" a class token; "mean" the mean
    token. The pooled readouts are position-blind at first order: they must learn the spatial
    layout of a class through attention, which takes many epochs when, as in the generated
    datasets, the classes differ in layout only (random smooth patterns, identical local
    statistics). The flattened readout gives every position its own weights and learns those
    datasets as fast as the CNNs (issue 16).
    """

    POOLS = ("flatten", "cls", "mean")

    def __init__(
        self,
        channels: int,
        size: int,
        classes: int = 10,
        dim: int = 192,
        depth: int = 6,
        heads: int = 3,
        mlp_ratio: int = 4,
        pool: str = "flatten",
    ):
        super().__init__()
        if pool not in self.POOLS:
            raise ValueError(f"vit: pool {pool!r} is not one of {self.POOLS}")
        self.patch, self.pool = patch_size(size), pool
        tokens = (size // self.patch) ** 2
        self.embed = nn.Conv2d(channels, dim, self.patch, stride=self.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if pool == "cls" else None
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + (pool == "cls"), dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio * dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim * (tokens if pool == "flatten" else 1), classes)
        # The flattened readout is scaled to the norm of one token: unscaled, its input norm
        # (and so SGD's step on its logits) grows with the token count; at lr 0.05 the logits
        # reach +-100 within an epoch, and backward passes on the ensuing denormal floats run
        # 10-30x slower on CPUs.
        self.flat_scale = tokens**-0.5
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # As timm's ViT: truncated normal (std 0.02) embeddings and linear weights, zero biases;
        # the patch embedding keeps the conv default (fan-in scaled).
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)  # [B, tokens, dim], row by row
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1)
        x = x + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        if self.pool == "flatten":
            return self.head(x.flatten(1) * self.flat_scale)
        return self.head(x[:, 0] if self.pool == "cls" else x.mean(1))
