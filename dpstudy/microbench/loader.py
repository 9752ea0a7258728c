"""Loader benchmark: the same lenet/synthetic cell at batch 64 for two epochs, steady (second) epoch:

  (a) loader torch, 0 workers, augment affine   -- source 002's baseline
  (b) the same with 2 workers
  (c) loader device, augment affine             -- the whole split on the device, augmented in batches
  (d) the bound: the bare training step over pre-made tensors, no augmentation

benchmarks/loader.py prints the table; `make gpu-check` (dpstudy.gpucheck) runs (a), (c) and (d)
on CUDA. Targets: on the 2-core CPU (c) >= 2.5x faster than (a) and within 1.15x of (d); on a
GPU (c) >= 20x faster than (a) with data wait under 5 % of its epoch.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterable

import torch

from dpstudy import models
from dpstudy.data import store as data
from dpstudy.engine.cell import load_datasets
from dpstudy.engine.modes import mode_for
from dpstudy.engine.train import Trainer
from dpstudy.study.spec import complete

VARIANTS = {
    "a": ("torch, 0 workers, affine", {"loader": "torch", "workers": 0, "augment": "affine"}),
    "b": ("torch, 2 workers, affine", {"loader": "torch", "workers": 2, "augment": "affine"}),
    "c": ("device, affine", {"loader": "device", "augment": "affine"}),
}
NAMES = {**{key: name for key, (name, _) in VARIANTS.items()}, "d": "bound: bare step, pre-made tensors"}
BATCH = 64


def _spec(root: str, device: str, **settings) -> dict:
    return complete(
        {
            "dataset": "synthetic",
            "model": "lenet",
            "mode": "single",
            "batch": BATCH,
            "data_root": root,
            "device": device,
            **settings,
        }
    )


def steady_epoch(settings: dict, root: str, device: str) -> dict:
    """Train epochs 1 and 2 of the cell with `settings`; epoch 2's figures."""
    spec = _spec(root, device, epochs=2, **settings)
    mode = mode_for(spec, env={})
    torch.manual_seed(0)
    task, _, (train_data, test_data) = load_datasets(spec, mode)
    model = models.build("lenet", task).to(mode.device)
    trainer = Trainer(spec, mode, train_data, test_data, model, log=lambda line: None)
    epochs = [trainer.train_epoch(epoch) for epoch in (1, 2)]
    return epochs[-1]


def bound_epoch(root: str, device: str) -> dict:
    """The training step alone over batches made before the clock starts."""
    spec = _spec(root, device)
    mode = mode_for(spec, env={})
    torch.manual_seed(0)
    task, _, (train_data, test_data) = load_datasets(spec, mode)
    batches = list(train_data)  # normalised, no augmentation
    model = models.build("lenet", task).to(mode.device)
    trainer = Trainer(spec, mode, train_data, test_data, model, log=lambda line: None)
    for x, y in batches:  # warm-up epoch
        trainer.step(x, y)
    mode.synchronize()
    start = time.perf_counter()
    for x, y in batches:
        trainer.step(x, y)
    mode.synchronize()
    wall = time.perf_counter() - start
    samples = sum(len(y) for _, y in batches)
    return {"wall_s": wall, "data_wait_s": 0.0, "compute_s": wall, "samples": samples, "samples_per_s": samples / wall}


def _median_run(epochs: list[dict]) -> dict:
    """The run whose epoch time is closest to the median (an actual run, not a blend of runs)."""
    median = statistics.median(e["wall_s"] for e in epochs)
    return min(epochs, key=lambda e: abs(e["wall_s"] - median))


def run(
    device: str = "auto",
    keys: Iterable[str] = ("a", "b", "c", "d"),
    repeats: int = 3,
    root: str | None = None,
    train_size: int | None = None,
) -> dict[str, dict]:
    """{run key: its steady epoch} for the runs in `keys`. (a) and (b) run once; (c) and (d) are
    close, so machine noise matters: they alternate `repeats` times and the median run is kept.
    `root` holds the prepared synthetic dataset (a temporary folder by default, 10,000 samples or
    `train_size`)."""
    keys = list(keys)
    if root is None:
        with tempfile.TemporaryDirectory() as tmp:
            return _run(device, keys, repeats, tmp, train_size)
    return _run(device, keys, repeats, root, train_size)


def _run(device: str, keys: list[str], repeats: int, root: str, train_size: int | None) -> dict[str, dict]:
    overrides = {"train_size": train_size, "test_size": max(BATCH, train_size // 5)} if train_size else None
    data.prepare("synthetic", root, overrides)
    results = {key: steady_epoch(VARIANTS[key][1], root, device) for key in ("a", "b") if key in keys}
    runs: dict[str, list[dict]] = {key: [] for key in ("c", "d") if key in keys}
    for _ in range(repeats):
        if "c" in runs:
            runs["c"].append(steady_epoch(VARIANTS["c"][1], root, device))
        if "d" in runs:
            runs["d"].append(bound_epoch(root, device))
    results.update({key: _median_run(epochs) for key, epochs in runs.items()})
    return {key: results[key] for key in keys}


def table(results: dict[str, dict]) -> list[str]:
    """The markdown table of the runs, each against (a)."""
    lines = ["| run | loader | epoch s | samples/s | data wait | vs (a) |", "|---|---|---|---|---|---|"]
    for key, r in results.items():
        lines.append(
            f"| ({key}) | {NAMES[key]} | {r['wall_s']:.2f} | {r['samples_per_s']:.0f} | "
            f"{r['data_wait_s'] / r['wall_s']:.1%} | {results['a']['wall_s'] / r['wall_s']:.2f}x |"
        )
    return lines
