"""How steady the numbers are: the single-device throughput's CV over repeats, set against this
machine's floor (a reference workload run beside the repeats, dpstudy.analysis.floor), and the
runs that shared the machine with other processes."""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.floor import HIGH_FLOOR, NEAR_FLOOR, STEADY_CV
from dpstudy.report.findings.phrases import (
    SETTINGS_CSV,
    Tables,
    clipped,
    not_measured,
    percent,
    setting_name,
    study,
    varied,
    whole,
)
from dpstudy.report.text import plural, significant
from dpstudy.study import modes

# What each floor_verdict (dpstudy.analysis.floor.noise_verdict) tells the reader to do.
FLOOR_ADVICE = {
    "at the floor": (
        f"within {NEAR_FLOOR:g}x of it: the cells vary about as much as the machine itself, and no "
        "tool could measure them more steadily here."
    ),
    "above the floor": (
        f"**more than {NEAR_FLOOR:g}x the floor**: the cells add noise of their own. Look at their "
        "runtime: the allocator (the study's `allocator`), threads, other processes (below), "
        "steady windows too short to average over."
    ),
    "below the floor": (
        "**below it**: the reference workload varied more than the cells did, so on this machine the "
        "floor bounds nothing; its three rates (tables/floor.csv) show which part moved, and the cells' "
        "CV stands on its own."
    ),
    "high floor": (
        f"**on a high floor** ({percent(HIGH_FLOOR, 1)} or more): this machine varies that much "
        "on a fixed workload (a shared host, a VM whose CPUs drift), and no tool can do better here."
    ),
}


def busy_text(tables: Tables) -> str:
    """Which runs shared the machine with other processes: the first suspect for their noise."""
    totals = study(tables)
    if pd.isna(totals["other_load_max"]):
        return ""
    if not totals["busy_cells"]:
        return (
            f" No run shared the machine: other processes used at most {totals['other_load_max']:.2f} cores "
            "while a cell trained."
        )
    return (
        f" **{plural(whole(totals['busy_cells']), 'run')} of {whole(totals['finished_cells'])} shared the "
        f"machine** with other processes (more than {totals['busy_cores']} cores on average while training, up "
        f"to {totals['busy_other_load_max']:.2f}): their throughput is lower and noisier than a quiet machine's; "
        "run the study alone for numbers to publish."
    )


def dispatch_part(totals) -> str:
    """', tiny operators 1.2 %' where the floor's runs timed dispatch (runs made before it did not)."""
    value = totals.get("floor_dispatch_cv", float("nan"))
    return "" if pd.isna(value) else f", tiny operators {percent(value, 1)}"


def floor_text(tables: Tables) -> str:
    """The machine's floor and the verdict on the noise against it, or why there is none."""
    totals = study(tables)
    if pd.isna(totals["floor_cv"]):
        runs = whole(totals["floor_runs"])
        why = f"{plural(runs, 'run')} of it" if runs else "not measured (`bench.floor`, two or more repeats)"
        return f" This machine's floor: {why}, too few for a CV."
    text = (
        f" This machine's floor is {percent(totals['floor_cv'], 1)}: the CV of a reference workload run beside "
        f"each of the {whole(totals['floor_runs'])} repeat rounds (matmuls {percent(totals['floor_compute_cv'], 1)}, "
        f"memory copies {percent(totals['floor_memory_cv'], 1)}{dispatch_part(totals)}; tables/floor.csv)."
    )
    verdict = totals["floor_verdict"]
    return text + (f" The largest single-device CV is {FLOOR_ADVICE[verdict]}" if pd.notna(verdict) else "")


def machine_text(tables: Tables) -> str:
    """The machine at the cells' own moments: the gauge each cell runs after every epoch, its CV
    over a setting's repeats beside the setting's noise ("" for records made before it)."""
    totals = study(tables)
    if not totals.get("machine_settings"):
        return ""
    return (
        f" Inside the cells, the same reference workload timed after every epoch moved by a median CV of "
        f"{percent(totals['machine_median_cv'], 1)} between a setting's repeats (largest "
        f"{percent(totals['machine_max_cv'], 1)}): the machine itself at the moments they trained. "
        f"{whole(totals['near_machine'])} of {plural(whole(totals['machine_settings']), 'setting')} (every mode) "
        f"vary by at most {percent(STEADY_CV)} or {NEAR_FLOOR:g}x the machine's own CV over their repeats."
    )


def machine_part(r) -> str:
    """', the machine 2.4 %' for a setting whose cells gauged the machine."""
    return "" if pd.isna(r.get("machine_cv")) else f", the machine {percent(r['machine_cv'], 1)}"


def noise(tables: Tables) -> str:
    """The noise of one device: CV of a single-device setting's throughput over its repeats, and
    the machine's floor beside it."""
    settings, totals = tables["settings"], study(tables)
    if not totals["noise_floor_settings"]:
        return not_measured("the noise of one device needs a single-device setting with more than one repeat")
    singles = settings[(settings["mode"] == modes.BASELINE) & (settings["devices"] == 1) & settings["noise_cv"].notna()]
    keys = varied(tables)
    lines = [
        f"- {setting_name(r, keys)}: CV {percent(r['noise_cv'], 1)} over {r['repeats']} runs{machine_part(r)} "
        f"({stats.interval_text(stats.value(r, 'samples_per_s'), significant, ' samples/s')})"
        for _, r in singles.iterrows()
    ]
    return (
        f"Noise of one device: the single-device throughput varies by a median CV of "
        f"{percent(totals['noise_floor_median_cv'], 1)} between repeats (largest "
        f"{percent(totals['noise_floor_max_cv'], 1)})."
        + floor_text(tables)
        + machine_text(tables)
        + busy_text(tables)
        + "\n\n"
        + "\n".join(clipped(lines, SETTINGS_CSV))
    )
