"""Why not n times: the scaling model's predicted speedup of each setting beside the measured one,
and the losses that keep it from n x."""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.report.findings.phrases import (
    LIST_LIMIT,
    Tables,
    listed,
    not_measured,
    or_na,
    percent,
    setting_name,
    varied,
)
from dpstudy.report.text import markdown_table, significant

MODEL_INTRO = (
    "The scaling model rebuilds each multi-device epoch from parts measured elsewhere: the single-device "
    "cell's compute split n ways, the cell's own waiting for data, the collectives that keep the "
    "ranks in step (DDP's gradient all-reduce; FSDP's parameter all-gathers, twice with full "
    "sharding, and gradient reduce-scatter) from comm_bench's bus bandwidths minus what the step hid "
    "(the probe: DDP's step under `no_sync`, FSDP's step on an unsharded replica), and DP's "
    "scatter, replicate and gather. Against the ideal epoch (one device's divided by n), the "
    "measured losses add up to the measured epoch: extra data wait, the collectives the step left "
    "exposed (read from the cell's profiler trace where it has one, else its steps with them minus steps "
    "without), DP's transfers, per-device compute beyond 1/n "
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
            f"- {setting_name(r, keys)}: measured {measured(r)}, scaling model {predicted(r)} of an "
            f"ideal {r['devices']}x. Largest loss: **{r['largest']}** ({significant(r['largest_s'])} s of a "
            f"{significant(r['measured_s'])} s epoch whose ideal is {significant(r['ideal_s'])} s)."
        )

    lines = [MODEL_INTRO, "", *listed(model, line, "measured_speedup")]
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
            "scaling model": shown["predicted_speedup"].map(or_na("{:.2f}x".format)),
            "epoch s (ideal)": [
                f"{significant(m)} ({significant(i)})" for m, i in zip(shown["measured_s"], shown["ideal_s"])
            ],
            "noise s": shown["noise_s"].map(or_na(significant)),
            "extra data wait s": [loss_text(v, n) for v, n in zip(shown["loss_data_s"], shown["noise_s"])],
            "collectives s: model (exposed)": [
                f"{or_na(significant)(a)} ({loss_text(e, n)})"
                for a, e, n in zip(shown["sync_s"], shown["loss_sync_s"], shown["noise_s"])
            ],
            "hidden by the step": shown["overlap"].map(or_na(percent)),
            "DP transfers s": [loss_text(v, n) for v, n in zip(shown["loss_dp_s"], shown["noise_s"])],
            "per-device compute s": [loss_text(v, n) for v, n in zip(shown["loss_compute_s"], shown["noise_s"])],
            "rest s": [loss_text(v, n) for v, n in zip(shown["loss_other_s"], shown["noise_s"])],
        }
    )
    sources = ", ".join(sorted(model["sync_source"].dropna().unique()))
    exposed = ", ".join(sorted(model["exposed_source"].dropna().unique()))
    return (
        "\n".join(lines)
        + "\n\n"
        + markdown_table(table, escape=False)
        + "\n\n"
        + NEGATIVE_NOTE
        + (
            f"\n\nMeasured: the setting's speedup with its 95 % interval (as above). Collective times from: {sources} "
            "(comm_bench: its bus bandwidth at the gradients' or a unit's size; probe: the cell's own collectives "
            "timed alone). Exposed collectives from: "
            f"{exposed} (trace: the time a collective was in flight while the step neither computed nor waited "
            "for data; probe: the step with them minus without)."
        )
    )
