"""Where a CPU cell's run-to-run noise comes from, and what each remedy buys.

    .venv/bin/python benchmarks/noise_floor.py [--rounds 6] [--batch 64] [--variants base,gcoff,interop1]

Trains the default study's single-device cell (synthetic/LeNet, 8,000 samples, 3 epochs; the
quickstart's settings) `rounds` times per variant, as the workflow's train job runs it (through
`python -m dpstudy.jobs.launch`, with the study's allocator, `auto`, and the one core a single-device
CPU cell gets),
the variants interleaved round by round so that a drift of the machine touches each alike, and
prints per variant the mean throughput and its coefficient of variation over the runs, twice: over
the steady window (every step after `warmup_steps`, what dpstudy reports) and over the epochs
after the first (what it reported before issue 14); and the most CPU other processes used meanwhile
(`other_load`, dpstudy.engine.monitor.HostLoad), so that a run measured on a busy machine is seen
as such. Each round also times the machine's floor (dpstudy.microbench.floor, 3 s), the noise
below which no variant can go here.

Variants (each a change against `base`, the cell as a study runs it):
- `base`; `system` (the process as the system starts it: glibc's malloc untouched), `unpinned`
  (DPSTUDY_PIN_CORES=0), `hashseed` (PYTHONHASHSEED=0), `noaslr` (hash seed fixed and
  address-space randomisation off: `setarch -R`);
- `gcoff`: Python's garbage collector off in every process (a sitecustomize on PYTHONPATH);
- `interop1`: torch's inter-op pool at one thread (the same way);
- `passive`: OpenMP's threads wait asleep instead of spinning (OMP_WAIT_POLICY=PASSIVE);
- `allcores`: every core of the machine for the cell instead of the one a study gives it;
- `thp`: PyTorch's CPU allocations of 2 MB and more on transparent huge pages (THP_MEM_ALLOC_ENABLE=1;
  the kernel's THP mode `madvise` leaves them on 4 KiB pages otherwise);
- `epochs6`: twice the steady window (6 epochs).
Run it on an otherwise idle machine; its own numbers say when it was not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpstudy.data import store as data  # noqa: E402
from dpstudy.engine.cores import PIN_ENV  # noqa: E402
from dpstudy.study import spec as specs  # noqa: E402

CORES = len(os.sched_getaffinity(0))
# name: (environment, command prefix, sitecustomize source, launcher options, spec changes)
VARIANTS = {
    "base": ({}, [], "", [], {}),
    "system": ({}, [], "", ["--allocator", "system"], {}),
    "unpinned": ({PIN_ENV: "0"}, [], "", [], {}),
    "hashseed": ({"PYTHONHASHSEED": "0"}, [], "", [], {}),
    "noaslr": ({"PYTHONHASHSEED": "0"}, ["setarch", "-R"], "", [], {}),
    "gcoff": ({}, [], "import gc\ngc.disable()\n", [], {}),
    "interop1": ({}, [], "import torch\ntorch.set_num_interop_threads(1)\n", [], {}),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, [], "", [], {}),
    "allcores": ({}, [], "", ["--cores", str(CORES)], {}),
    "thp": ({"THP_MEM_ALLOC_ENABLE": "1"}, [], "", [], {}),
    "epochs6": ({}, [], "", [], {"epochs": 6}),
}


def spec(data_root: Path, batch: int, repeat: int) -> dict:
    return specs.complete(
        {
            "dataset": "synthetic",
            "model": "lenet",
            "mode": "single",
            "batch": batch,
            "epochs": 3,
            "optimizer": "adam",
            "lr": 0.003,
            "loader": "device",
            "device": "cpu",
            "repeat": repeat,
            "data_root": str(data_root),
        }
    )


def run(variant: str, cell_spec: dict, out: Path) -> dict:
    env, prefix, site, options, changes = VARIANTS[variant]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **env}
    if site:
        folder = out.parent / f"site-{variant}"
        folder.mkdir(exist_ok=True)
        (folder / "sitecustomize.py").write_text(site)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    options = {**dict(zip(options[::2], options[1::2]))}
    cmd = [*prefix, sys.executable, "-m", "dpstudy.jobs.launch", "--spec", json.dumps({**cell_spec, **changes})]
    cmd += ["--cell", f"noise-{variant}", "--out", str(out), "--log", str(out.parent / f"{out.name}.log")]
    cmd += ["--gpus", "0", "--cores", options.get("--cores", "1")]
    cmd += ["--allocator", options.get("--allocator", "auto")]
    subprocess.run(cmd, check=True, capture_output=True, cwd=REPO, env=env)
    rec = json.loads((out / "record.json").read_text())
    later = rec["epochs"][1:]
    return {
        "steady": rec["summary"]["samples_per_s"],
        "epochs_after_first": sum(e["samples"] for e in later) / sum(e["wall_s"] for e in later),
        "other_load": max(e.get("other_load", float("nan")) for e in rec["epochs"]),
    }


def floor_run(repeat: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "dpstudy.microbench.floor", "--repeat", str(repeat), "--device", "cpu", "--cores", "1"]
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True, cwd=REPO)
    return json.loads(out.read_text())


def cv(values: list[float]) -> str:
    return f"{statistics.stdev(values) / statistics.mean(values):.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--variants", default="base,gcoff,interop1")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory(prefix="dpstudy-noise-") as tmp:
        root = Path(tmp)
        data.prepare("synthetic", root / "data", {"train_size": 8000, "test_size": 2000})
        results: dict[str, list[dict]] = {v: [] for v in variants}
        floors: list[dict] = []
        for i in range(args.rounds):
            floors.append(floor_run(i, root / f"floor-{i}.json"))
            print(
                f"round {i}     floor: {floors[-1]['compute_gflops']:.2f} GFLOP/s, {floors[-1]['memory_gbps']:.2f} GB/s"
            )
            for v in variants:
                results[v].append(run(v, spec(root / "data", args.batch, i), root / f"{v}-{i}"))
                r = results[v][-1]
                print(
                    f"round {i} {v:>9}: {r['steady']:8.0f} samples/s (epochs >= 2: {r['epochs_after_first']:8.0f}),"
                    f" other processes {r['other_load']:.2f} cores",
                    flush=True,
                )
    compute, memory, dispatch = ([f[key] for f in floors] for key in ("compute_gflops", "memory_gbps", "dispatch_mops"))
    print(
        f"\nthe machine's floor: matmuls CV {cv(compute)}, copies CV {cv(memory)}, dispatch CV {cv(dispatch)}"
        f" over {len(floors)} runs"
    )
    print(f"\n{'variant':>9} {'mean':>8} {'CV steady':>10} {'CV epochs>=2':>13} {'max other load':>15}")
    for v, runs in results.items():
        steady, old = [r["steady"] for r in runs], [r["epochs_after_first"] for r in runs]
        print(
            f"{v:>9} {statistics.mean(steady):8.0f} {cv(steady):>10} {cv(old):>13} "
            f"{max(r['other_load'] for r in runs):>15.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
