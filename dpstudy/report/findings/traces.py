"""The step as its trace measured it: per multi-device setting, the pace-setting rank's traced step
split into compute, exposed communication, data wait and idle time (dpstudy.engine.trace_figures,
the cells table's trace_* columns), the probe's exposed communication beside it, and links to the
traces, which Perfetto (ui.perfetto.dev) and TensorBoard open."""

from __future__ import annotations

import posixpath

import pandas as pd

from dpstudy.analysis.keys import SETTING_KEYS
from dpstudy.report.findings.phrases import LIST_LIMIT, Tables, not_measured, or_na, percent, setting_name, varied
from dpstudy.report.text import markdown_table, more_in, significant
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
    "it (on a CPU, Gloo's threads share the cores)."
)
CSV = "results/tables/cells.csv"


def ms(value) -> str:
    return or_na(lambda v: significant(v * 1e3))(value)


def links(files) -> str:
    """The ranks' traces (trace_files: relative to the results folder) as links from the report's."""
    if not isinstance(files, str) or not files:
        return "not kept"
    paths = [posixpath.relpath(f"{RESULTS}/{path}", REPORT_DIR) for path in files.split("; ")]
    return " ".join(f"[rank {i}]({path})" for i, path in enumerate(paths))


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
