"""The report's answers to the study's questions (docs/sources.md), from the tables.

Every function takes the tables of dpstudy.analysis.collect.summarise (collect.TABLES) and returns
markdown. Repeats of a cell are summarised with 95 % intervals (dpstudy.analysis.stats): a difference
is claimed only when it is larger than its interval, and called "within noise" otherwise; a single run
gets its number and no claim. A question the data cannot answer gets "Not measured in this study:
<why>" instead of silence.

This module only phrases: every number it states, and every verdict, is a column of a table
(settings: a setting's speedup, its `verdict`, `noise_max_cv` and `effect`; comparisons: settings
against settings; summary: the counts of verdicts, the noise floor, the busy host; data_wait, memory,
util_means, scaling_settings). It picks rows, orders them and counts the lines it lists.
"""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.keys import BASELINE_KEYS
from dpstudy.analysis.strategies import WORKLOAD_KEYS, ranked
from dpstudy.analysis.summary import VERDICT_COLUMNS
from dpstudy.report.text import code, markdown_table, plural, significant, text

Tables = dict[str, pd.DataFrame]


def percent(fraction: float) -> str:
    return f"{fraction * 100:.0f} %"


def not_measured(why: str) -> str:
    return f"*Not measured in this study:* {why}."


def mode_name(mode: str, shard: str = "full") -> str:
    """DP, DDP, FSDP full, FSDP grad_op."""
    return f"{mode.upper()}{f' {text(shard)}' if mode == 'fsdp' else ''}"


def strategy_name(mode: str, backend: str, shard: str = "full") -> str:
    """DP, DDP (gloo), FSDP full (nccl), FSDP grad_op (gloo)."""
    if mode == "dp":
        return "DP"
    return f"{mode_name(mode, shard)} ({text(backend)})"


def setup_name(mode: str, backend: str, gpus: int, nodes: int = 1, shard: str = "full") -> str:
    if mode == "single":
        return "one device"
    where = plural(gpus, "device") if nodes == 1 else f"{nodes} nodes x {plural(gpus, 'device')}"
    return f"{strategy_name(mode, backend, shard)} on {where}"


# Rows are pandas Series (iterrows, .loc) or dicts: read them by key (Series.mode is a method).
def who(row) -> str:
    return setup_name(row["mode"], row["backend"], row["gpus"], row["nodes"], row.get("shard", "full"))


def batch_phrase(row) -> str:
    per_device = row["batch_scope"] == "per_device" and row["devices"] > 1
    return f"batch {row['batch']}" + (" per device" if per_device else "")


def workload(row) -> str:
    return f"{text(row['dataset'])}/{text(row['model'])}"


def why_not_run(cells: pd.DataFrame, what: str = "") -> str:
    """Why `cells` (the `what` cells a question needs) gave no data."""
    kind = f"{what} cell" if what else "cell"
    if cells.empty:
        return f"the study has no {kind}s"
    reasons = cells["reason"].dropna().unique() if cells["reason"].notna().any() else cells["status"].unique()
    return f"no {kind} finished ({'; '.join(text(r) for r in sorted(map(str, reasons)))})"


def finished(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["status"] == "ok"]


def whole(v):
    """A count or a key read back from a CSV column with gaps (2.0) as the integer it is."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def study(tables: Tables) -> pd.Series:
    """The summary table's one row (dpstudy.analysis.summary.summary_table)."""
    return tables["summary"].iloc[0]


def by_setting(tables: Tables) -> pd.DataFrame:
    """The settings table indexed by `setting`, the number other tables name a setting by."""
    return tables["settings"].set_index("setting", drop=False)


def members(comparison) -> list[int]:
    """The settings of a comparisons row, in table order."""
    return [int(s) for s in str(comparison["members"]).split()]


# ---- Naming a setting: every key the study varies -------------------------------------------

# Keys the phrases below already name (workload, who, batch_phrase); any other key that varies in
# the study is appended, so two settings never read the same.
NAMED_KEYS = {"dataset", "model", "mode", "backend", "gpus", "nodes", "devices", "batch", "batch_scope", "global_batch"}
LIST_LIMIT = 12  # settings listed one per line; a larger study gets its best and worst and the overview


def varied(tables: Tables) -> list[str]:
    """The keys that take more than one value among the study's settings (or cells)."""
    frame = tables["settings"] if not tables["settings"].empty else tables["cells"]
    return stats.varied_keys(frame)


def extra_keys(row, keys: list[str]) -> str:
    extras = [f"{k} {value_text(row[k])}" for k in keys if k not in NAMED_KEYS]
    return "".join(f", {e}" for e in extras)


