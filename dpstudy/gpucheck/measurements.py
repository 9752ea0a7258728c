"""Items 3, 4, 6 and 7 of `make gpu-check`, the measurements: the device loader, ResNet-18
throughput and MFU, the CUDA rgb_to_grayscale's bandwidth, NCCL and Gloo all-reduce on CUDA
tensors. (Item 1, the gpu-marked tests, is dpstudy.gpucheck.gputests; item 2, the study,
dpstudy.gpucheck.study; item 5, the language model, dpstudy.gpucheck.lm.)

Each `run_*` takes the output folder, writes whatever raw tables it produces under `out/raw/`,
and returns {"figures": {key: value}, "details": {key: text}, "notes": [...], "params": {...},
"data": {...}, "files": [...]} for dpstudy.gpucheck.worker to record in `out/raw/<item>.json`.
The figure keys are the registry's. Each `*_result` turns a measurement into those figures
without a GPU, so the unit tests check them on CPU-sized inputs.
"""

from __future__ import annotations

from pathlib import Path

# make gpu-check runs in the repository: the extension is built where the workflow builds it.
REPO = Path.cwd()
ONE_GPU_NCCL = (
    "one GPU: NCCL at world size 1 moves no data between devices; this is the per-call overhead, not a bandwidth"
)
ONE_GPU_GLOO = (
    "one GPU: Gloo at world size 2 runs both ranks on the one GPU, staging its tensors through host "
    "memory; its bandwidth is the host round trip, not a link between GPUs"
)


# ---- 3: the loader benchmark ------------------------------------------------------------------


def loader_result(results: dict[str, dict]) -> dict:
    """Figures from dpstudy.microbench.loader.run()'s steady epochs of (a), (c) and (d)."""
    a, c, d = results["a"], results["c"], results.get("d")
    figures = {
        "speedup": a["wall_s"] / c["wall_s"],
        "data_wait_share": c["data_wait_s"] / c["wall_s"],
        "a_samples_per_s": a["samples_per_s"],
        "c_samples_per_s": c["samples_per_s"],
    }
    details = {"speedup": f"{a['wall_s']:.2f} s / {c['wall_s']:.3f} s per epoch"}
    if d:
        figures["c_vs_bound"] = c["wall_s"] / d["wall_s"]
        # No loader beats the bare step: where (d) itself is short of the target, the host's
        # per-step cost limits the speedup, not the loader.
        details["speedup"] += f"; the bare step (d) bounds it at {a['wall_s'] / d['wall_s']:.1f}x"
    return {"figures": figures, "details": details, "data": results}


def run_loader(out: Path) -> dict:
    from dpstudy.microbench import loader

    results = loader.run("cuda", keys=("a", "c", "d"), repeats=3)
    table = "\n".join(loader.table(results))
    print(table, flush=True)
    return {
        **loader_result(results),
        "notes": [
            "lenet / synthetic (10,000 samples, 1x28x28), batch 64, steady (second) epoch; (c) and (d): "
            "the median of 3 runs",
            table,
        ],
        "params": {"model": "lenet", "dataset": "synthetic", "batch": loader.BATCH, "repeats": 3},
    }


# ---- 4: ResNet-18 throughput and MFU ----------------------------------------------------------


def resnet_result(m: dict) -> dict:
    """Figures from dpstudy.microbench.throughput.measure()."""
    figures = {key: m[key] for key in ("images_per_s", "mfu", "achieved_tflops", "flops_per_image", "loss_finite")}
    details = {"loss_finite": f"loss {m['first_loss']:.3f} (warm-up epoch) -> {m['final_loss']:.3f}"}
    if m["mfu"] is None:
        details["mfu"] = f"unknown (device not in the table: {m['device_name']})"
    else:
        details["mfu"] = f"of {m['peak_tflops']:,.0f} TFLOP/s, {m['peak_label']} dense BF16"
    epochs = f"{m['steady_epochs']} steady epoch{'s' * (m['steady_epochs'] != 1)}"
    details["images_per_s"] = (
        f"{epochs} of {m['images']:,} images in {m['steady_s']:.1f} s; data wait {100 * m['data_wait_share']:.1f} %"
    )
    notes = [
        f"{m['model']} on {m['images']:,} synthetic {m['size']}x{m['size']} RGB images, batch {m['batch']}, "
        f"{m['precision']} autocast, channels_last {m['channels_last']}, augment {m['augment']}, "
        f"{m['optimizer']}, device loader, the project's Trainer; cudnn.benchmark {m['cudnn_benchmark']} "
        "(as in a cell)"
    ]
    if m["peak_source"]:
        notes.append(f"peak: {m['peak_source']}")
    return {"figures": figures, "details": details, "notes": notes, "data": m}


def run_resnet(out: Path) -> dict:
    from dpstudy.microbench import throughput

    m = throughput.measure("cuda")
    print(f"[gpu-check] resnet18: {m['images_per_s']:,.0f} img/s, {m['achieved_tflops']:.1f} TFLOP/s", flush=True)
    return {
        **resnet_result(m),
        "params": {
            k: m[k] for k in ("model", "size", "images", "batch", "precision", "channels_last", "augment", "loader")
        },
    }


# ---- 5: rgb_to_grayscale bandwidth ------------------------------------------------------------


def cuda_extension(out_dir: Path = REPO / "results" / "ext"):
    """dpstudy.ext.ops with CUDA kernels for every visible GPU, from `out_dir`.

    Built for the architectures the workflow's build_ext plans (dpstudy.ext.arch.planned_arch,
    with the visible GPUs), so a study's build and this one are the same and reuse each other."""
    import torch

    import dpstudy.ext
    from dpstudy.ext import arch
    from dpstudy.ext.loader import check_kernels

    capabilities = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    info = dpstudy.ext.build(out_dir, cuda_arch=arch.planned_arch(None, True, capabilities), require_cuda=True)
    ops = dpstudy.ext.load(out_dir)
    check_kernels(range(len(capabilities)))
    return ops, info


