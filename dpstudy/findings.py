"""The report's sentences: answers to the study's questions, computed from the tables.

Every function takes tables of dpstudy.collect and returns markdown. A question the data cannot
answer gets an explicit "Not measured in this study: <why>" instead of silence.
"""
from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from dpstudy.collect import BASELINE_KEYS, SPEC_KEYS

# A setting: a cell up to its repeat index; repeats of a setting are averaged.
SETTING_KEYS = [k for k in SPEC_KEYS if k not in ("repeat", "data_root")] + ["devices", "env_device", "global_batch"]
RERUN = "snakemake --cores 1 --resources gpu=2 --forcerun $(cat {stale})"


def percent(fraction: float) -> str:
    return f"{fraction * 100:.0f} %"


def not_measured(why: str) -> str:
    return f"*Not measured in this study:* {why}."


def setup_name(mode: str, backend: str, gpus: int, nodes: int = 1) -> str:
    if mode == "single":
        return "one device"
    where = f"{gpus} devices" if nodes == 1 else f"{nodes} nodes x {gpus} devices"
    return f"{'DP' if mode == 'dp' else f'DDP ({backend})'} on {where}"


def batch_phrase(row) -> str:
    return f"batch {row.batch}" + (" per device" if row.batch_scope == "per_device" and row.devices > 1 else "")


def workload(row) -> str:
    return f"{row.dataset}/{row.model}"


def values(column: pd.Series, empty: str = "unknown", sep: str = ", ") -> str:
    return sep.join(str(v) for v in sorted(column.dropna().unique(), key=str)) or empty


def why_not_run(cells: pd.DataFrame, what: str = "") -> str:
    """Why `cells` (the `what` cells a question needs) gave no data."""
    kind = f"{what} cell" if what else "cell"
    if cells.empty:
        return f"the study has no {kind}s"
    reasons = values(cells["reason"], sep="; ") if cells["reason"].notna().any() else values(cells["status"])
    return f"no {kind} finished ({reasons})"


def markdown_table(table: pd.DataFrame) -> str:
    def cell(v) -> str:
        return "" if pd.isna(v) else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def finished(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["status"] == "ok"]


def settings(cells: pd.DataFrame, metrics: Iterable[str]) -> pd.DataFrame:
    """Finished cells averaged over repeats: one row per setting, `repeats` counts them."""
    ok = finished(cells)
    grouped = ok.groupby(SETTING_KEYS, dropna=False, sort=True)
    return grouped[list(metrics)].mean().join(grouped.size().rename("repeats")).reset_index()


