"""When does DP or DDP beat one device, and by how much: each multi-device setting's speedup with its
interval and verdict, and one node against several."""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.summary import VERDICT_COLUMNS, finished
from dpstudy.report.findings.phrases import (
    LIST_LIMIT,
    Tables,
    batch_phrase,
    by_setting,
    dataset_model,
    extra_keys,
    listed,
    not_measured,
    percent,
    setting_name,
    study,
    varied,
    whole,
    why_not_run,
)
from dpstudy.report.text import plural


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


SPEEDUP_DEFINITION = (
    "A setting's speedup is the geometric mean of its repeats' throughput (samples/s in the steady "
    "window) over that of its single-device baseline (the same settings on one device), with a 95 % "
    f"interval from a {stats.METHOD} (chosen because it holds its coverage at 3 repeats; see docs/report.md). "
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
    totals = study(tables)
    counted = {
        words: whole(totals[VERDICT_COLUMNS[v]]) for v, words in VERDICT_TEXT.items() if totals[VERDICT_COLUMNS[v]]
    }
    summary = (
        ", ".join(f"{n} {v}" for v, n in sorted(counted.items())) + ", judged by the 95 % intervals and the noise"
        if counted
        else "no interval to decide on (run the study with `repeats` > 1)"
    )
    settings_count = plural(whole(totals["multi_settings"]), "multi-device setting")
    lines.append(f"\nOf {settings_count}: {summary}. Ideal: n devices n times as fast (100 % efficiency).")
    return SPEEDUP_DEFINITION + "\n\n" + "\n".join(lines) + "\n\n" + across_nodes(tables, keys)


def across_nodes(tables: Tables, named: list[str] = ()) -> str:
    """Intra- vs inter-node scaling: DDP at equal world size on one node and on several (the
    comparisons of kind "nodes": the multi-node setting, the one-node one, the throughput ratio)."""
    comparisons, settings = tables["comparisons"], by_setting(tables)
    pairs = []
    for _, pair in comparisons[comparisons["kind"] == "nodes"].iterrows():
        far, near = settings.loc[pair["setting"]], settings.loc[pair["other"]]
        pairs.append(
            f"- {dataset_model(far)} at {batch_phrase(far)}{extra_keys(far, named)}: "
            f"{plural(far['devices'], 'device')} on one node reached {near['efficiency'] * 100:.0f} % "
            f"efficiency, spread over {far['nodes']} nodes {far['efficiency'] * 100:.0f} % "
            f"({pair['value']:.2f}x the one-node throughput)."
        )
    if pairs:
        return "Intra- vs inter-node scaling (same world size):\n" + "\n".join(pairs[:LIST_LIMIT]) + "\n"
    rows = tables["settings"]
    ddp = rows[(rows["devices"] > 1) & rows["speedup"].notna()]
    if (ddp["nodes"] > 1).any():
        return (
            "Inter-node scaling: the multi-node cells have no one-node cell of the same world size to compare with.\n"
        )
    return ""
