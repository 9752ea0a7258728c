"""Training throughput and MFU of one model as a cell trains it: the project's device loader and
Trainer, single device, synthetic images generated like dpstudy.data.synthetic's.

A warm-up epoch (cuDNN/cuBLAS set-up, allocator growth), then steady epochs until at least
`min_steady_s` of training; images/s is steady samples over steady wall time (clocks read after
a device synchronize, as in every cell). FLOPs per image are forward + backward as
torch.utils.flop_counter counts them (dpstudy.models.cost: convolutions and matmuls, the
convention of MFU); MFU = achieved FLOP/s / the device's dense BF16 peak (dpstudy.util.peaks).
"""

from __future__ import annotations

import math

import torch

from dpstudy import models
from dpstudy.data import synthetic
from dpstudy.data.task import Task
from dpstudy.engine.loaders import Partition, make_loader
from dpstudy.engine.modes import MODES
from dpstudy.engine.train import Trainer
from dpstudy.study.spec import complete
from dpstudy.util import peaks


def synthetic_images(n: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 [n, 3, size, size], int64 [n]): dpstudy.data.synthetic's ten classes, so the loss can fall."""
    protos = synthetic.prototypes(3, size, seed)
    return synthetic.samples(protos, n, size, torch.Generator().manual_seed(seed + 1))


def measure(
    device: str | torch.device = "cuda",
    model: str = "resnet18",
    size: int = 32,
    images: int = 50_000,
    batch: int = 512,
    precision: str = "bf16",
    channels_last: bool = True,
    augment: str = "crop_flip",
    min_steady_s: float = 10.0,
    max_steady_epochs: int = 100,
    seed: int = 0,
) -> dict:
    """Train `model` on `images` synthetic RGB images of `size` and report its steady throughput."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    x, y = synthetic_images(images, size, seed)
    scaled = x.float().div_(255)
    mean, std = scaled.mean((0, 2, 3)).tolist(), scaled.std((0, 2, 3)).tolist()
    del scaled
    spec = complete(
        {
            "dataset": "synthetic_rgb",
            "model": model,
            "mode": "single",
            "batch": batch,
            "precision": precision,
            "channels_last": channels_last,
            "loader": "device",
            "augment": augment,
            "device": device.type,
            "seed": seed,
        }
    )
    mode = MODES["single"](device)
    loader = make_loader(
        "device",
        x,
        y,
        batch=batch,
        partition=Partition(0, 1),
        seed=seed,
        augment=augment,
        mean=mean,
        std=std,
        device=device,
        train=True,
        channels_last=channels_last,
    )
    torch.manual_seed(seed)
    net = models.build(model, Task.image(3, size, 10)).to(device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    trainer = Trainer(spec, mode, loader, None, net, log=lambda line: None)
    warmup = trainer.train_epoch(1)
    steady: list[dict] = []
    while not steady or (sum(e["wall_s"] for e in steady) < min_steady_s and len(steady) < max_steady_epochs):
        steady.append(trainer.train_epoch(len(steady) + 2))
    wall = sum(e["wall_s"] for e in steady)
    samples = sum(e["samples"] for e in steady)
    images_per_s = samples / wall
    flops = models.cost(model, Task.image(3, size, 10))["train_flops_per_sample"]
    achieved = images_per_s * flops / 1e12
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peaks.lookup(name) if device.type == "cuda" else None
    loss = steady[-1]["train_loss"]
    return {
        "model": model,
        "size": size,
        "images": images,
        "batch": batch,
        "precision": precision,
        "channels_last": channels_last,
        "augment": augment,
        "loader": "device",
        "optimizer": spec["optimizer"],
        "device": str(device),
        "device_name": name,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "warmup_epoch_s": warmup["wall_s"],
        "steady_epochs": len(steady),
        "steady_s": wall,
        "steady_samples": samples,
        "images_per_s": images_per_s,
        "epoch_images_per_s": [e["samples_per_s"] for e in steady],
        "data_wait_share": sum(e["data_wait_s"] for e in steady) / wall,
        "flops_per_image": flops,
        "achieved_tflops": achieved,
        "peak_tflops": peak.bf16_tflops if peak else None,
        "peak_label": peak.label if peak else None,
        "peak_source": peak.source if peak else None,
        "mfu": achieved / peak.bf16_tflops if peak else None,
        "first_loss": warmup["train_loss"],
        "final_loss": loss,
        "loss_finite": math.isfinite(loss),
    }
