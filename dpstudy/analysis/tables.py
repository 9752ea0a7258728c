"""Records -> the tidy tables of records (docs/design.md, Tables): cells, epochs, ranks and util.

Every record becomes a row of cells.csv whatever its status: skipped, oom and failed cells keep
their reason there and are never dropped. A cell is stale when made with other training code than
the current (`is_stale`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import pandas as pd

from dpstudy.analysis.baseline import with_speedup
from dpstudy.analysis.keys import NULL_MEANS, NUMERIC_SPEC_DTYPES, SPEC_DEFAULTS, SPEC_KEYS, column_value
from dpstudy.analysis.traces import TRACE_COLUMNS, trace_columns
from dpstudy.analysis.utilisation import COST_COLUMNS, cores_used, cost_columns
from dpstudy.record.fields import (
    EPOCH_FIELDS,
    IN_CELL_RATES,
    OPTIONAL_SUMMARY_FIELDS,
    PROBE_FIELDS,
    SUMMARY_FIELDS,
)
from dpstudy.study.spec import devices as spec_devices

# (model, code_path) -> the current hash of a user factory's source, or None
FactoryHash = Callable[[str, "str | None"], "str | None"]
# env key -> cells.csv column; the resolved device is `env_device` because `device` is the
# spec's request (auto | cuda | cpu).
ENV_COLUMNS = {
    "world_size": "world_size",
    "device": "env_device",
    "torch": "torch",
    "torch_provider": "torch_provider",
    "torch_path": "torch_path",
    "cuda": "cuda",
    "cudnn": "cudnn",
    "nccl": "nccl",
    "python": "python",
    "hostname": "hostname",
    "cpu": "cpu",
    "driver": "driver",
    "threads_per_process": "threads_per_process",
}
# record.probe (dpstudy.record.fields.PROBE_FIELDS): the parts of a step the step model needs
# become columns; how the probe ran (its steps, the graphs it compiled) does not.
PROBE_COLUMNS = tuple(k for k in PROBE_FIELDS if k not in ("steps", "rounds", "graphs_compiled"))
# record.env.job: how the cell ran; under packing (profiles/slurm) the pack it shared a SLURM job
# with and the wall time the packing estimated for it (set beside summary.total_s, what it took).
JOB_COLUMNS = ("scheduler", "job_id", "pack", "estimated_s")

CELL_COLUMNS = (
    "cell",
    *SPEC_KEYS,
    "status",
    "reason",
    *SUMMARY_FIELDS,
    *OPTIONAL_SUMMARY_FIELDS,
    "devices",
    "world_size",
    "env_device",
    "global_batch",
    "epochs_done",
    "epochs_s",
    "overhead_s",
    "peak_mem_mb_max",
    "peak_mem_mb_min",
    "other_load",
    *IN_CELL_RATES,
    *COST_COLUMNS,
    "cores",
    "final_test_loss",
    "baseline",
    "speedup",
    "efficiency",
    "stale",
    "record",
    "torch",
    "torch_provider",
    "torch_path",
    "cuda",
    "cudnn",
    "nccl",
    "python",
    "hostname",
    "cpu",
    "gpu_names",
    "driver",
    "threads_per_process",
    "git_commit",
    "source_hash",
    *JOB_COLUMNS,
    "rank_nodes",
    "allocator",
    *TRACE_COLUMNS,
    *PROBE_COLUMNS,
)
EPOCH_COLUMNS = (
    "cell",
    *SPEC_KEYS,
    "status",
    "devices",
    "world_size",
    "env_device",
    "global_batch",
    "warmup",
    *(f for f in EPOCH_FIELDS if f != "peak_mem_mb"),
    "peak_mem_mb_max",
    "compile_s",  # compile: true: the epoch's training steps that compiled (inside wall_s and compute_s)
)
RANK_COLUMNS = ("cell", "epoch", "rank", "peak_mem_mb")
UTIL_COLUMNS = ("cell", "device", "t", "gpu_util", "mem_util", "mem_mb")


def global_batch(spec: dict[str, Any]) -> int | None:
    if spec.get("batch") is None or spec.get("gpus") is None:
        return None
    return spec["batch"] if spec.get("batch_scope", "global") == "global" else spec["batch"] * spec_devices(spec)


def cell_settings(rec: dict[str, Any]) -> dict[str, Any]:
    """The columns every table repeats: id, every spec key, status and where it ran."""
    spec, env = {**SPEC_DEFAULTS, **rec["spec"]}, rec["env"]
    spec |= {k: v for k, v in NULL_MEANS.items() if spec.get(k) is None}
    return {
        "cell": rec["cell"],
        **{k: column_value(spec.get(k)) for k in SPEC_KEYS},
        "status": rec["status"],
        "devices": spec_devices(spec),
        "world_size": env.get("world_size"),
        "env_device": env.get("device"),
        "global_batch": global_batch(spec),
    }


def rank_nodes(env: dict[str, Any]) -> str | None:
    """The distinct nodes the ranks ran on, in rank order."""
    nodes = [r.get("node") or r.get("hostname") for r in env.get("ranks") or []]
    return "; ".join(dict.fromkeys(filter(None, nodes))) or None


def rank_allocators(env: dict[str, Any]) -> str | None:
    """The memory allocators the ranks ran with (dpstudy.util.allocator), distinct, in rank order:
    "jemalloc (/usr/lib/x86_64-linux-gnu/libjemalloc.so.2)", "glibc" (told to keep its memory),
    "system"; None for records made before ranks recorded theirs."""
    found = [r["allocator"] for r in env.get("ranks") or [] if r.get("allocator")]
    names = [f"{a['name']} ({a['library']})" if a.get("library") else a["name"] for a in found]
    return "; ".join(dict.fromkeys(names)) or None


def other_load(epochs: list[dict[str, Any]]) -> float | None:
    """Cores the rest of the machine used while the cell trained, mean over its epochs (records
    made before dpstudy.engine.monitor.HostLoad have none)."""
    loads = [e["other_load"] for e in epochs if e.get("other_load") is not None]
    return sum(loads) / len(loads) if loads else None


def machine_rates(epochs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The machine's speed while the cell ran: the median over its epochs of each in-cell gauge rate
    (dpstudy.engine.reference.InCell; None in records made before it)."""
    out = {}
    for rate in IN_CELL_RATES:
        values = [e[rate] for e in epochs if e.get(rate) is not None]
        out[rate] = statistics.median(values) if values else None
    return out