def steady_epochs(epochs: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Epochs of finished cells after the warm-up epoch."""
    return epochs[~epochs["warmup"].astype(bool) & epochs["cell"].isin(finished(cells)["cell"])]


def gpu_summary(gpu_names: pd.Series) -> str:
    """'2 x NVIDIA H100' from the longest list of visible GPUs ('; '-joined in cells.csv)."""
    lists = [names.split("; ") for names in gpu_names.dropna()]
    if not lists:
        return "none"
    counts = pd.Series(max(lists, key=len)).value_counts(sort=False)
    return ", ".join(f"{n} x {name}" for name, n in counts.items())


def environment(cells: pd.DataFrame, study: str) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in cells["status"].value_counts().items())
    return "\n".join([
        f"- **Study** `{study}`: {len(cells)} cells ({counts})",
        f"- **PyTorch** {values(cells['torch'])}, CUDA {values(cells['cuda'], 'none')}, "
        f"Python {values(cells['python'])}",
        f"- **Host** {values(cells['hostname'])}; CPU: {values(cells['cpu'])}; "
        f"GPUs: {gpu_summary(cells['gpu_names'])}",
        f"- **Ran on** {values(cells['env_device'])}; world sizes {values(cells['world_size'])}; "
        f"threads per process {values(cells['threads_per_process'])}",
        f"- **Training code** git {values(cells['git_commit'])}, source hash {values(cells['source_hash'])}",
        f"- **Jobs** {jobs(cells)}",
    ])


def jobs(cells: pd.DataFrame) -> str:
    """How the cells' jobs ran: locally, or as scheduler jobs on which nodes."""
    if "scheduler" not in cells or cells["scheduler"].dropna().empty:
        return "unknown (records without job facts)"
    parts = []
    for scheduler, group in cells.groupby(cells["scheduler"].fillna("unknown")):
        count = f"{len(group)} cell{'s' if len(group) != 1 else ''}"
        if scheduler == "slurm":
            nodes = values(group["rank_nodes"].dropna().astype(str).str.split("; ").explode(), "unknown")
            parts.append(f"{count} as SLURM jobs (ids {values(group['job_id'].astype('string'))}) on nodes {nodes}")
        else:
            parts.append(f"{count} {scheduler}")
    return "; ".join(parts)


def speedup(cells: pd.DataFrame, epochs: pd.DataFrame) -> str:
    """Speedup and efficiency of every multi-device setting, then what kept it from ideal."""
    multi = cells[cells["devices"] > 1]
    rows = settings(multi, ["samples_per_s", "speedup", "efficiency"]).dropna(subset=["speedup"])
    if rows.empty:
        why = why_not_run(multi, "multi-device")
        if not finished(multi).empty:
            why = "no finished multi-device cell has a matching single-device cell that finished"
        return not_measured(why)
    lines = []
    for r in rows.itertuples():
        who = setup_name(r.mode, r.backend, r.gpus, r.nodes)
        verdict = (f"{r.speedup:.2f}x faster than one device at {batch_phrase(r)}" if r.speedup >= 1 else
                   f"slower than one device at {batch_phrase(r)}: {r.speedup:.2f}x its throughput")
        repeats = f" (mean of {r.repeats} repeats)" if r.repeats > 1 else ""
        # more than ideal usually means the baseline ran slow (threads, load), not magic scaling
        suspect = " Above ideal: check threads per process and machine load of both runs." if r.efficiency > 1.05 else ""
        lines.append(f"- {workload(r)}: {who} was {verdict}, {percent(r.efficiency)} efficiency{repeats}."
                     + suspect)
    faster = int((rows["speedup"] > 1).sum())
    lines.append(f"\n{faster} of {len(rows)} multi-device settings beat one device "
                 "(ideal: n devices n times faster, 100 % efficiency).")
    return "\n".join(lines) + "\n\n" + across_nodes(rows) + why_not_ideal(cells, epochs)


def across_nodes(rows: pd.DataFrame) -> str:
    """Intra- vs inter-node scaling: DDP at equal world size on one node and on several."""
    keys = [k for k in SETTING_KEYS if k not in ("gpus", "nodes")]
    ddp = rows[rows["mode"] == "ddp"]
    pairs = []
    for _, group in ddp.groupby(keys, dropna=False):
        one, several = group[group["nodes"] == 1], group[group["nodes"] > 1]
        for _, far in several.iterrows():
            for _, near in one.iterrows():
                pairs.append(f"- {workload(far)} at {batch_phrase(far)}: {far.devices} devices on one node reached "
                             f"{near.efficiency * 100:.0f} % efficiency, spread over {far.nodes} nodes "
                             f"{far.efficiency * 100:.0f} % ({far.samples_per_s / near.samples_per_s:.2f}x the "
                             "one-node throughput).")
    if pairs:
        return "Intra- vs inter-node scaling (same world size):\n" + "\n".join(pairs) + "\n\n"
    if (ddp["nodes"] > 1).any():
        return ("Inter-node scaling: the multi-node cells have no one-node cell of the same world size to "
                "compare with.\n\n")
    return ""


def wait_share(epochs: pd.DataFrame) -> float:
    return epochs["data_wait_s"].sum() / epochs["wall_s"].sum()


def why_not_ideal(cells: pd.DataFrame, epochs: pd.DataFrame) -> str:
    """Measured reasons: waiting for data, and the fixed cost outside the epochs."""
    steady = steady_epochs(epochs, cells)
    multi, single = steady[steady["devices"] > 1], steady[steady["devices"] == 1]
    ok = finished(cells)
    parts = []
    if not multi.empty and not single.empty:
        parts.append(f"Waiting for data took {percent(wait_share(multi))} of the training time on several "
                     f"devices vs {percent(wait_share(single))} on one device.")
    overhead = ok.groupby(ok["devices"] > 1)["overhead_s"].mean()
    if len(overhead) == 2:
        parts.append(f"The fixed cost outside the epochs (startup, data loading, teardown) was "
                     f"{overhead[True]:.1f} s per multi-device cell vs {overhead[False]:.1f} s on one device; "
                     "it counts in total time, not in the throughput above.")
    parts.append("Gradient communication (DDP) and DP's scatter, replicate and gather through device 0 "
                 "are part of the compute time; the backend and memory sections below show their cost.")
    return " ".join(parts)


def accuracy(cells: pd.DataFrame) -> str:
    """Largest accuracy gap between modes at otherwise equal settings (the baseline's keys)."""
    ok = finished(cells).dropna(subset=["final_test_acc"])
    per_setup = ok.groupby([*BASELINE_KEYS, "mode", "backend", "gpus", "nodes"], dropna=False)["final_test_acc"].mean()
    gaps = []
    for key, group in per_setup.groupby(level=list(range(len(BASELINE_KEYS))), dropna=False):
        if len(group) > 1:
            hi, lo = group.idxmax(), group.idxmin()
            gaps.append((group.max() - group.min(), hi, lo, group[hi], group[lo]))
    note = ("Test accuracy is computed once over the whole test set, counts all-reduced across ranks "
            "(not per rank).")
    if not gaps:
        return not_measured("no setting finished in more than one mode") + " " + note
    gap, hi, lo, acc_hi, acc_lo = max(gaps, key=lambda g: g[0])
    keys = dict(zip([*BASELINE_KEYS, "mode", "backend", "gpus", "nodes"], hi))
    text = (f"Final test accuracy differed by at most {gap * 100:.1f} points across modes at equal settings "
            f"(largest gap: {keys['dataset']}/{keys['model']} at batch {keys['batch']}: "
            f"{setup_name(*hi[-4:])} {acc_hi * 100:.1f} % vs {setup_name(*lo[-4:])} {acc_lo * 100:.1f} %). {note}")
    spread = ok.groupby(SETTING_KEYS, dropna=False)["final_test_acc"].agg(lambda a: a.max() - a.min())
    if ok.duplicated(SETTING_KEYS).any():
        text += f" Repeats of the same cell varied by up to {spread.max() * 100:.1f} points."
    return text


def loader_name(loader: str, workers: int, augment: str | None = None) -> str:
    name = "loader device" if loader == "device" else f"loader torch/{workers} workers"
    return name + (f", augment {augment}" if augment else "")


def data_wait(epochs: pd.DataFrame, cells: pd.DataFrame) -> str:
    """Share of the training time spent waiting for data, by loader (and by mode)."""
    steady = steady_epochs(epochs, cells)
    if steady.empty:
        return not_measured(why_not_run(cells))
    keys = ["loader", "workers"] + (["augment"] if steady["augment"].nunique() > 1 else [])
    shares = steady.groupby(keys).apply(wait_share).sort_values(ascending=False)
    named = [f"{percent(v)} with {loader_name(*(k if isinstance(k, tuple) else (k,)))}" for k, v in shares.items()]
    text = f"Waiting for data took {named[0].replace(' with ', ' of the training time with ', 1)}"
    text += " (the only loader in this study)." if len(named) == 1 else f" vs {', '.join(named[1:])}."
    by_mode = steady.groupby(["mode", "backend", "gpus", "nodes"]).apply(wait_share)
    text += " By mode: " + ", ".join(f"{setup_name(*k)} {percent(v)}" for k, v in by_mode.items()) + "."
    return text


def backends(cells: pd.DataFrame, comm: pd.DataFrame | None = None) -> str:
    """NCCL vs Gloo at otherwise equal settings."""
    ddp = cells[cells["mode"] == "ddp"]
    keys = [k for k in SETTING_KEYS if k != "backend"]
    rows = settings(ddp, ["samples_per_s"]).pivot_table(index=keys, columns="backend", values="samples_per_s")
    pairs = rows.dropna(subset=["nccl", "gloo"]) if {"nccl", "gloo"} <= set(rows.columns) else rows.iloc[:0]
    if pairs.empty:
        missing = [b for b in ("nccl", "gloo") if finished(ddp[ddp["backend"] == b]).empty]
        why = "; ".join(why_not_run(ddp[ddp["backend"] == b], f"{b.upper()}") for b in missing)
        text = not_measured(f"NCCL vs Gloo needs both at equal settings: {why or 'no equal settings ran'}")
    else:
        lines = []
        for index, r in pairs.iterrows():
            k = pd.Series(index, index=keys)
            lines.append(f"- {k.dataset}/{k.model} on {k.devices} devices at {batch_phrase(k)}: NCCL reached "
                         f"{r.nccl / r.gloo:.2f}x the throughput of Gloo ({r.nccl:.0f} vs {r.gloo:.0f} samples/s).")
        text = "\n".join(lines)
    if comm is None or comm.empty:
        return text + "\n\n" + not_measured("the all-reduce bandwidth (no comm benchmark results, comm.csv)")
    return text + "\n\nThe all-reduce microbenchmark below measures the bandwidth behind the gap."


def memory(cells: pd.DataFrame) -> str:
    """Peak memory per rank: the spread between the fullest and the emptiest device, per mode."""
    multi = cells[cells["devices"] > 1]
    ok = finished(multi).dropna(subset=["peak_mem_mb_max", "peak_mem_mb_min"])
    lines = []
    for mode in ("dp", "ddp"):
        rows = ok[ok["mode"] == mode]
        if rows.empty:
            why = why_not_run(multi[multi["mode"] == mode], mode.upper())
            lines.append(f"- {mode.upper()}: {not_measured(why)}")
            continue
        ratio = rows["peak_mem_mb_max"] / rows["peak_mem_mb_min"]
        r = rows.loc[ratio.idxmax()]
        lines.append(f"- {setup_name(r['mode'], r['backend'], r['gpus'], r['nodes'])}: the fullest device peaked at "
                     f"{ratio.max():.2f}x the memory of the emptiest ({r['peak_mem_mb_max']:.0f} MB vs "
                     f"{r['peak_mem_mb_min']:.0f} MB, {workload(r)} at {batch_phrase(r)}).")
    return ("\n".join(lines) + "\n\nMemory is CUDA's peak allocation per device on GPUs and each process's "
            "peak resident set on CPU (last epoch).")


def utilisation(util: pd.DataFrame, cells: pd.DataFrame) -> str:
    if util.empty:
        return not_measured(f"GPU utilisation was not sampled (the cells ran on {values(cells['env_device'])})")
    means = util.groupby(["cell", "device"])["gpu_util"].mean()
    lines = [f"- {cell}: " + ", ".join(f"GPU {d} {v:.0f} %" for (_, d), v in per.items()) + " busy on average."
             for cell, per in means.groupby(level=0)]
    return "\n".join(lines)


def kernels(table: pd.DataFrame | None) -> str:
    if table is None or table.empty:
        return not_measured("custom kernels vs a Python loop vs PyTorch's ops "
                            "(no kernel benchmark results, kernels.csv)")
    return "The kernel microbenchmark's results are below."


def not_run(cells: pd.DataFrame) -> str:
    rest = cells[cells["status"] != "ok"]
    if rest.empty:
        return "Every cell finished."
    return markdown_table(rest[["cell", "status", "reason"]])


def stale(cells: pd.DataFrame, stale_file: str) -> str:
    old = cells[cells["stale"].astype(bool)]
    if old.empty:
        return "Every cell was made with the current training code."
    names = ", ".join(f"`{c}`" for c in old["cell"])
    count = "1 cell was" if len(old) == 1 else f"{len(old)} cells were"
    return (f"**{count} made with older training code (stale):** {names}. Rerun with\n\n"
            f"```\n{RERUN.format(stale=stale_file)}\n```")


def cell_listing(cells: pd.DataFrame) -> str:
    formats = {"samples_per_s": "{:.0f}", "speedup": "{:.2f}", "efficiency": "{:.0%}", "final_test_acc": "{:.1%}",
               "median_epoch_s": "{:.2f}", "total_s": "{:.1f}"}
    table = cells[["cell", "status", *formats, "stale", "reason"]].copy()
    for column, form in formats.items():
        table[column] = table[column].map(lambda v, form=form: "" if pd.isna(v) else form.format(v))
    return markdown_table(table)
