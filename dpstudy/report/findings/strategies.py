"""Which strategy: per workload the fastest strategy that fits, its lead over the next, the ranking
with memory per device, the strategies that did not run, and the step model's account; then each
strategy at the largest batch that fits (findings.largest_batch)."""

from __future__ import annotations

import re

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.keys import WORKLOAD_KEYS
from dpstudy.analysis.strategies import ranked
from dpstudy.report.findings.largest_batch import at_largest_batch
from dpstudy.report.findings.phrases import (
    LIST_LIMIT,
    Tables,
    by_setting,
    dataset_model,
    extra_keys,
    not_measured,
    or_na,
    strategy_label,
    table_csv,
    varied,
    whole,
    why_not_run,
    work_columns,
)
from dpstudy.report.text import markdown_table, more_in, significant, text

STRATEGIES_INTRO = (
    "Every strategy the study ran for the same data, model and global batch, ranked by throughput "
    "(the geometric mean of its repeats, 95 % interval), with the memory its fullest device needed for "
    "one training step (PyTorch's tracker; the memory plan's prediction beside it) and the step model's "
    "account: each multi-device strategy's throughput forecast from the study's other settings, never "
    "from its own cells (none where nothing else calibrates it), one device's its own. A strategy that "
    "does not fit (out of memory, or predicted above the study's `memory_budget_gib`) did not run, so the "
    "fastest that ran is the fastest that fits. "
    '"vs one device" is the throughput over one device without torch.compile.'
)


def workload_label(row, keys: list[str]) -> str:
    """'synthetic_rgb/resnet18 at global batch 64, precision bf16': the workload keys the study varies."""
    named = [k for k in keys if k in WORKLOAD_KEYS and k not in ("dataset", "model", "global_batch", "devices")]
    return f"{dataset_model(row)} at global batch {whole(row['global_batch'])}{extra_keys(row, named)}"


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
        return (
            "The step model has too few of these strategies to rank (a multi-device strategy needs other "
            "settings of its group to be forecast from, and a finished one-device baseline)."
        )
    order = ", ".join(strategy_label(r, keys) for _, r in predicted.sort_values("model_rank").iterrows())
    if bool(rows["model_agrees"].iloc[0]):
        head = f"The step model orders them as measured, up to ties within noise: {order}."
    else:
        wrong = [
            f"{strategy_label(r, keys)} beat {strategy_label(settings.loc[int(other)], keys)} beyond noise"
            for _, r in predicted.iterrows()
            if isinstance(r["model_misorders"], str)
            for other in r["model_misorders"].split()
        ]
        head = f"The step model orders them {order}, which the measurements contradict: {'; '.join(wrong)}."
    losses = [
        f"{strategy_label(r, keys)}: {text(r['largest'])}, {significant(r['largest_s'] * 1e3)} ms per step"
        for _, r in rows.iterrows()
        if isinstance(r["largest"], str)
    ]
    return head + (" Largest loss against n x: " + "; ".join(losses) + "." if losses else "")


def perplexity_column(rows: pd.DataFrame) -> dict[str, list[str]]:
    """A text workload's test perplexity: exp of the repeats' mean test loss."""
    if "perplexity" not in rows or rows["perplexity"].isna().all():
        return {}
    return {"test perplexity": [or_na(significant)(v) for v in rows["perplexity"]]}


def strategy_table(rows: pd.DataFrame, keys: list[str]) -> str:
    table = pd.DataFrame(
        {
            "rank": rows["rank"].map(or_na(lambda v: str(whole(v)))),
            "strategy": [strategy_label(r, keys) for _, r in rows.iterrows()],
            "samples/s [95 %]": [
                stats.interval_text(stats.value(r, "samples_per_s"), significant) for _, r in rows.iterrows()
            ],
            **work_columns(rows),
            **perplexity_column(rows),
            "vs one device": [
                "n/a" if pd.isna(r["vs_one_device"]) else stats.interval_text(stats.value(r, "vs_one_device"), unit="x")
                for _, r in rows.iterrows()
            ],
            "MB per device: measured (predicted)": [
                f"{or_na(significant)(m)} ({or_na(significant)(p)})"
                for m, p in zip(rows["memory_mb"], rows["predicted_memory_mb"])
            ],
            "step model, held out: samples/s (rank)": [
                "n/a" if pd.isna(v) else f"{significant(v)} ({whole(k)})"
                for v, k in zip(rows["predicted_samples_per_s"], rows["model_rank"])
            ],
        }
    )
    return markdown_table(table, escape=False)


