"""Loader benchmark (issue: training engine, section 7): the same lenet/synthetic cell at batch 64
for two epochs, reporting the steady (second) epoch:

  (a) loader torch, 0 workers, augment affine   -- source 002's baseline
  (b) the same with 2 workers
  (c) loader device, augment affine             -- the whole split on the device, augmented in batches
  (d) the bound: the bare training step over pre-made tensors, no augmentation

    .venv/bin/python benchmarks/loader.py [--threads N] [--device cpu|cuda]

Targets on the 2-core CPU: (c) >= 2.5x faster than (a), and (c) within 1.15x of (d).
With a GPU: (c) >= 20x faster than (a), data wait under 5 % of the epoch.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from dpstudy import data, models
from dpstudy.parallel import plan
from dpstudy.spec import complete
from dpstudy.train import Trainer, load_datasets

VARIANTS = {
    "a": ("torch, 0 workers, affine", {"loader": "torch", "workers": 0, "augment": "affine"}),
    "b": ("torch, 2 workers, affine", {"loader": "torch", "workers": 2, "augment": "affine"}),
    "c": ("device, affine", {"loader": "device", "augment": "affine"}),
}


def steady_epoch(settings: dict, root: str, device: str) -> dict:
    spec = complete({"dataset": "synthetic", "model": "lenet", "mode": "single", "batch": 64, "epochs": 2,
                     "data_root": root, "device": device, **settings})
    par = plan(spec, env={})
    torch.manual_seed(0)
    meta, (train_data, test_data) = load_datasets(spec, par)
    model = models.build("lenet", meta["shape"][0], meta["shape"][1]).to(par.device)
    trainer = Trainer(spec, par, train_data, test_data, model, log=lambda line: None)
    epochs = [trainer.train_epoch(epoch) for epoch in (1, 2)]
    return epochs[-1]


def bound_epoch(root: str, device: str) -> dict:
    """The training step alone over batches made before the clock starts."""
    spec = complete({"dataset": "synthetic", "model": "lenet", "mode": "single", "batch": 64,
                     "data_root": root, "device": device})
    par = plan(spec, env={})
    torch.manual_seed(0)
    meta, (train_data, test_data) = load_datasets(spec, par)
    batches = list(train_data)  # normalised, no augmentation
    model = models.build("lenet", meta["shape"][0], meta["shape"][1]).to(par.device)
    trainer = Trainer(spec, par, train_data, test_data, model, log=lambda line: None)
    for x, y in batches:  # warm-up epoch
        trainer.step(x, y)
    par.synchronize()
    start = time.perf_counter()
    for x, y in batches:
        trainer.step(x, y)
    par.synchronize()
    wall = time.perf_counter() - start
    samples = sum(len(y) for _, y in batches)
    return {"wall_s": wall, "data_wait_s": 0.0, "samples_per_s": samples / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=3, help="runs of (c) and (d); the median is reported")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as root:
        data.prepare("synthetic", root)
        results = {key: steady_epoch(settings, root, args.device) for key, (_, settings) in VARIANTS.items()
                   if key in ("a", "b")}
        # (c) and (d) are close, so machine noise matters: alternate them and keep the median.
        runs = {"c": [], "d": []}
        for _ in range(args.repeats):
            runs["c"].append(steady_epoch(VARIANTS["c"][1], root, args.device))
            runs["d"].append(bound_epoch(root, args.device))
        for key, epochs in runs.items():
            results[key] = min(epochs, key=lambda e: abs(e["wall_s"] - statistics.median(r["wall_s"] for r in epochs)))
    names = {**{k: v[0] for k, v in VARIANTS.items()}, "d": "bound: bare step, pre-made tensors"}
    print(f"lenet / synthetic (10000 samples), batch 64, steady epoch, {args.threads} threads, "
          f"device {args.device}; (c) and (d): median of {args.repeats}")
    print("| run | loader | epoch s | samples/s | data wait | vs (a) |")
    print("|---|---|---|---|---|---|")
    for key, r in results.items():
        print(f"| ({key}) | {names[key]} | {r['wall_s']:.2f} | {r['samples_per_s']:.0f} | "
              f"{r['data_wait_s'] / r['wall_s']:.1%} | {results['a']['wall_s'] / r['wall_s']:.2f}x |")
    print(f"(c) is {results['a']['wall_s'] / results['c']['wall_s']:.2f}x faster than (a) (target >= 2.5x on CPU, "
          f">= 20x on GPU); (c) / (d) = {results['c']['wall_s'] / results['d']['wall_s']:.2f} (target <= 1.15)")


if __name__ == "__main__":
    main()
