"""Why not n times: the step model's breakdown (dpstudy.analysis.scaling) of each setting's measured step
beside the ideal, the losses that keep it from n x, and what the model does not explain."""

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
from dpstudy.report.text import markdown_table
from dpstudy.report.text import milliseconds as ms

MODEL_INTRO = (
    "The step model (the same one that makes the forecasts below) splits each multi-device step, in "
    "milliseconds, into one device's step at the per-device batch, the slow-down of ranks sharing a host, "
    "what the strategy adds to every step (DDP's hooks and copies, FSDP's unshard and reshard), the "
    "collectives the step left exposed (measured: on a CPU by the probe, steps with them minus steps without, "
    "as the profiler perturbs a CPU step it traces; on a GPU by the cell's profiler trace), waiting for data "
    "and DP's transfers. Host share and fixed "
    "cost are calibrated on the study's settings of the same strategy and device count; what they leave of "
    "the measured step is the residual, never spread over the parts. Against the ideal step (one device's "
    "divided by n) the losses add up to the measured step: per-device compute beyond 1/n (fixed costs every "
    "rank pays), the host's share, the strategy's fixed cost, the exposed collectives, extra data wait, DP's "
    "transfers and the residual."
)


def loss_text(value: float, noise: float) -> str:
    """A loss in milliseconds; a negative one says whether it is within the noise (then it is noise)."""
    if pd.isna(value):
        return "n/a"
    if value >= 0:
        return ms(value)
    if pd.isna(noise):
        return f"{ms(value)} (noise unknown: one run)"
    return f"{ms(value)} ({'noise' if -value <= noise else 'gain beyond noise'})"


NEGATIVE_NOTE = (
    "A negative term means that part took less than its ideal share. Where it is smaller than "
    "the step's noise (the standard deviation of the measured step over repeats, baseline's "
    "share included: the `noise ms` column) it is measurement noise, not a gain, and is marked "
    "(noise); one that is larger is marked (gain beyond noise): e.g. smaller per-device steps that "
    "fit a cache better. Without repeats the noise is unknown."
)


def why_not_n(tables: Tables) -> str:
    """Predicted vs measured speedup per setting, and the largest term that keeps it from n x (the
    scaling_settings table: dpstudy.analysis.scaling.settings_model)."""
    model = tables["scaling_settings"]
    if model.empty:
        return not_measured("the step model needs a finished multi-device cell and its finished single-device baseline")
    keys = varied(tables)

    def measured(r) -> str:
        return stats.interval_text(stats.value(r, "measured_speedup"), unit="x")

    def predicted(r) -> str:
        return "n/a" if pd.isna(r["predicted_speedup"]) else f"{r['predicted_speedup']:.2f}x"

    def line(r) -> str:
        return (
            f"- {setting_name(r, keys)}: measured {measured(r)}, step model {predicted(r)} of an "
            f"ideal {r['devices']}x. Largest loss: **{r['largest']}** ({ms(r['largest_s'])} ms of a "
            f"{ms(r['step_s'])} ms step whose ideal is {ms(r['ideal_s'])} ms)."
        )

    lines = [MODEL_INTRO, "", *listed(model, line, "measured_speedup")]
    shown = (
        model
        if len(model) <= LIST_LIMIT
        else model.sort_values("measured_speedup").iloc[
            list(range(LIST_LIMIT // 2)) + list(range(-(LIST_LIMIT // 2), 0))
        ]
    )
    noise = shown["noise_s"]

    def losses(column: str) -> list[str]:
        return [loss_text(v, n) for v, n in zip(shown[column], noise, strict=True)]

    table = pd.DataFrame(
        {
            "setting": [setting_name(r, keys) for _, r in shown.iterrows()],
            "measured": [measured(r) for _, r in shown.iterrows()],
            "step model": shown["predicted_speedup"].map(or_na("{:.2f}x".format)),
            "step ms (ideal)": [f"{ms(m)} ({ms(i)})" for m, i in zip(shown["step_s"], shown["ideal_s"], strict=True)],
            "noise ms": noise.map(ms),
            "per-device compute ms": losses("loss_compute_s"),
            "host share ms": losses("loss_sharing_s"),
            "fixed cost ms": losses("loss_fixed_s"),
            "collectives ms: alone (exposed; traced)": [
                f"{ms(a)} ({loss_text(e, n)}; {ms(t)})"
                for a, e, n, t in zip(
                    shown["comm_s"], shown["loss_exposed_s"], noise, shown["traced_exposed_s"], strict=True
                )
            ],
            "hidden by the step": shown["overlap"].map(or_na(percent)),
            "extra data wait ms": losses("loss_data_s"),
            "DP transfers ms": losses("loss_dp_s"),
            "residual ms": losses("residual_s"),
        }
    )
    exposed = ", ".join(sorted(model["exposed_source"].dropna().unique()))
    return (
        "\n".join(lines)
        + "\n\n"
        + markdown_table(table, escape=False)
        + "\n\n"
        + NEGATIVE_NOTE
        + (
            "\n\nMeasured: the setting's speedup with its 95 % interval (as above). Collectives alone: the "
            "strategy's all-reduce, or FSDP's all-gathers and reduce-scatter, per bucket or unit by their comm_bench "
            "fits (n/a without comm_bench, and for DP and HSDP); hidden by the step: 1 - exposed / alone, below 0 "
            f"where they ran slower beside compute than alone. Exposed collectives from: {exposed} (trace: the time "
            "a collective was in flight while the step neither computed nor waited for data; probe: the step with "
            "them minus without); traced: the cell's trace's, beside them (n/a: not traced)."
        )
    )
