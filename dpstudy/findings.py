"""The report's answers to the study's questions (../shared/sources/SUMMARY.md), from the tables.

Every function takes the tables of dpstudy.collect ({"cells", "epochs", "util", "settings",
"scaling"}) and returns markdown. Repeats of a cell are summarised as medians with 95 % intervals
(dpstudy.stats): a difference is claimed only when it is larger than its interval, and called
"within noise" otherwise; a single run gets its number and no claim. A question the data cannot
answer gets "Not measured in this study: <why>" instead of silence.
"""
from __future__ import annotations

import pandas as pd

from dpstudy import stats
from dpstudy.collect import BASELINE_KEYS, SETTING_KEYS
from dpstudy.readable import markdown_table, plural, significant

Tables = dict[str, pd.DataFrame]


def percent(fraction: float) -> str:
    return f"{fraction * 100:.0f} %"


def not_measured(why: str) -> str:
    return f"*Not measured in this study:* {why}."


def setup_name(mode: str, backend: str, gpus: int, nodes: int = 1) -> str:
    if mode == "single":
        return "one device"
    where = plural(gpus, "device") if nodes == 1 else f"{nodes} nodes x {plural(gpus, 'device')}"
    return f"{'DP' if mode == 'dp' else f'DDP ({backend})'} on {where}"


# Rows are pandas Series (iterrows, .loc) or dicts: read them by key (Series.mode is a method).
def who(row) -> str:
    return setup_name(row["mode"], row["backend"], row["gpus"], row["nodes"])


def batch_phrase(row) -> str:
    per_device = row["batch_scope"] == "per_device" and row["devices"] > 1
    return f"batch {row['batch']}" + (" per device" if per_device else "")


def workload(row) -> str:
    return f"{row['dataset']}/{row['model']}"


def why_not_run(cells: pd.DataFrame, what: str = "") -> str:
    """Why `cells` (the `what` cells a question needs) gave no data."""
    kind = f"{what} cell" if what else "cell"
    if cells.empty:
        return f"the study has no {kind}s"
    reasons = cells["reason"].dropna().unique() if cells["reason"].notna().any() else cells["status"].unique()
    return f"no {kind} finished ({'; '.join(sorted(map(str, reasons)))})"


def finished(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["status"] == "ok"]


def runs(row) -> str:
    return "one run: no interval, no claim" if row["repeats"] == 1 else f"{row['repeats']} runs"


def against(value: tuple, reference: float, above: str, below: str, same: str) -> str:
    """`above`/`below` when the interval clears `reference`, else `same` (or nothing for one run)."""
    side = stats.versus(value, reference)
    if not stats.has_interval(value[1], value[2]):
        return ""
    return {1: above, -1: below, 0: same}[side]


# ---- When does DP or DDP beat one device, by how much, and why not n x? -----------------------

def speedup(tables: Tables) -> str:
    cells, settings = tables["cells"], tables["settings"]
    multi_cells = cells[cells["devices"] > 1]
    rows = settings[(settings["devices"] > 1) & settings["speedup"].notna()]
    if rows.empty:
        why = why_not_run(multi_cells, "multi-device")
        if not finished(multi_cells).empty:
            why = "no finished multi-device cell has a matching single-device cell that finished"
        return not_measured(why)
    lines, verdicts = [], []
    for _, r in rows.iterrows():
        value = stats.value(r, "speedup")
        efficiency = stats.value(r, "efficiency")
        verdict = against(value, 1.0, "faster than one device", "slower than one device",
                          "within noise of one device")
        verdicts.append(verdict)
        lines.append(f"- {workload(r)}, {who(r)} at {batch_phrase(r)}: {stats.interval_text(value, unit='x')} one "
                     f"device's throughput, {stats.interval_text(tuple(v * 100 for v in efficiency), '{:.0f}', ' %')} "
                     f"efficiency ({runs(r)})" + (f": **{verdict}**." if verdict else "."))
    counted = {v: verdicts.count(v) for v in set(verdicts) if v}
    summary = (", ".join(f"{n} {v}" for v, n in sorted(counted.items())) + ", judged by the 95 % intervals"
               if counted else "no interval to decide on (run the study with `repeats` > 1)")
    lines.append(f"\nOf {plural(len(rows), 'multi-device setting')}: {summary}. Ideal: n devices n times as fast "
                 "(100 % efficiency).")
    return "\n".join(lines) + "\n\n" + across_nodes(rows)