def is_stale(
    code: dict[str, Any], spec: dict[str, Any], current_hash: str | None, factory_hash: FactoryHash | None
) -> bool:
    """Made with other training code than the current, or with another version of its factory
    (`factory_hash(model, code_path)`: the current hash of a user factory's source, or None)."""
    if code.get("source_hash") != current_hash:
        return True
    made_with = code.get("user_hash")
    if made_with is None or factory_hash is None:
        return False
    return made_with != factory_hash(spec["model"], spec.get("code_path"))


def cell_row(
    path: str, rec: dict[str, Any], current_hash: str | None, factory_hash: FactoryHash | None = None
) -> dict[str, Any]:
    epochs, summary, env = rec["epochs"], rec["summary"], rec["env"]
    code = env.get("code_version") or {}
    epochs_s = sum(e["wall_s"] + e["eval_s"] for e in epochs) if epochs else None
    total_s = summary.get("total_s")
    last_peaks = epochs[-1]["peak_mem_mb"] if epochs else []
    return {
        **cell_settings(rec),
        "reason": rec["reason"],
        **{k: summary.get(k) for k in (*SUMMARY_FIELDS, *OPTIONAL_SUMMARY_FIELDS)},
        "epochs_done": len(epochs),
        "epochs_s": epochs_s,
        "overhead_s": total_s - epochs_s if total_s is not None and epochs_s is not None else None,
        "peak_mem_mb_max": max(last_peaks, default=None),
        "peak_mem_mb_min": min(last_peaks, default=None),
        "other_load": other_load(epochs),
        **machine_rates(epochs),
        **cost_columns(rec),
        "cores": cores_used(env),
        "final_test_loss": epochs[-1]["test_loss"] if epochs else None,
        "stale": is_stale(code, rec["spec"], current_hash, factory_hash),
        "record": path,
        **{col: env.get(key) for key, col in ENV_COLUMNS.items()},
        "gpu_names": "; ".join(env.get("gpus") or []) or None,
        "git_commit": code.get("git_commit"),
        "source_hash": code.get("source_hash"),
        **{k: (env.get("job") or {}).get(k) for k in JOB_COLUMNS},
        "rank_nodes": rank_nodes(env),
        "allocator": rank_allocators(env),
        **trace_columns(path, rec),
        **{k: (rec.get("probe") or {}).get(k) for k in PROBE_COLUMNS},
    }