def grayscale_result(r: dict, peak_source: str) -> dict:
    """Figures from dpstudy.microbench.bandwidth.grayscale()."""
    ext, check = r["extension"], r["check"]
    figures = {
        "fraction_of_peak": ext.get("fraction_of_peak"),
        "correct": check["correct"] and check["shape_ok"],
        "bandwidth_bps": ext["bandwidth_bps"],
        "median_ms": ext["median_s"] * 1e3,
        "torchvision_bps": r.get("torchvision", {}).get("bandwidth_bps"),
    }
    peak = r["peak_bps"]
    details = {
        "fraction_of_peak": f"of {peak / 1e12:.2f} TB/s, {peak_source}" if peak else f"peak unknown ({peak_source})",
        "bandwidth_bps": f"{ext['bytes'] / 2**20:,.4g} MiB moved per call, median of {ext['runs']} runs",
        "correct": (f"{check['mismatched_pixels']:,} pixels differ" if not check["correct"] else "every pixel")
        + ("" if check["poison_reused"] else "; the output did not land in the poisoned memory"),
    }
    if "torchvision" in r and peak:
        details["torchvision_bps"] = f"{100 * r['torchvision']['bandwidth_bps'] / peak:.0f} % of peak"
    shape = "x".join(map(str, r["shape"]))
    notes = [f"uint8 [{shape}] on {r['device']}: 3 bytes read + 1 written per pixel; CUDA events around each call"]
    return {"figures": figures, "details": details, "notes": notes, "data": r}


def run_grayscale(out: Path) -> dict:
    from dpstudy.microbench import bandwidth
    from dpstudy.util import peaks

    ops, info = cuda_extension()
    peak_bps, source = peaks.memory_bandwidth(0)
    r = bandwidth.grayscale(ops.rgb_to_grayscale, "cuda", peak_bps=peak_bps)
    ext = r["extension"]
    print(f"[gpu-check] rgb_to_grayscale: {ext['bandwidth_bps'] / 1e9:,.0f} GB/s", flush=True)
    result = grayscale_result(r, source)
    result["notes"].append(f"extension {info['so']}, built for {';'.join(info['cuda_arch'])}")
    return {**result, "params": {"shape": list(bandwidth.SHAPE), "peak_source": source}}


# ---- 6: all-reduce ----------------------------------------------------------------------------


def comm_plan(gpus: int) -> list[tuple[str, int]]:
    """(backend, world size) on CUDA tensors: both at 2 ranks with two GPUs or more; with one,
    NCCL at world size 1 (it cannot put two ranks on one GPU) and Gloo with both ranks on it."""
    return [("nccl", 2), ("gloo", 2)] if gpus >= 2 else [("nccl", 1), ("gloo", 2)]


def comm_result(df, gpus: int, errors: dict[str, str]) -> dict:
    """Figures from the comm.csv rows (dpstudy.microbench.comm.COLUMNS) of the CUDA combinations:
    all_reduce only (all_gather and reduce_scatter stay in raw/comm.csv)."""
    figures, details, notes = {}, {}, []
    if "collective" in df:
        df = df[df.collective.fillna("all_reduce") == "all_reduce"]
    ran = True
    for backend in ("nccl", "gloo"):
        rows = df[(df.backend == backend) & (df.device == "cuda") & df.reason.isna()] if len(df) else df
        if backend in errors or not len(rows):
            ran = False
            why = errors.get(backend) or "; ".join(sorted(set(df[df.backend == backend].reason.dropna()))) or "no rows"
            details[f"{backend}_latency_us"] = f"did not run: {why}"
            continue
        world = int(rows.world_size.iloc[0])
        largest, smallest = rows.loc[rows.bytes.idxmax()], rows.loc[rows.bytes.idxmin()]
        figures[f"{backend}_latency_us"] = float(smallest.median_s) * 1e6
        details[f"{backend}_latency_us"] = f"{smallest['size']}, world size {world}"
        if world > 1:
            figures[f"{backend}_busbw_gbps"] = float(largest.busbw_gbps)
            details[f"{backend}_busbw_gbps"] = f"{largest['size']}, world size {world}"
        else:
            details[f"{backend}_busbw_gbps"] = "none at world size 1 (no data crosses devices)"
    figures["ran"] = ran
    if gpus < 2:
        notes += [ONE_GPU_NCCL, ONE_GPU_GLOO]
    return {"figures": figures, "details": details, "notes": notes}


def run_comm(out: Path) -> dict:
    import pandas as pd
    import torch

    from dpstudy.microbench import comm
    from dpstudy.util.atomic import write_csv

    gpus = torch.cuda.device_count()
    frames, errors = [], {}
    for backend, world in comm_plan(gpus):
        try:
            frames.append(comm.run(world_size=world, combos=[(backend, "cuda")]))
        except Exception as error:  # one backend failing must not hide the other's figures
            errors[backend] = (
                f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
            )
            print(f"[gpu-check] {backend} all-reduce failed: {error}", flush=True)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=comm.COLUMNS)
    csv = out / "raw" / "comm.csv"
    write_csv(df, csv)
    print(df.drop(columns=["dtype"]).to_string(index=False), flush=True)
    result = comm_result(df, gpus, errors)
    return {
        **result,
        "params": {"plan": comm_plan(gpus), "sizes": [int(n) for n in comm.SIZES]},
        "data": {"errors": errors},
        "files": [str(csv.relative_to(out))],
    }