def across_nodes(rows: pd.DataFrame) -> str:
    """Intra- vs inter-node scaling: DDP at equal world size on one node and on several."""
    keys = [k for k in SETTING_KEYS if k not in ("gpus", "nodes")]
    ddp = rows[rows["mode"] == "ddp"]
    pairs = []
    for _, group in ddp.groupby(keys, dropna=False):
        for _, far in group[group["nodes"] > 1].iterrows():
            for _, near in group[group["nodes"] == 1].iterrows():
                pairs.append(f"- {workload(far)} at {batch_phrase(far)}: {plural(far['devices'], 'device')} on one "
                             f"node reached {near['efficiency'] * 100:.0f} % efficiency, spread over {far['nodes']} "
                             f"nodes {far['efficiency'] * 100:.0f} % ({far['samples_per_s'] / near['samples_per_s']:.2f}x "
                             "the one-node throughput).")
    if pairs:
        return "Intra- vs inter-node scaling (same world size):\n" + "\n".join(pairs) + "\n"
    if (ddp["nodes"] > 1).any():
        return "Inter-node scaling: the multi-node cells have no one-node cell of the same world size to compare with.\n"
    return ""


MODEL_INTRO = ("The model rebuilds each multi-device epoch from parts measured elsewhere: the single-device "
               "cell's compute split n ways, the cell's own waiting for data, the gradient all-reduce from "
               "comm_bench's bus bandwidth minus what the backward hid (the `no_sync` probe), and DP's "
               "scatter, replicate and gather. Against the ideal epoch (one device's divided by n), the "
               "measured losses add up to the measured epoch: extra data wait, the all-reduce the backward "
               "left exposed (steps with it minus steps under `no_sync`), DP's transfers, per-device compute "
               "beyond 1/n (the steps under `no_sync`), and the rest (optimizer steps, the loop's overhead).")


def why_not_n(tables: Tables) -> str:
    """Predicted vs measured speedup per setting, and the largest term that keeps it from n x."""
    from dpstudy.scaling import LOSSES, by_setting

    model = by_setting(tables["scaling"])
    if model.empty:
        return not_measured("the scaling model needs a finished multi-device cell and its finished "
                            "single-device baseline")
    lines = [MODEL_INTRO, ""]
    for _, r in model.iterrows():
        loss = max(r[k] for k in LOSSES if pd.notna(r[k]))
        lines.append(f"- {workload(r)}, {who(r)} at {batch_phrase(r)}: measured {r['measured_speedup']:.2f}x, "
                     f"model {r['predicted_speedup']:.2f}x of an ideal {r['devices']}x. Largest loss: "
                     f"**{r['largest']}** ({significant(loss)} s of a {significant(r['measured_s'])} s epoch whose "
                     f"ideal is {significant(r['ideal_s'])} s).")
    na = lambda form: lambda v: "n/a" if pd.isna(v) else form(v)  # noqa: E731
    table = pd.DataFrame({
        "setting": [f"{workload(r)}, {who(r)}, {batch_phrase(r)}" for _, r in model.iterrows()],
        "measured": model["measured_speedup"].map("{:.2f}x".format),
        "model": model["predicted_speedup"].map("{:.2f}x".format),
        "epoch s (ideal)": [f"{significant(m)} ({significant(i)})" for m, i in zip(model["measured_s"], model["ideal_s"])],
        "extra data wait s": model["loss_data_s"].map(significant),
        "all-reduce s: model (exposed)": [f"{na(significant)(a)} ({na(significant)(e)})"
                                          for a, e in zip(model["allreduce_s"], model["loss_sync_s"])],
        "hidden by backward": model["overlap"].map(na(percent)),
        "DP transfers s": model["loss_dp_s"].map(na(significant)),
        "per-device compute s": model["loss_compute_s"].map(na(significant)),
        "rest s": model["loss_other_s"].map(significant),
    })
    sources = ", ".join(sorted(model["allreduce_source"].dropna().unique()))
    return "\n".join(lines) + "\n\n" + markdown_table(table) + (
        f"\n\nAll-reduce times from: {sources} (comm_bench: its bus bandwidth at the gradients' size; probe: "
        "an all-reduce of the gradients' bytes timed in the cell).")


# ---- Is accuracy the same across modes? -------------------------------------------------------