def cells_table(
    records: list[tuple[str, dict]], current_hash: str | None, factory_hash: FactoryHash | None = None
) -> pd.DataFrame:
    rows = [cell_row(path, rec, current_hash, factory_hash) for path, rec in records]
    cells = pd.DataFrame(rows, columns=[c for c in CELL_COLUMNS if c not in ("baseline", "speedup", "efficiency")])
    cells = cells.astype(
        {
            **NUMERIC_SPEC_DTYPES,
            "samples_per_s": float,
            "final_test_loss": float,
            "flops_per_sample": float,
            "hardware_flops_per_sample": float,
            "tokens_per_sample": "Int64",
            "cores": "Int64",
            "other_load": float,
            "estimated_s": float,
            **dict.fromkeys(IN_CELL_RATES, float),
            "gpus": "Int64",
            "nodes": "Int64",
            "devices": "Int64",
            "repeat": "Int64",
            **{k: float for k in PROBE_COLUMNS},
            **{k: float for k in TRACE_COLUMNS if k not in ("trace_files", "trace_reason")},
        }
    )
    return with_speedup(cells)[list(CELL_COLUMNS)].sort_values("cell", ignore_index=True)


def epochs_table(records: list[tuple[str, dict]]) -> pd.DataFrame:
    rows = []
    for _, rec in records:
        settings, epochs = cell_settings(rec), rec["epochs"]
        for e in epochs:
            fields = {k: v for k, v in e.items() if k in EPOCH_FIELDS and k != "peak_mem_mb"}
            rows.append(
                {
                    **settings,
                    "warmup": e["epoch"] == 1 and len(epochs) > 1,
                    **fields,
                    "peak_mem_mb_max": max(e["peak_mem_mb"], default=None),
                    "compile_s": e.get("compile_s"),
                }
            )
    table = pd.DataFrame(rows, columns=list(EPOCH_COLUMNS)).astype(NUMERIC_SPEC_DTYPES)
    return table.sort_values(["cell", "epoch"], ignore_index=True)


def ranks_table(records: list[tuple[str, dict]]) -> pd.DataFrame:
    rows = [
        {"cell": rec["cell"], "epoch": e["epoch"], "rank": rank, "peak_mem_mb": mb}
        for _, rec in records
        for e in rec["epochs"]
        for rank, mb in enumerate(e["peak_mem_mb"])
    ]
    return pd.DataFrame(rows, columns=list(RANK_COLUMNS)).sort_values(["cell", "epoch", "rank"], ignore_index=True)


def util_table(records: list[tuple[str, dict]]) -> pd.DataFrame:
    rows = [
        {"cell": rec["cell"], "device": int(device), **{k: s.get(k) for k in UTIL_COLUMNS[2:]}}
        for _, rec in records
        for device, samples in (rec.get("util") or {}).items()
        for s in samples
    ]
    return pd.DataFrame(rows, columns=list(UTIL_COLUMNS)).sort_values(["cell", "device", "t"], ignore_index=True)
