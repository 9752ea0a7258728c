"""The step as its trace measured it: per multi-device setting, the pace-setting rank's traced step
split into compute, exposed communication, data wait and idle time (dpstudy.engine.trace_figures,
the cells table's trace_* columns), the probe's exposed communication beside it, the step model's
breakdown of the timed step (dpstudy.analysis.scaling, the scaling_settings table) and how far the
traced step is from it, and links to the traces, which Perfetto (ui.perfetto.dev) and TensorBoard open."""

from __future__ import annotations

import posixpath

import pandas as pd

from dpstudy.analysis.baseline import baseline_key
from dpstudy.analysis.keys import SETTING_KEYS
from dpstudy.report.findings.phrases import LIST_LIMIT, Tables, not_measured, or_na, percent, setting_name, varied
from dpstudy.report.text import markdown_table, more_in
from dpstudy.report.text import milliseconds as ms
from dpstudy.study.outputs import REPORT_DIR, RESULTS

INTRO = (
    "After its timed epochs every multi-device cell records a few training steps with torch.profiler on every "
    "rank, and each rank reduces its own trace in the job. A step is split into waiting for data, computing "
    "(a GPU's kernels; a CPU's training thread in its operators), communication on the critical path (a "
    "collective in flight, issued and not finished, while the step neither computed nor waited for data) "
    "and the rest, idle (the host "
    "between operators, waits with no collective in flight); the four add up to the traced step. Shown is the "
    "rank that computed longest, which every collective waits for; milliseconds per step, the median over "
    "the setting's repeats. Beside it, the probe's exposed communication: the step with its collectives "
    "minus the same step without them, which also counts what running the collectives beside compute costs "
    "it (on a CPU, Gloo's threads share the cores). Then the step model's breakdown of the timed step (see "
    "\"Why not n times\"): its compute (one device's step, the host's share and the strategy's fixed cost), "
    'the exposed communication it read and the waiting for data; "trace vs model" is how much longer the '
    "traced step ran than the model's, the profiler's own cost included."
)
CSV = "results/tables/cells.csv"


def links(files) -> str:
    """The ranks' traces (trace_files: relative to the results folder) as links from the report's."""
    if not isinstance(files, str) or not files:
        return "not kept"
    paths = [posixpath.relpath(f"{RESULTS}/{path}", REPORT_DIR) for path in files.split("; ")]
    return " ".join(f"[rank {i}]({path})" for i, path in enumerate(paths))


MODEL_PARTS = ("t1_s", "sharing_s", "fixed_s", "transfers_s", "exposed_s", "data_s", "predicted_s")


def with_model(settings: pd.DataFrame, model: pd.DataFrame | None, keys: list[str]) -> pd.DataFrame:
    """`settings` with the step model's parts of each (the scaling_settings table; NaN without one)."""
    if model is None or model.empty:
        return settings.assign(**dict.fromkeys(MODEL_PARTS, float("nan")))
    found = {baseline_key(r[k] for k in keys): r for r in model.to_dict("records")}
    rows = [found.get(baseline_key(r[k] for k in keys), {}) for r in settings.to_dict("records")]
    return settings.assign(**{part: [row.get(part, float("nan")) for row in rows] for part in MODEL_PARTS})


def model_text(r) -> str:
    """The model's compute (t1, host share, fixed cost, DP's transfers) + exposed + data, in ms."""
    if pd.isna(r["predicted_s"]):
        return "n/a"
    compute = sum(r[k] for k in ("t1_s", "sharing_s", "fixed_s", "transfers_s") if pd.notna(r[k]))
    return f"{ms(compute)} + {ms(r['exposed_s'])} + {ms(r['data_s'])} = {ms(r['predicted_s'])}"


def signed_percent(value: float) -> str:
    return f"{value * 100:+.0f} %"


def traces(tables: Tables) -> str:
    cells = tables["cells"]
    traced = cells[(cells["status"] == "ok") & cells["trace_step_s"].notna()] if "trace_step_s" in cells else cells[:0]
    if traced.empty:
        return not_measured("no cell was traced (trace_steps: multi-device cells trace 8 steps unless it is 0)")
    keys = [k for k in SETTING_KEYS if k in traced]
    parts = ["trace_step_s", "trace_compute_s", "trace_exposed_comm_s", "exposed_s", "trace_data_wait_s"]
    parts += ["trace_idle_s", "trace_overlap"]
    grouped = traced.groupby(keys, dropna=False, sort=True)
    settings = grouped[parts].median().join(grouped[["trace_files", "trace_reason"]].first()).reset_index()
    settings = with_model(settings, tables.get("scaling_settings"), keys)
    shown = settings.head(LIST_LIMIT)
    named = varied(tables)
    table = pd.DataFrame(
        {
            "setting": [setting_name(r, named) for _, r in shown.iterrows()],
            "traced step ms": shown["trace_step_s"].map(ms),
            "compute ms": shown["trace_compute_s"].map(ms),
            "exposed comm ms: trace (probe)": [
                f"{ms(t)} ({ms(p)})" for t, p in zip(shown["trace_exposed_comm_s"], shown["exposed_s"])
            ],
            "data wait ms": shown["trace_data_wait_s"].map(ms),
            "idle ms": shown["trace_idle_s"].map(ms),
            "hidden by compute": shown["trace_overlap"].map(or_na(percent)),
            "step model ms: compute + exposed + data": [model_text(r) for _, r in shown.iterrows()],
            "trace vs model": (shown["trace_step_s"] / shown["predicted_s"] - 1).map(or_na(signed_percent)),
            "traces": shown["trace_files"].map(links),
        }
    )
    lines = [INTRO, "", markdown_table(table, escape=False)]
    if len(settings) > len(shown):
        lines += ["", more_in(len(settings) - len(shown), CSV, "settings")]
    reasons = sorted(settings["trace_reason"].dropna().unique())
    if reasons:
        lines += ["", "Traces not kept or not reduced: " + "; ".join(reasons) + "."]
    return "\n".join(lines)