def accuracy(tables: Tables) -> str:
    settings = tables["settings"].dropna(subset=["final_test_acc"])
    note = ("Test accuracy is computed once over the whole test set, counts all-reduced across ranks "
            "(not per rank).")
    groups = [g for _, g in settings.groupby(list(BASELINE_KEYS), dropna=False) if len(g) > 1]
    if not groups:
        return not_measured("no setting finished in more than one mode") + " " + note
    lines, widest = [], None
    for group in groups:
        best, worst = group.loc[group["final_test_acc"].idxmax()], group.loc[group["final_test_acc"].idxmin()]
        gap = best["final_test_acc"] - worst["final_test_acc"]
        claim = stats.compare(stats.value(best, "final_test_acc"), stats.value(worst, "final_test_acc"))
        if widest is None or gap > widest[0]:
            widest = (gap, best, worst, claim)
        parts = ", ".join(f"{who(r)} {stats.interval_text(tuple(v * 100 for v in stats.value(r, 'final_test_acc')), '{:.1f}', ' %')}"
                          for _, r in group.iterrows())
        verdict = "differ beyond noise" if claim else ("within noise" if group["repeats"].min() > 1 else
                                                       "one run each: no claim")
        lines.append(f"- {workload(best)} at {batch_phrase(best)}: {parts}: {verdict}.")
    gap, best, worst, claim = widest
    head = (f"Final test accuracy differed by at most {gap * 100:.1f} points across modes at equal settings "
            f"(largest gap: {workload(best)} at {batch_phrase(best)}, {who(best)} {best['final_test_acc'] * 100:.1f} % "
            f"vs {who(worst)} {worst['final_test_acc'] * 100:.1f} %"
            + ("; beyond noise" if claim else "; within noise" if worst["repeats"] > 1 else "") + ").")
    return head + "\n\n" + "\n".join(lines) + "\n\n" + note


# ---- How much of each step is waiting for data? -----------------------------------------------