def value_text(v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return "none" if pd.isna(v) else text(v)


def setting_name(row, keys: list[str]) -> str:
    """'synthetic/lenet, DDP (gloo) on 2 devices at batch 64, lr 0.01': each varied key named."""
    return f"{workload(row)}, {who(row)} at {batch_phrase(row)}{extra_keys(row, keys)}"


def runs_text(row) -> str:
    """How many runs the interval rests on, or why there is none."""
    if row["repeats"] < 2 or row["baseline_repeats"] < 2:
        return f"{row['repeats']} vs {row['baseline_repeats']} runs: too few for an interval"
    return f"{row['repeats']} vs {row['baseline_repeats']} runs"


def noise_text(row) -> str:
    """'noise 4 % / 6 %' (CV of throughput over repeats: the setting / its baseline)."""
    parts = [percent(v) if pd.notna(v) else "n/a" for v in (row["noise_cv"], row["baseline_noise_cv"])]
    return f"noise {parts[0]} / {parts[1]}"


NOISIER = "noisier than its effect"
# The settings table's `verdict` (dpstudy.analysis.stats.VERDICTS) in words.
VERDICT_TEXT = {
    "faster": "faster than one device",
    "slower": "slower than one device",
    "within noise": "within noise of one device",
    "noisier": NOISIER,
}


def speedup_verdict(row) -> str:
    """faster / slower / within noise of one device, NOISIER, or '' with too few runs."""
    return VERDICT_TEXT.get(row["verdict"], "") if isinstance(row["verdict"], str) else ""


def verdict_text(row) -> str:
    verdict = speedup_verdict(row)
    if verdict == NOISIER:
        return (
            f"**{verdict}**: the noise ({percent(row['noise_max_cv'])}) is larger than the effect "
            f"({percent(row['effect'])}), it cannot be told apart from one device"
        )
    return f"**{verdict}**" if verdict else ""


def speedup_line(row, keys: list[str]) -> str:
    value, efficiency = stats.value(row, "speedup"), stats.value(row, "efficiency")
    verdict = verdict_text(row)
    return (
        f"- {setting_name(row, keys)}: {stats.interval_text(value, unit='x')} one device's throughput, "
        f"{stats.interval_text(tuple(v * 100 for v in efficiency), '{:.0f}', ' %')} efficiency "
        f"({runs_text(row)}; {noise_text(row)})" + (f": {verdict}." if verdict else ".")
    )


def listed(rows: pd.DataFrame, line, by: str) -> list[str]:
    """Every row's line, or for a large study the best and the worst few by `by` and a pointer to
    the overview and the CSV tables for the rest."""
    if len(rows) <= LIST_LIMIT:
        return [line(r) for _, r in rows.iterrows()]
    ranked = rows.sort_values(by, ascending=False)
    shown = LIST_LIMIT // 2
    return (
        ["Best by " + by.replace("_", " ") + ":"]
        + [line(r) for _, r in ranked.head(shown).iterrows()]
        + ["", "Worst:"]
        + [line(r) for _, r in ranked.tail(shown).iterrows()]
        + [
            "",
            f"The other {len(rows) - 2 * shown} settings: in the overview above and in `results/tables/settings.csv`.",
        ]
    )


# ---- When does DP or DDP beat one device, by how much, and why not n x? -----------------------

SPEEDUP_DEFINITION = (
    "A setting's speedup is the geometric mean of its repeats' throughput (samples/s in the steady "
    "window) over that of its single-device baseline (the same settings on one device), with a 95 % "
    f"interval from a {stats.METHOD} (chosen because it holds its coverage at 3 repeats; see the README). "
    "Efficiency is speedup per device. Noise is the coefficient of variation of throughput over the "
    "repeats, of the setting / of its baseline; a setting whose noise is larger than the effect it would "
    "claim is flagged."
)


def speedup(tables: Tables) -> str:
    cells, settings = tables["cells"], tables["settings"]
    multi_cells = cells[cells["devices"] > 1]
    rows = settings[(settings["devices"] > 1) & settings["speedup"].notna()]
    if rows.empty:
        why = why_not_run(multi_cells, "multi-device")
        if not finished(multi_cells).empty:
            why = "no finished multi-device cell has a matching single-device cell that finished"
        return not_measured(why)
    keys = varied(tables)
    lines = listed(rows, lambda r: speedup_line(r, keys), "speedup")
    figures = study(tables)
    counted = {
        words: whole(figures[VERDICT_COLUMNS[v]]) for v, words in VERDICT_TEXT.items() if figures[VERDICT_COLUMNS[v]]
    }
    summary = (
        ", ".join(f"{n} {v}" for v, n in sorted(counted.items())) + ", judged by the 95 % intervals and the noise"
        if counted
        else "no interval to decide on (run the study with `repeats` > 1)"
    )
    settings_count = plural(whole(figures["multi_settings"]), "multi-device setting")
    lines.append(f"\nOf {settings_count}: {summary}. Ideal: n devices n times as fast (100 % efficiency).")
    return SPEEDUP_DEFINITION + "\n\n" + "\n".join(lines) + "\n\n" + across_nodes(tables, keys)


def busy_text(tables: Tables) -> str:
    """Which runs shared the machine with other processes: the first suspect for their noise."""
    figures = study(tables)
    if pd.isna(figures["other_load_max"]):
        return ""
    if not figures["busy_cells"]:
        return (
            f" No run shared the machine: other processes used at most {figures['other_load_max']:.2f} cores "
            "while a cell trained."
        )
    return (
        f" **{plural(whole(figures['busy_cells']), 'run')} of {whole(figures['finished_cells'])} shared the "
        f"machine** with other processes (more than {figures['busy_cores']} cores on average while training, up "
        f"to {figures['busy_other_load_max']:.2f}): their throughput is lower and noisier than a quiet machine's; "
        "run the study alone for numbers to publish."
    )


def single_noise(tables: Tables) -> str:
    """The noise floor: CV of a single-device setting's throughput over its repeats."""
    settings, figures = tables["settings"], study(tables)
    if not figures["noise_floor_settings"]:
        return not_measured("the noise floor needs a single-device setting with more than one repeat")
    singles = settings[(settings["mode"] == "single") & (settings["devices"] == 1) & settings["noise_cv"].notna()]
    keys = varied(tables)
    lines = [
        f"- {setting_name(r, keys)}: CV {percent(r['noise_cv'])} over {r['repeats']} runs "
        f"({stats.interval_text(stats.value(r, 'samples_per_s'), significant, ' samples/s')})"
        for _, r in singles.iterrows()
    ]
    return (
        f"Noise floor: the single-device throughput varies by a median CV of "
        f"{percent(figures['noise_floor_median_cv'])} between repeats (largest "
        f"{percent(figures['noise_floor_max_cv'])})."
        + busy_text(tables)
        + "\n\n"
        + "\n".join(lines[:LIST_LIMIT])
        + (
            ""
            if len(lines) <= LIST_LIMIT
            else f"\n- ... {len(lines) - LIST_LIMIT} more in `results/tables/settings.csv`"
        )
    )


def across_nodes(tables: Tables, named: list[str] = ()) -> str:
    """Intra- vs inter-node scaling: DDP at equal world size on one node and on several (the
    comparisons of kind "nodes": the multi-node setting, the one-node one, the throughput ratio)."""
    comparisons, settings = tables["comparisons"], by_setting(tables)
    pairs = []
    for _, pair in comparisons[comparisons["kind"] == "nodes"].iterrows():
        far, near = settings.loc[pair["setting"]], settings.loc[pair["other"]]
        pairs.append(
            f"- {workload(far)} at {batch_phrase(far)}{extra_keys(far, named)}: "
            f"{plural(far['devices'], 'device')} on one node reached {near['efficiency'] * 100:.0f} % "
            f"efficiency, spread over {far['nodes']} nodes {far['efficiency'] * 100:.0f} % "
            f"({pair['value']:.2f}x the one-node throughput)."
        )
    if pairs:
        return "Intra- vs inter-node scaling (same world size):\n" + "\n".join(pairs[:LIST_LIMIT]) + "\n"
    rows = tables["settings"]
    ddp = rows[(rows["devices"] > 1) & rows["speedup"].notna() & (rows["mode"] == "ddp")]
    if (ddp["nodes"] > 1).any():
        return (
            "Inter-node scaling: the multi-node cells have no one-node cell of the same world size to compare with.\n"
        )
    return ""


MODEL_INTRO = (
    "The model rebuilds each multi-device epoch from parts measured elsewhere: the single-device "
    "cell's compute split n ways, the cell's own waiting for data, the collectives that keep the "
    "ranks in step (DDP's gradient all-reduce; FSDP's parameter all-gathers, twice with full "
    "sharding, and gradient reduce-scatter) from comm_bench's bus bandwidths minus what the step hid "
    "(the probe: DDP's step under `no_sync`, FSDP's step on an unsharded replica), and DP's "
    "scatter, replicate and gather. Against the ideal epoch (one device's divided by n), the "
    "measured losses add up to the measured epoch: extra data wait, the collectives the step left "
    "exposed (steps with them minus steps without), DP's transfers, per-device compute beyond 1/n "
    "(the steps without collectives), and the rest (optimizer steps, the loop's overhead)."
)


def loss_text(value: float, noise: float) -> str:
    """A loss in seconds; a negative one says whether it is within the noise (then it is noise)."""
    if pd.isna(value):
        return "n/a"
    if value >= 0:
        return significant(value)
    if pd.isna(noise):
        return f"{significant(value)} (noise unknown: one run)"
    return f"{significant(value)} ({'noise' if -value <= noise else 'gain beyond noise'})"


NEGATIVE_NOTE = (
    "A negative term means that part took less than its ideal share. Where it is smaller than "
    "the epoch's noise (the standard deviation of the measured epoch over repeats, baseline's "
    "share included: the `noise s` column) it is measurement noise, not a gain, and is marked "
    "(noise); one that is larger is marked (gain beyond noise): e.g. smaller per-device steps that "
    "fit a cache better. Without repeats the noise is unknown."
)


def why_not_n(tables: Tables) -> str:
    """Predicted vs measured speedup per setting, and the largest term that keeps it from n x (the
    scaling_settings table: dpstudy.analysis.scaling.settings_model)."""
    model = tables["scaling_settings"]
    if model.empty:
        return not_measured(
            "the scaling model needs a finished multi-device cell and its finished single-device baseline"
        )
    keys = varied(tables)

    def measured(r) -> str:
        return stats.interval_text(stats.value(r, "measured_speedup"), unit="x")

    def predicted(r) -> str:
        return "n/a" if pd.isna(r["predicted_speedup"]) else f"{r['predicted_speedup']:.2f}x"

    def line(r) -> str:
        return (
            f"- {setting_name(r, keys)}: measured {measured(r)}, model {predicted(r)} of an "
            f"ideal {r['devices']}x. Largest loss: **{r['largest']}** ({significant(r['largest_s'])} s of a "
            f"{significant(r['measured_s'])} s epoch whose ideal is {significant(r['ideal_s'])} s)."
        )

    lines = [MODEL_INTRO, "", *listed(model, line, "measured_speedup")]
    na = lambda form: lambda v: "n/a" if pd.isna(v) else form(v)  # noqa: E731
    shown = (
        model
        if len(model) <= LIST_LIMIT
        else model.sort_values("measured_speedup").iloc[
            list(range(LIST_LIMIT // 2)) + list(range(-(LIST_LIMIT // 2), 0))
        ]
    )
    table = pd.DataFrame(
        {
            "setting": [setting_name(r, keys) for _, r in shown.iterrows()],
            "measured": [measured(r) for _, r in shown.iterrows()],
            "model": shown["predicted_speedup"].map(na("{:.2f}x".format)),
            "epoch s (ideal)": [
                f"{significant(m)} ({significant(i)})" for m, i in zip(shown["measured_s"], shown["ideal_s"])
            ],
            "noise s": shown["noise_s"].map(na(significant)),
            "extra data wait s": [loss_text(v, n) for v, n in zip(shown["loss_data_s"], shown["noise_s"])],
            "collectives s: model (exposed)": [
                f"{na(significant)(a)} ({loss_text(e, n)})"
                for a, e, n in zip(shown["sync_s"], shown["loss_sync_s"], shown["noise_s"])
            ],
            "hidden by the step": shown["overlap"].map(na(percent)),
            "DP transfers s": [loss_text(v, n) for v, n in zip(shown["loss_dp_s"], shown["noise_s"])],
            "per-device compute s": [loss_text(v, n) for v, n in zip(shown["loss_compute_s"], shown["noise_s"])],
            "rest s": [loss_text(v, n) for v, n in zip(shown["loss_other_s"], shown["noise_s"])],
        }
    )
    sources = ", ".join(sorted(model["sync_source"].dropna().unique()))
    return (
        "\n".join(lines)
        + "\n\n"
        + markdown_table(table, escape=False)
        + "\n\n"
        + NEGATIVE_NOTE
        + (
            f"\n\nMeasured: the setting's speedup with its 95 % interval (as above). Collective times from: {sources} "
            "(comm_bench: its bus bandwidth at the gradients' or a unit's size; probe: the cell's own collectives "
            "timed alone)."
        )
    )


# ---- Is accuracy the same across modes? -------------------------------------------------------


def accuracy(tables: Tables) -> str:
    """The comparisons of kind "accuracy": per group of settings that differ only in mode, devices
    or backend, the most against the least accurate, and the largest of those gaps."""
    comparisons, settings = tables["comparisons"], by_setting(tables)
    gaps = comparisons[comparisons["kind"] == "accuracy"]
    note = "Test accuracy is computed once over the whole test set, counts all-reduced across ranks (not per rank)."
    keys = [k for k in varied(tables) if k in BASELINE_KEYS]
    if gaps.empty:
        return not_measured("no setting finished in more than one mode") + " " + note
    lines = []
    for _, gap in gaps.iterrows():
        best, group = settings.loc[gap["setting"]], settings.loc[members(gap)]
        parts = ", ".join(
            f"{who(r)} {stats.interval_text(tuple(v * 100 for v in stats.value(r, 'final_test_acc')), '{:.1f}', ' %')}"
            for _, r in group.iterrows()
        )
        verdict = (
            "differ beyond noise"
            if gap["claim"]
            else ("within noise" if gap["repeats"] > 1 else "one run each: no claim")
        )
        lines.append(f"- {workload(best)} at {batch_phrase(best)}{extra_keys(best, keys)}: {parts}: {verdict}.")
    widest = gaps[gaps["largest"].astype(bool)].iloc[0]
    best, worst, claim = settings.loc[widest["setting"]], settings.loc[widest["other"]], widest["claim"]
    head = (
        f"Final test accuracy differed by at most {widest['value'] * 100:.1f} points across modes at equal "
        "settings "
        f"(largest gap: {workload(best)} at {batch_phrase(best)}{extra_keys(best, keys)}, "
        f"{who(best)} {best['final_test_acc'] * 100:.1f} % "
        f"vs {who(worst)} {worst['final_test_acc'] * 100:.1f} %"
        + ("; beyond noise" if claim else "; within noise" if worst["repeats"] > 1 else "")
        + ")."
    )
    if len(lines) > LIST_LIMIT:
        lines = lines[:LIST_LIMIT] + [f"- ... {len(lines) - LIST_LIMIT} more groups in `results/tables/settings.csv`."]
    return head + "\n\n" + "\n".join(lines) + "\n\n" + note


# ---- How much of each step is waiting for data? -----------------------------------------------


def loader_name(loader: str, workers: int, augment: str | None = None) -> str:
    name = "loader device" if loader == "device" else f"loader torch/{plural(whole(workers), 'worker')}"
    return name + (f", augment {text(augment)}" if augment else "")


def data_wait(tables: Tables) -> str:
    """Share of the training time spent waiting for data, by loader (and by mode): the data_wait
    table (dpstudy.analysis.summary.wait_table)."""
    cells, wait = tables["cells"], tables["data_wait"]
    if wait.empty:
        return not_measured(why_not_run(cells))
    loaders, setups = wait[wait["by"] == "loader"], wait[wait["by"] == "setup"]
    named = [
        f"{percent(r['share'])} with "
        f"{loader_name(r['loader'], r['workers'], r['augment'] if pd.notna(r['augment']) else None)}"
        for _, r in loaders.iterrows()
    ]
    text = f"Waiting for data took {named[0].replace(' with ', ' of the training time with ', 1)}"
    text += " (the only loader in this study)." if len(named) == 1 else f" vs {', '.join(named[1:])}."
    return (
        text
        + " By mode: "
        + ", ".join(
            f"{setup_name(r['mode'], r['backend'], whole(r['gpus']), whole(r['nodes']), r.get('shard', 'full'))} "
            f"{percent(r['share'])}"
            for _, r in setups.iterrows()
        )
        + "."
    )


# ---- NCCL vs Gloo -----------------------------------------------------------------------------


def backends(tables: Tables, comm: pd.DataFrame | None = None) -> str:
    """NCCL against Gloo at otherwise equal settings: the comparisons of kind "backend"."""
    cells, comparisons, settings = tables["cells"], tables["comparisons"], by_setting(tables)
    ddp_cells = cells[cells["mode"] == "ddp"]
    keys_named = varied(tables)
    lines = []
    for _, pair in comparisons[comparisons["kind"] == "backend"].iterrows():
        nccl, gloo, row = (settings.loc[pair["setting"]], settings.loc[pair["other"]], settings.loc[members(pair)[0]])
        verdict = {
            1: "NCCL faster beyond noise",
            -1: "Gloo faster beyond noise",
            0: "within noise" if pair["repeats"] > 1 else "one run each: no claim",
        }[int(pair["claim"])]
        lines.append(
            f"- {workload(row)} on {plural(row['devices'], 'device')} at {batch_phrase(row)}"
            f"{extra_keys(row, keys_named)}: NCCL reached {pair['value']:.2f}x the throughput of Gloo "
            f"({significant(nccl['samples_per_s'])} vs {significant(gloo['samples_per_s'])} samples/s): "
            f"{verdict}."
        )
    if lines:
        text = "\n".join(lines[:LIST_LIMIT]) + (
            f"\n- ... {len(lines) - LIST_LIMIT} more in `results/tables/settings.csv`."
            if len(lines) > LIST_LIMIT
            else ""
        )
    else:
        missing = [b for b in ("nccl", "gloo") if finished(ddp_cells[ddp_cells["backend"] == b]).empty]
        why = "; ".join(why_not_run(ddp_cells[ddp_cells["backend"] == b], b.upper()) for b in missing)
        text = not_measured(f"NCCL vs Gloo needs both at equal settings: {why or 'no equal settings ran'}")
    if comm is None or comm.empty:
        return text + "\n\n" + not_measured("the all-reduce bandwidth (no comm benchmark results, comm.csv)")
    return text + "\n\nThe all-reduce microbenchmark below measures the bandwidth behind the gap."


# ---- Which strategy? --------------------------------------------------------------------------

STRATEGIES_INTRO = (
    "Every strategy the study ran for the same data, model and global batch, ranked by throughput "
    "(the geometric mean of its repeats, 95 % interval), with the memory its fullest device needed for "
    "one training step (PyTorch's tracker; the memory plan's prediction beside it) and the scaling "
    "model's account. A strategy that does not fit (out of memory, or predicted above the study's "
    "`memory_budget_gib`) did not run, so the fastest that ran is the fastest that fits. "
    '"vs one device" is the throughput over one device without torch.compile.'
)


def strategy_label(row, keys: list[str]) -> str:
    """'FSDP full (gloo) on 2 devices, compiled': the strategy keys the study varies named."""
    name = setup_name(row["mode"], row["backend"], whole(row["gpus"]), whole(row["nodes"]), row["shard"])
    extras = [f"{k} {value_text(row[k])}" for k in ("batch_scope", "lr_scaling") if k in keys]
    return name + (", compiled" if bool(row["compile"]) else "") + "".join(f", {e}" for e in extras)


def workload_label(row, keys: list[str]) -> str:
    """'synthetic_rgb/resnet18 at global batch 64, precision bf16': the workload keys the study varies."""
    named = [k for k in keys if k in WORKLOAD_KEYS and k not in ("dataset", "model", "global_batch", "devices")]
    return f"{workload(row)} at global batch {whole(row['global_batch'])}{extra_keys(row, named)}"


def lead_text(best, runner_up, keys: list[str]) -> str:
    """How far the fastest is ahead of the next, and whether that is beyond noise."""
    if runner_up is None:
        return "the only strategy that ran"
    lead = stats.interval_text(stats.value(best, "vs_next"), unit="x")
    if not stats.has_interval(best["vs_next_low"], best["vs_next_high"]):
        claim = "one run on a side: no claim"
    else:
        claim = "beyond noise" if best["vs_next_claim"] == 1 else "**within noise**: a tie"
    return f"ahead of the next, {strategy_label(runner_up, keys)}, by {lead} ({claim})"


def model_reason(rows: pd.DataFrame, keys: list[str], settings: pd.DataFrame) -> str:
    """The model's account of the ranking: whether it orders the strategies as measured (pairs
    within noise may go either way), the pairs it gets wrong, and what costs each multi-device
    strategy most against n x."""
    predicted = rows.dropna(subset=["predicted_samples_per_s"])
    if len(predicted) < 2:
        return "The model has too few of these strategies to rank (it needs a finished one-device baseline)."
    order = ", ".join(strategy_label(r, keys) for _, r in predicted.sort_values("model_rank").iterrows())
    if bool(rows["model_agrees"].iloc[0]):
        head = f"The model orders them as measured, up to ties within noise: {order}."
    else:
        wrong = [
            f"{strategy_label(r, keys)} beat {strategy_label(settings.loc[int(other)], keys)} beyond noise"
            for _, r in predicted.iterrows()
            if isinstance(r["model_misorders"], str)
            for other in r["model_misorders"].split()
        ]
        head = f"The model orders them {order}, which the measurements contradict: {'; '.join(wrong)}."
    losses = [
        f"{strategy_label(r, keys)}: {text(r['largest'])}, {significant(r['largest_s'])} s per epoch"
        for _, r in rows.iterrows()
        if isinstance(r["largest"], str)
    ]
    return head + (" Largest loss against n x: " + "; ".join(losses) + "." if losses else "")


def strategy_table(rows: pd.DataFrame, keys: list[str]) -> str:
    na = lambda form: lambda v: "n/a" if pd.isna(v) else form(v)  # noqa: E731
    table = pd.DataFrame(
        {
            "rank": rows["rank"].map(na(lambda v: str(whole(v)))),
            "strategy": [strategy_label(r, keys) for _, r in rows.iterrows()],
            "samples/s [95 %]": [
                stats.interval_text(stats.value(r, "samples_per_s"), significant) for _, r in rows.iterrows()
            ],
            "vs one device": [
                "n/a" if pd.isna(r["vs_one_device"]) else stats.interval_text(stats.value(r, "vs_one_device"), unit="x")
                for _, r in rows.iterrows()
            ],
            "MB per device: measured (predicted)": [
                f"{na(significant)(m)} ({na(significant)(p)})"
                for m, p in zip(rows["memory_mb"], rows["predicted_memory_mb"])
            ],
            "model: samples/s (rank)": [
                "n/a" if pd.isna(v) else f"{significant(v)} ({whole(k)})"
                for v, k in zip(rows["predicted_samples_per_s"], rows["model_rank"])
            ],
        }
    )
    return markdown_table(table, escape=False)


def strategies(tables: Tables) -> str:
    """Per workload: the fastest strategy that fits with its interval and its lead over the next,
    the ranking as a table, the strategies that did not run and why, and the model's reason (the
    strategies table: dpstudy.analysis.strategies)."""
    table = tables["strategies"]
    ran = table[table["rank"].notna()]
    if ran.empty:
        return not_measured(why_not_run(tables["cells"]))
    keys = varied(tables)
    sections = []
    workloads = sorted(ran["workload"].unique())
    for number in workloads[:LIST_LIMIT]:
        rows, every = ranked(table, number), table[table["workload"] == number]
        best = rows.iloc[0]
        runner_up = rows.iloc[1] if len(rows) > 1 else None
        fastest = (
            f"**{workload_label(best, keys)}**: fastest that fits: **{strategy_label(best, keys)}**, "
            f"{stats.interval_text(stats.value(best, 'samples_per_s'), significant, ' samples/s')}"
            + (
                f", {stats.interval_text(stats.value(best, 'vs_one_device'), unit='x')} one device"
                if pd.notna(best["vs_one_device"])
                else ""
            )
            + f"; {lead_text(best, runner_up, keys)}."
        )
        unfit = every[every["fits"].eq(False)]
        other = every[every["rank"].isna() & ~every["fits"].eq(False)]
        notes = [f"- does not fit: {strategy_label(r, keys)}: {text(r['reason'])}" for _, r in unfit.iterrows()] + [
            f"- did not run: {strategy_label(r, keys)}: {text(r['status'])}, {text(r['reason'])}"
            for _, r in other.iterrows()
        ]
        sections.append(
            "\n\n".join(
                [
                    fastest,
                    strategy_table(rows, keys),
                    *(["\n".join(notes)] if notes else []),
                    model_reason(rows, keys, by_setting(tables)),
                ]
            )
        )
    more = len(workloads) - LIST_LIMIT
    tail = f"\n\n... {plural(more, 'more workload')} in `results/tables/strategies.csv`." if more > 0 else ""
    return STRATEGIES_INTRO + "\n\n" + "\n\n".join(sections) + tail


# ---- Memory and utilisation -------------------------------------------------------------------


def memory(tables: Tables) -> str:
    """Peak memory per rank: the spread between the fullest and the emptiest device, per mode (the
    memory table's cell with the largest imbalance); then one training step's split as PyTorch's
    tracker measured it (memory_spread) and the memory plan's prediction beside it (memory_accuracy)."""
    cells, imbalances = tables["cells"], tables["memory"]
    multi = cells[cells["devices"] > 1]
    lines = []
    for mode in ("dp", "ddp", "fsdp"):
        rows = imbalances[imbalances["mode"] == mode]
        if rows.empty:
            if mode != "fsdp" or not multi[multi["mode"] == "fsdp"].empty:
                lines.append(
                    f"- {mode.upper()}: {not_measured(why_not_run(multi[multi['mode'] == mode], mode.upper()))}"
                )
            continue
        m = rows[rows["largest"].astype(bool)].iloc[0]
        r = cells.set_index("cell").loc[m["cell"]]
        lines.append(
            f"- {who(r)}: the fullest device peaked at "
            f"{m['imbalance']:.2f}x the memory of the emptiest ({m['peak_mem_mb_max']:.0f} MB vs "
            f"{m['peak_mem_mb_min']:.0f} MB, {workload(r)} at {batch_phrase(r)})."
        )
    return (
        "\n".join(lines) + "\n\nMemory is CUDA's peak allocation per device on GPUs and each process's "
        "peak resident set on CPU (last epoch).\n\n" + memory_spread(tables) + "\n\n" + memory_prediction(tables)
    )


def memory_spread(tables: Tables) -> str:
    """How each strategy spreads one step's memory over its devices (the memory_spread table)."""
    spread = tables["memory_spread"]
    head = (
        "**One training step, split** (PyTorch's memory tracker: parameters, gradients, optimizer state, "
        "activations and temporaries; the figure below shows every setting's split per device). "
    )
    if spread.empty:
        return head + not_measured(
            "no finished multi-device cell has a measured split and a one-device baseline with one"
        )
    lines = [
        f"- {mode_name(r['mode'], r['shard'])} on {plural(whole(r['devices']), 'device')}: the fullest device "
        f"holds {r['state_share']:.2f}x one device's model state and peaks at {r['imbalance']:.2f}x the emptiest "
        f"device (medians of {plural(whole(r['cells']), 'cell')}; e.g. {code(r['example'])}: "
        f"{significant(r['state_mb'])} MB of parameters, gradients and optimizer state vs "
        f"{significant(r['baseline_state_mb'])} MB on one device)."
        for _, r in spread.iterrows()
    ]
    return (
        head + "A replica (DP, DDP) holds the whole model state on every device; FSDP shards it, about 1/n per "
        "device (grad_op keeps the gathered parameters from forward to backward, so its peak holds more).\n\n"
        + "\n".join(lines)
    )


def memory_prediction(tables: Tables) -> str:
    """The memory plan's prediction against the measured split (the memory_accuracy table)."""
    accuracy = tables["memory_accuracy"]
    head = (
        "**Predicted before training** (`results/plan/memory.csv`: each cell's step on fake tensors, no "
        "device needed) **vs measured**: "
    )
    if accuracy.empty:
        return head + not_measured("no finished cell has both a prediction and a measured split")
    overall = accuracy.set_index("mode").loc["all"] if (accuracy["mode"] == "all").any() else accuracy.iloc[0]
    verdict = "within" if overall["within_target"] else "**not** within"
    per_mode = ", ".join(
        f"{text(r['mode'])} {r['median_abs_error_pct']:.1f} % (largest {r['max_abs_error_pct']:.1f} %, "
        f"{plural(whole(r['devices']), 'device')})"
        for _, r in accuracy[accuracy["mode"] != "all"].iterrows()
    )
    return (
        head + f"the peak per device was off by a median of {overall['median_abs_error_pct']:.1f} % and at most "
        f"{overall['max_abs_error_pct']:.1f} % over {plural(whole(overall['devices']), 'device')}, {verdict} the "
        f"{overall['target_pct']:.0f} % target. By mode: {per_mode}. `results/tables/memory_split.csv` has every "
        "device's parts, measured and predicted."
    )


def utilisation(tables: Tables) -> str:
    """Mean GPU utilisation per cell and GPU (the util_means table)."""
    means, cells = tables["util_means"], tables["cells"]
    if means.empty:
        ran_on = ", ".join(text(d) for d in sorted(cells["env_device"].dropna().unique())) or "unknown"
        return not_measured(f"GPU utilisation was not sampled (the cells ran on {ran_on})")
    lines = [
        f"- {code(cell)}: "
        + ", ".join(f"GPU {text(whole(d))} {v:.0f} %" for d, v in zip(per["device"], per["gpu_util"]))
        + " busy on average."
        for cell, per in means.groupby("cell", sort=True)
    ]
    more = len(lines) - LIST_LIMIT
    return "\n".join(lines[:LIST_LIMIT]) + (
        f"\n- ... {plural(more, 'more cell')} in `results/tables/util.csv`." if more > 0 else ""
    )


# ---- Microbenchmarks --------------------------------------------------------------------------


def kernels(table: pd.DataFrame | None) -> str:
    from dpstudy.report.text import kernels_table

    if table is None or table.empty:
        return not_measured(
            "custom kernels vs a Python loop vs PyTorch's ops (no kernel benchmark results, kernels.csv)"
        )
    compact, skipped = kernels_table(table)
    return (
        markdown_table(compact) + "\n\nMedian time per call; loops run on a part of the input and are scaled "
        "to the whole." + "".join(f"\n- {line}" for line in skipped)
    )


def comm(table: pd.DataFrame | None) -> str:
    from dpstudy.report.text import comm_table

    if table is None or table.empty:
        return not_measured("the all-reduce bandwidth (no comm benchmark results, comm.csv)")
    compact, skipped = comm_table(table)
    text = markdown_table(compact) if not compact.empty else not_measured("no backend could run here")
    return (
        text + "\n\nAll-reduce bus bandwidth as nccl-tests defines it (algorithm bandwidth x 2(n-1)/n), median "
        "over iterations, slowest rank. The figure adds FSDP's collectives, all-gather and reduce-scatter "
        "(bus bandwidth = algorithm bandwidth x (n-1)/n, of the total size)."
        + "".join(f"\n- {line}" for line in skipped)
    )
