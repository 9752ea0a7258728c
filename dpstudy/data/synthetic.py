"""Generated datasets: ten classes of smooth random prototypes, seen through shift, contrast and noise.

Each class is one smooth random pattern. A sample is its class pattern cropped at a random offset
of up to SHIFT pixels, with random contrast and brightness, under strong gaussian noise. A small
CNN must learn shift-tolerant features to separate the classes, so accuracy rises over a few
epochs instead of being perfect after one step (LeNet, SGD lr 0.05: ~95-98 % after 3 epochs).
Everything comes from one seed through CPU generators: the same seed gives identical tensors.
Vectorised: the default sizes take well under a second.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CLASSES = 10
SHIFT = 4  # pixels of random translation either way
SMOOTHNESS = 4  # prototype detail: one random value per SMOOTHNESS x SMOOTHNESS pixels
CONTRAST = (0.3, 1.1)  # multiplies the unit-variance prototype
BRIGHTNESS = 0.4  # std of a per-sample offset
# With C channels the noise std is NOISE * sqrt(C) and a unit is SCALE / sqrt(C) grey levels:
# colour channels carry independent evidence, so RGB would otherwise be far easier than grey.
NOISE = 1.0  # std of per-pixel gaussian noise
SCALE = 40.0  # grey levels per unit; 128 is zero


def _generator(seed: int, stream: int) -> torch.Generator:
    """Independent streams per seed (prototypes, train, test), so the test set does not
    depend on train_size."""
    return torch.Generator().manual_seed(seed * 3 + stream)


def prototypes(channels: int, size: int, seed: int) -> torch.Tensor:
    """float [CLASSES, C, size + 2*SHIFT, size + 2*SHIFT], zero mean and unit std per class."""
    big = size + 2 * SHIFT
    coarse = torch.randn(CLASSES, channels, big // SMOOTHNESS + 1, big // SMOOTHNESS + 1, generator=_generator(seed, 0))
    smooth = F.interpolate(coarse, size=(big, big), mode="bicubic", align_corners=False)
    flat = smooth.flatten(1)
    flat = (flat - flat.mean(1, keepdim=True)) / flat.std(1, keepdim=True)
    return flat.view_as(smooth)


def samples(protos: torch.Tensor, n: int, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 [n, C, size, size], int64 [n]) with every class as even as n allows."""
    channels = protos.shape[1]
    labels = (torch.arange(n) % CLASSES)[torch.randperm(n, generator=generator)]
    dy, dx = torch.randint(0, 2 * SHIFT + 1, (2, n), generator=generator)
    # Every shifted crop as a view [CLASSES, C, 2*SHIFT+1, 2*SHIFT+1, size, size]: indexing it
    # copies only the n chosen crops.
    windows = protos.unfold(2, size, 1).unfold(3, size, 1)
    crops = windows[labels, :, dy, dx]
    low, high = CONTRAST
    contrast = low + (high - low) * torch.rand(n, 1, 1, 1, generator=generator)
    brightness = BRIGHTNESS * torch.randn(n, 1, 1, 1, generator=generator)
    noise = torch.randn(n, channels, size, size, generator=generator).mul_(NOISE * channels**0.5)
    # In place: the defaults are tens of millions of values, temporaries would double the time.
    images = crops.mul_(contrast).add_(brightness).add_(noise).mul_(SCALE / channels**0.5)
    images = images.add_(128).round_().clamp_(0, 255)
    return images.to(torch.uint8).contiguous(), labels


def splits(
    channels: int, size: int, seed: int, train_size: int, test_size: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{"train": (images, labels), "test": (images, labels)} for one seed."""
    protos = prototypes(channels, size, seed)
    return {
        "train": samples(protos, train_size, size, _generator(seed, 1)),
        "test": samples(protos, test_size, size, _generator(seed, 2)),
    }
