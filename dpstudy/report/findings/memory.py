"""Memory per device: the spread between the fullest and the emptiest device per mode, one training
step's split across devices, and the memory plan's prediction against it."""

from __future__ import annotations

import pandas as pd

from dpstudy.report.findings.phrases import (
    Tables,
    batch_phrase,
    dataset_model,
    mode_name,
    not_measured,
    who,
    whole,
    why_not_run,
)
from dpstudy.report.text import code, plural, significant, text
from dpstudy.study import modes


def memory(tables: Tables) -> str:
    """Peak memory per rank: the spread between the fullest and the emptiest device, per mode (the
    memory table's cell with the largest imbalance); then one training step's split as PyTorch's
    tracker measured it (memory_spread) and the memory plan's prediction beside it (memory_accuracy)."""
    cells, imbalances = tables["cells"], tables["memory"]
    multi = cells[cells["devices"] > 1]
    lines = []
    for mode in modes.TABLE:  # every mode the study ran on several devices, in the table's order
        rows, asked = imbalances[imbalances["mode"] == mode], multi[multi["mode"] == mode]
        if rows.empty:
            if not asked.empty:
                label = modes.TABLE[mode].label
                lines.append(f"- {label}: {not_measured(why_not_run(asked, label))}")
            continue
        m = rows[rows["largest"].astype(bool)].iloc[0]
        r = cells.set_index("cell").loc[m["cell"]]
        lines.append(
            f"- {who(r)}: the fullest device peaked at "
            f"{m['imbalance']:.2f}x the memory of the emptiest ({m['peak_mem_mb_max']:.0f} MB vs "
            f"{m['peak_mem_mb_min']:.0f} MB, {dataset_model(r)} at {batch_phrase(r)})."
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


AGAINST = {
    "allocator": "against what the CUDA allocator held (`max_memory_allocated` of the same step)",
    "tracker": (
        "against the tracker's own measurement of the step (no allocator peak exists on a CPU: this checks "
        "the fake step against the real one, not against what the process held)"
    ),
}


def resident_growth(row) -> str:
    """ " Over the same step the process's resident memory grew by a median 41.2 MB, beside the 30.1 MB
    of activations the tracker counted." ("" where it was not measured)."""
    if pd.isna(row.get("rss_growth_mb")):
        return ""
    return (
        f" Over the same step the process's resident memory grew by a median {significant(row['rss_growth_mb'])} MB, "
        f"beside the {significant(row['activations_mb'])} MB of activations the tracker counted (the first is "
        "pages the process newly touched: memory its allocator already held from earlier steps does not "
        "grow it, and its libraries' buffers do)."
    )


def workspaces(split: pd.DataFrame | None) -> str:
    """ " The plan's allocator peak includes the libraries' workspaces (cuBLAS's and cuDNN's), measured
    on the planning host's GPU: a median +68.6 MB and at most +160 MB over 8 devices." (or that
    they were left out)."""
    if split is None or "against" not in split:
        return ""
    checked = split[split["against"] == "allocator"]
    measured = checked.get("predicted_workspace_mb", pd.Series(dtype=float)).dropna()
    if measured.empty:
        return (
            " The plan ran without a GPU: its allocator peak leaves out the libraries' workspaces (cuBLAS "
            "keeps its own for the process, cuDNN takes one per convolution, by shape); run the plan on a "
            "host with the cells' kind of GPU to include them."
        )
    return (
        f" The plan's allocator peak includes the libraries' workspaces (cuBLAS's and cuDNN's), measured on the "
        f"planning host's GPU: a median "
        f"+{significant(measured.median())} MB and at most +{significant(measured.max())} MB over "
        f"{plural(len(measured), 'device')}."
    )


def memory_prediction(tables: Tables) -> str:
    """The memory plan's prediction against the measured step (the memory_accuracy table), one
    sentence per kind of comparison: the allocator's peak (CUDA cells), else the tracker's."""
    accuracy = tables["memory_accuracy"]
    head = (
        "**Predicted before training** (`results/plan/memory.csv`: each cell's step on fake tensors, no "
        "device needed) **vs measured**: "
    )
    if accuracy.empty:
        return head + not_measured("no finished cell has both a prediction and a measured split")
    if "against" not in accuracy:  # tables collected before the allocator was compared
        accuracy = accuracy.assign(against="tracker")
    sentences = []
    for against, kind in accuracy.groupby("against", sort=True):
        overall = kind.set_index("mode").loc["all"] if (kind["mode"] == "all").any() else kind.iloc[0]
        verdict = "within" if overall["within_target"] else "**not** within"
        per_mode = ", ".join(
            f"{text(r['mode'])} {r['median_abs_error_pct']:.1f} % (largest {r['max_abs_error_pct']:.1f} %, "
            f"{plural(whole(r['devices']), 'device')})"
            for _, r in kind[kind["mode"] != "all"].iterrows()
        )
        sentences.append(
            f"{AGAINST.get(against, against)}, the peak per device was off by a median of "
            f"{overall['median_abs_error_pct']:.1f} % and at most {overall['max_abs_error_pct']:.1f} % over "
            f"{plural(whole(overall['devices']), 'device')}, {verdict} the {overall['target_pct']:.0f} % target. "
            f"By mode: {per_mode}.{resident_growth(overall)}"
            + (workspaces(tables.get("memory_split")) if against == "allocator" else "")
        )
    return (
        head
        + " ".join(s[0].upper() + s[1:] for s in sentences)
        + " `results/tables/memory_split.csv` has every device's parts, measured and predicted."
    )
