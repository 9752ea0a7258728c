"""A few training steps of small models in the modes that specs name, on the ranks torchrun starts
(test_hsdp.py runs it; no test of its own). Every rank builds the same model from seed 0 and
takes its slice of the same global batches; the global loss per step is the ranks' summed loss
over the global batch, what one device computes on the whole batch.

    python -m torch.distributed.run --nproc-per-node=N ranks_steps.py SPECS_JSON OUT_JSON

SPECS_JSON: {name: [spec, model ("mlp" or "resnet")]}; OUT_JSON gets, from rank 0,
{name: {"losses": [...], "mesh": [...], "placements": str, "local_share": float}}.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from dpstudy.engine.modes import mode_for
from dpstudy.engine.train import Trainer
from dpstudy.models.resnet import Residual

STEPS, GLOBAL_BATCH, SIDE = 3, 16, 8


class Block(nn.Module):
    """A pre-norm MLP block with a residual: a transformer block without attention."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        self.embed = nn.Linear(3 * SIDE * SIDE, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(3))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x.flatten(1))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def narrow_resnet(classes: int = 10) -> nn.Module:
    """A ResNet with BatchNorm in its stem and blocks, a few channels wide."""
    stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    stages = nn.Sequential(Residual(8, 8, 1), Residual(8, 16, 2))
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes))
    return nn.Sequential(stem, stages, head)


MODELS = {"mlp": MLP, "resnet": narrow_resnet}


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(GLOBAL_BATCH, 3, SIDE, SIDE, generator=generator),
            torch.randint(0, 10, (GLOBAL_BATCH,), generator=generator),
        )
        for _ in range(STEPS)
    ]


def run(spec: dict, model_name: str, env: dict | None = None) -> dict:
    """This rank's steps of `spec`; the process group is started by the first run and shared."""
    mode = mode_for(spec, env)
    if mode.distributed and not dist.is_initialized():
        mode.start()
    mode.initialized = dist.is_initialized()
    torch.manual_seed(0)
    trainer = Trainer(spec, mode, None, None, MODELS[model_name](), log=lambda _: None)
    share = GLOBAL_BATCH // mode.world_size
    mine = slice(mode.rank * share, (mode.rank + 1) * share)
    losses = []
    for x, y in batches():
        loss_sum, _ = trainer.step(x[mine], y[mine])
        total = mode.all_reduce_sum(loss_sum.detach().double().reshape(1))
        losses.append(total.item() / GLOBAL_BATCH)
    weight = next(p for p in trainer.model.parameters() if p.dim() == 2)
    sharded = hasattr(weight, "device_mesh")
    return {
        "losses": losses,
        "mesh": list(weight.device_mesh.shape) if sharded else [],
        "placements": str(weight.placements) if sharded else "",
        "local_share": weight.to_local().numel() / weight.numel() if sharded else 1.0,
    }


def main(specs_json: str, out: str) -> None:
    runs = {name: run(spec, model) for name, (spec, model) in json.loads(specs_json).items()}
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(runs, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
