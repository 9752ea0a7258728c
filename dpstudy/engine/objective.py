"""What a step minimises and what it counts right, for both tasks (dpstudy.data.task): an image's
class (targets [B], logits [B, classes]) and every next token of a text window (targets [B, T],
logits [B, T, vocab]). Sums are per sample, each sample's the mean over its positions, so that a
loss or accuracy summed over samples and divided by their number is the mean over every
prediction for both tasks (a window's T positions weigh as one sample)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def flat(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, outputs] in fp32, targets [N]): one row per prediction. fp32: FSDP's bf16/fp16
    logits give the loss in full precision."""
    return logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1)


def positions(y: torch.Tensor) -> int:
    """Predictions per sample: 1 for an image, T for a text window."""
    return y[0].numel() if y.dim() > 1 else 1


def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over every prediction: what backward takes."""
    return F.cross_entropy(*flat(logits, y))


def loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Summed over samples, each sample's mean over its positions."""
    return F.cross_entropy(*flat(logits, y), reduction="sum") / positions(y)


def correct(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Samples right, each sample's share of right positions (fp64): the accuracy's numerator."""
    return (logits.argmax(-1) == y).sum(dtype=torch.float64) / positions(y)
