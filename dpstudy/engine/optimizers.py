"""The cell's optimizer, as the study names it (`optimizer`, `lr` scaled by `lr_scaling`, `momentum`,
`weight_decay`): built once here for every mode, whether the Trainer steps it or a ZeRO engine
takes it over (dpstudy.engine.modes.base.Mode.optimizer)."""

from __future__ import annotations

import torch

from dpstudy.study import spec as specs


def build(params, spec: dict) -> torch.optim.Optimizer:
    lr = specs.scaled_lr(spec)
    if spec["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=spec["momentum"], weight_decay=spec["weight_decay"])
    return torch.optim.Adam(params, lr=lr, weight_decay=spec["weight_decay"])
