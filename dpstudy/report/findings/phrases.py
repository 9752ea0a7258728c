"""The words every section shares: names of modes, setups, datasets with their models and settings,
"not measured" and why, and the lists a large study cuts short."""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.report.text import more_in, plural, significant, text
from dpstudy.study import modes
from dpstudy.study.outputs import TABLES_DIR

Tables = dict[str, pd.DataFrame]


def table_csv(name: str) -> str:
    """Where the report's reader finds the whole of a table that a section lists in part."""
    return f"{TABLES_DIR}/{name}.csv"


SETTINGS_CSV = table_csv("settings")


def percent(fraction: float, decimals: int = 0) -> str:
    return f"{fraction * 100:.{decimals}f} %"


def not_measured(why: str) -> str:
    return f"*Not measured in this study:* {why}."


def or_na(form):
    """`form` for a table's cells, with "n/a" where a value is missing."""
    return lambda v: "n/a" if pd.isna(v) else form(v)


def mode_name(mode: str, shard: str | None = None) -> str:
    """DP, DDP, FSDP full, FSDP grad_op: the modes' table's labels (dpstudy.study.modes.display)."""
    return text(modes.display(mode, shard))


def strategy_name(mode: str, backend: str, shard: str | None = None) -> str:
    """DP, DDP (gloo), FSDP full (nccl), FSDP grad_op (gloo): a mode with a process group names its backend."""
    if not modes.TABLE[mode].per_device:
        return mode_name(mode, shard)
    return f"{mode_name(mode, shard)} ({text(backend)})"


def setup_name(mode: str, backend: str, gpus: int, nodes: int = 1, shard: str | None = None) -> str:
    if modes.TABLE[mode].one_device:
        return mode_name(mode)
    where = plural(gpus, "device") if nodes == 1 else f"{nodes} nodes x {plural(gpus, 'device')}"
    return f"{strategy_name(mode, backend, shard)} on {where}"


# Rows are pandas Series (iterrows, .loc) or dicts: read them by key (Series.mode is a method).
def who(row) -> str:
    return setup_name(row["mode"], row["backend"], row["gpus"], row["nodes"], row.get("shard")) + knobs(row)


def knobs(row) -> str:
    """A mode's own settings a row sets (DDP's knobs), as ", bucket_cap_mb 5, static_graph true"; ""
    where none is set."""
    own = [k for m in modes.TABLE.values() for k in m.knobs]
    set_ = [(k, row.get(k)) for k in own if row.get(k) is not None and not pd.isna(row.get(k))]
    return "".join(f", {k} {str(v).lower() if str(v) in ('True', 'False') else f'{float(v):g}'}" for k, v in set_)


def strategy_label(row, keys: list[str]) -> str:
    """'FSDP full (gloo) on 2 devices, compiled': the strategy keys the study varies named."""
    name = setup_name(row["mode"], row["backend"], whole(row["gpus"]), whole(row["nodes"]), row["shard"])
    extras = [f"{k} {value_text(row[k])}" for k in ("batch_scope", "lr_scaling") if k in keys]
    return name + (", compiled" if bool(row["compile"]) else "") + "".join(f", {e}" for e in extras)


def mfu_percent(value: float) -> str:
    return f"{significant(100 * value)} %"


def work_columns(rows: pd.DataFrame) -> dict[str, list[str]]:
    """A text workload's tokens/s (all devices, and per device) and any workload's MFU, each with
    its interval, where known."""
    columns = {}
    for metric, header, form in (
        ("tokens_per_s", "tokens/s [95 %]", significant),
        ("tokens_per_s_per_device", "tokens/s per device [95 %]", significant),
        ("mfu", "MFU [95 %]", mfu_percent),
    ):
        if metric in rows and rows[metric].notna().any():
            columns[header] = [
                "n/a" if pd.isna(r[metric]) else stats.interval_text(stats.value(r, metric), form)
                for _, r in rows.iterrows()
            ]
    return columns


def batch_phrase(row) -> str:
    per_device = row["batch_scope"] == "per_device" and row["devices"] > 1
    return f"batch {row['batch']}" + (" per device" if per_device else "")


def dataset_model(row) -> str:
    """'mnist/lenet': a row's dataset and model (a workload is more: strategies.WORKLOAD_KEYS)."""
    return f"{text(row['dataset'])}/{text(row['model'])}"


def why_not_run(cells: pd.DataFrame, what: str = "") -> str:
    """Why `cells` (the `what` cells a question needs) gave no data."""
    kind = f"{what} cell" if what else "cell"
    if cells.empty:
        return f"the study has no {kind}s"
    reasons = cells["reason"].dropna().unique() if cells["reason"].notna().any() else cells["status"].unique()
    return f"no {kind} finished ({'; '.join(text(r) for r in sorted(map(str, reasons)))})"


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

# Keys the phrases below already name (dataset_model, who, batch_phrase); any other key that varies in
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
    return f"{dataset_model(row)}, {who(row)} at {batch_phrase(row)}{extra_keys(row, keys)}"


def listed(rows: pd.DataFrame, line, by: str) -> list[str]:
    """Every row's line, or for a large study the best and the worst few by `by` and a pointer to
    the overview and the CSV tables for the rest."""
    if len(rows) <= LIST_LIMIT:
        return [line(r) for _, r in rows.iterrows()]
    best_first = rows.sort_values(by, ascending=False)
    shown = LIST_LIMIT // 2
    return (
        ["Best by " + by.replace("_", " ") + ":"]
        + [line(r) for _, r in best_first.head(shown).iterrows()]
        + ["", "Worst:"]
        + [line(r) for _, r in best_first.tail(shown).iterrows()]
        + [
            "",
            f"The other {len(rows) - 2 * shown} settings: in the overview above and in `{SETTINGS_CSV}`.",
        ]
    )


def clipped(lines: list[str], where: str, what: str = "") -> list[str]:
    """The first LIST_LIMIT of a bulleted list, then a bullet that says how many more are in `where`."""
    if len(lines) <= LIST_LIMIT:
        return lines
    return lines[:LIST_LIMIT] + [f"- {more_in(len(lines) - LIST_LIMIT, where, what)}"]