def steady_epochs(epochs: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Epochs of finished cells after the warm-up epoch."""
    return epochs[~epochs["warmup"].astype(bool) & epochs["cell"].isin(finished(cells)["cell"])]


def wait_share(epochs: pd.DataFrame) -> float:
    return epochs["data_wait_s"].sum() / epochs["wall_s"].sum()


def loader_name(loader: str, workers: int, augment: str | None = None) -> str:
    name = "loader device" if loader == "device" else f"loader torch/{plural(workers, 'worker')}"
    return name + (f", augment {augment}" if augment else "")


def data_wait(tables: Tables) -> str:
    """Share of the training time spent waiting for data, by loader (and by mode)."""
    cells, steady = tables["cells"], steady_epochs(tables["epochs"], tables["cells"])
    if steady.empty:
        return not_measured(why_not_run(cells))
    keys = ["loader", "workers"] + (["augment"] if steady["augment"].nunique() > 1 else [])
    shares = steady.groupby(keys).apply(wait_share).sort_values(ascending=False)
    named = [f"{percent(v)} with {loader_name(*(k if isinstance(k, tuple) else (k,)))}" for k, v in shares.items()]
    text = f"Waiting for data took {named[0].replace(' with ', ' of the training time with ', 1)}"
    text += " (the only loader in this study)." if len(named) == 1 else f" vs {', '.join(named[1:])}."
    by_mode = steady.groupby(["mode", "backend", "gpus", "nodes"]).apply(wait_share)
    return text + " By mode: " + ", ".join(f"{setup_name(*k)} {percent(v)}" for k, v in by_mode.items()) + "."


# ---- NCCL vs Gloo -----------------------------------------------------------------------------

def backends(tables: Tables, comm: pd.DataFrame | None = None) -> str:
    cells, settings = tables["cells"], tables["settings"]
    ddp_cells = cells[cells["mode"] == "ddp"]
    ddp = settings[settings["mode"] == "ddp"]
    keys = [k for k in SETTING_KEYS if k != "backend"]
    lines = []
    for _, group in ddp.groupby(keys, dropna=False):
        by_backend = group.set_index("backend")
        if {"nccl", "gloo"} <= set(by_backend.index):
            nccl, gloo = by_backend.loc["nccl"], by_backend.loc["gloo"]
            claim = stats.compare(stats.value(nccl, "samples_per_s"), stats.value(gloo, "samples_per_s"))
            verdict = {1: "NCCL faster beyond noise", -1: "Gloo faster beyond noise",
                       0: "within noise" if min(nccl["repeats"], gloo["repeats"]) > 1 else "one run each: no claim"}[claim]
            row = group.iloc[0]
            lines.append(f"- {workload(row)} on {plural(row['devices'], 'device')} at {batch_phrase(row)}: NCCL reached "
                         f"{nccl['samples_per_s'] / gloo['samples_per_s']:.2f}x the throughput of Gloo "
                         f"({significant(nccl['samples_per_s'])} vs {significant(gloo['samples_per_s'])} samples/s): "
                         f"{verdict}.")
    if lines:
        text = "\n".join(lines)
    else:
        missing = [b for b in ("nccl", "gloo") if finished(ddp_cells[ddp_cells["backend"] == b]).empty]
        why = "; ".join(why_not_run(ddp_cells[ddp_cells["backend"] == b], b.upper()) for b in missing)
        text = not_measured(f"NCCL vs Gloo needs both at equal settings: {why or 'no equal settings ran'}")
    if comm is None or comm.empty:
        return text + "\n\n" + not_measured("the all-reduce bandwidth (no comm benchmark results, comm.csv)")
    return text + "\n\nThe all-reduce microbenchmark below measures the bandwidth behind the gap."


# ---- Memory and utilisation -------------------------------------------------------------------

def memory(tables: Tables) -> str:
    """Peak memory per rank: the spread between the fullest and the emptiest device, per mode."""
    multi = tables["cells"][tables["cells"]["devices"] > 1]
    ok = finished(multi).dropna(subset=["peak_mem_mb_max", "peak_mem_mb_min"])
    lines = []
    for mode in ("dp", "ddp"):
        rows = ok[ok["mode"] == mode]
        if rows.empty:
            lines.append(f"- {mode.upper()}: {not_measured(why_not_run(multi[multi['mode'] == mode], mode.upper()))}")
            continue
        ratio = rows["peak_mem_mb_max"] / rows["peak_mem_mb_min"]
        r = rows.loc[ratio.idxmax()]
        lines.append(f"- {setup_name(r['mode'], r['backend'], r['gpus'], r['nodes'])}: the fullest device peaked at "
                     f"{ratio.max():.2f}x the memory of the emptiest ({r['peak_mem_mb_max']:.0f} MB vs "
                     f"{r['peak_mem_mb_min']:.0f} MB, {workload(r)} at {batch_phrase(r)}).")
    return ("\n".join(lines) + "\n\nMemory is CUDA's peak allocation per device on GPUs and each process's "
            "peak resident set on CPU (last epoch).")


def utilisation(tables: Tables) -> str:
    util, cells = tables["util"], tables["cells"]
    if util.empty:
        ran_on = ", ".join(sorted(cells["env_device"].dropna().unique())) or "unknown"
        return not_measured(f"GPU utilisation was not sampled (the cells ran on {ran_on})")
    means = util.groupby(["cell", "device"])["gpu_util"].mean()
    return "\n".join(f"- {cell}: " + ", ".join(f"GPU {d} {v:.0f} %" for (_, d), v in per.items()) + " busy on average."
                     for cell, per in means.groupby(level=0))


# ---- Microbenchmarks --------------------------------------------------------------------------

def kernels(table: pd.DataFrame | None) -> str:
    from dpstudy.readable import kernels_table

    if table is None or table.empty:
        return not_measured("custom kernels vs a Python loop vs PyTorch's ops (no kernel benchmark results, kernels.csv)")
    compact, skipped = kernels_table(table)
    return (markdown_table(compact) + "\n\nMedian time per call; loops run on a part of the input and are scaled "
            "to the whole." + "".join(f"\n- {line}" for line in skipped))


def comm(table: pd.DataFrame | None) -> str:
    from dpstudy.readable import comm_table

    if table is None or table.empty:
        return not_measured("the all-reduce bandwidth (no comm benchmark results, comm.csv)")
    compact, skipped = comm_table(table)
    text = markdown_table(compact) if not compact.empty else not_measured("no backend could run here")
    return (text + "\n\nBus bandwidth as nccl-tests defines it (algorithm bandwidth x 2(n-1)/n), median over "
            "iterations, slowest rank." + "".join(f"\n- {line}" for line in skipped))