def forecast_note(row, strategies: int, keys) -> str:
    """ "- forecast, not run: FSDP full (gloo) on 8 devices: 1,230 samples/s (95 % ...), would rank 4
    of 5 (from ...)", `strategies` the workload's ranked ones, measured or forecast"""
    throughput = stats.interval_text(stats.value(row, "samples_per_s"), significant, " samples/s")
    place = f"would rank {whole(row['rank_with_forecasts'])} of {strategies}"
    return f"- forecast, not run: {strategy_label(row, keys)}: {throughput}, {place} ({text(row['reason'])})"


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
    workloads = sorted(ran["workload_id"].unique())
    for number in workloads[:LIST_LIMIT]:
        rows, every = ranked(table, number), table[table["workload_id"] == number]
        learners = rows[rows["fastest"].astype(bool)]  # the best ranked that learned (strategies.rank)
        best = learners.iloc[0] if not learners.empty else rows.iloc[0]
        after = rows[rows["rank"] > best["rank"]]
        runner_up = after.iloc[0] if not after.empty else None
        title = "fastest that fits" if not learners.empty else "no strategy learned; the fastest that ran"
        fastest = (
            f"**{workload_label(best, keys)}**: {title}: **{strategy_label(best, keys)}**, "
            f"{stats.interval_text(stats.value(best, 'samples_per_s'), significant, ' samples/s')}"
            + (
                f", {stats.interval_text(stats.value(best, 'vs_one_device'), unit='x')} one device"
                if pd.notna(best["vs_one_device"])
                else ""
            )
            + f"; {lead_text(best, runner_up, keys)}."
        )
        forecast = every["forecast"].astype(bool) if "forecast" in every else pd.Series(False, index=every.index)
        unfit = every[every["fits"].eq(False)]
        other = every[every["rank"].isna() & ~every["fits"].eq(False) & ~forecast]
        notes = [f"- does not fit: {strategy_label(r, keys)}: {text(r['reason'])}" for _, r in unfit.iterrows()] + [
            f"- did not run: {strategy_label(r, keys)}: {text(r['status'])}, {text(r['reason'])}"
            for _, r in other.iterrows()
        ]
        notes += [
            f"- did not learn, so no candidate however fast: {strategy_label(r, keys)} (see Cells that did not learn)"
            for _, r in rows[rows["learned"].eq(False)].iterrows()
        ]
        placed = int(every["rank_with_forecasts"].notna().sum()) if "rank_with_forecasts" in every else 0
        notes += [forecast_note(r, placed, keys) for _, r in every[forecast].iterrows()]
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
    tail = "\n\n" + more_in(more, table_csv("strategies"), "workload") if more > 0 else ""
    largest = at_largest_batch(tables)  # each strategy at the largest batch that fits
    tail += f"\n\n{largest}" if largest else ""
    return STRATEGIES_INTRO + mfu_basis(tables["cells"]) + "\n\n" + "\n\n".join(sections) + tail


def mfu_basis(cells: pd.DataFrame) -> str:
    """What the MFU column divides by (dpstudy.analysis.utilisation): a GPU's datasheet, a CPU's
    measured matmul rate, or why no cell has one."""
    if "mfu" not in cells:
        return ""
    ran = cells[cells["samples_per_s"].notna()]
    with_mfu = ran[ran["mfu"].notna()]
    if with_mfu.empty:
        reasons = ran["mfu_reason"].dropna().unique()
        return f" No MFU: {text(reasons[0])}." if len(reasons) else ""
    # a CPU's peak is per core times each cell's cores: say the rate once
    sources = sorted(
        {re.sub(r" x [0-9.]+ cores$", ", times the cores the cell ran on", s) for s in with_mfu["peak_source"].dropna()}
    )
    basis = "; ".join(text(s) for s in sources[:3])
    return f" MFU is the model's FLOPs per second over the peak of every device of the cell: {basis}."
