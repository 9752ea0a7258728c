"""Numbers and tables for people: rounding, plurals, markdown tables, and the compact tables of
the report (the microbenchmarks pivoted, the rows that did not run collapsed into one line each)."""
from __future__ import annotations

import math

import pandas as pd


def plural(count: int, word: str, many: str | None = None) -> str:
    """'1 cell', '2 cells', '1 device'."""
    return f"{count} {word if count == 1 else many or word + 's'}"


def seconds(value: float) -> str:
    """A duration with a unit that keeps it short: 84.8 s, 1.25 ms, 3.4 us, 2 min 5 s."""
    if pd.isna(value):
        return ""
    if value >= 120:
        return f"{int(value // 60)} min {value % 60:.0f} s"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{significant(value / scale)} {unit}"
    return f"{significant(value * 1e9)} ns"


def significant(value: float, digits: int = 3) -> str:
    """`digits` significant digits, thousands separated: 84.8, 1.25, 0.00345, 67,800."""
    if pd.isna(value):
        return ""
    if value == 0:
        return "0"
    before_point = math.floor(math.log10(abs(value))) + 1
    decimals = max(0, digits - before_point)
    return f"{round(value, digits - before_point if decimals == 0 else decimals):,.{decimals}f}"


def times(value: float) -> str:
    """A speed-up: 1.52x, 67,800x."""
    return "" if pd.isna(value) else f"{significant(value)}x"


def markdown_table(table: pd.DataFrame) -> str:
    def cell(v) -> str:
        return "" if pd.isna(v) else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def not_run_lines(rows: pd.DataFrame, what: str, label, shown: int = 6) -> list[str]:
    """One line per distinct reason: '8 cells skipped: mode dp needs CUDA (a, b, ...)'.
    `label(row)` names one row; rows with the same name (repeats) are named once."""
    lines = []
    status = rows["status"] if "status" in rows else pd.Series("not run", index=rows.index)
    for (state, reason), group in rows.assign(_status=status).groupby(["_status", "reason"], dropna=False, sort=True):
        names = list(dict.fromkeys(label(r) for r in group.itertuples()))
        listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
        why = reason if isinstance(reason, str) else "no reason recorded"
        lines.append(f"{plural(len(group), what)} {state}: {why} ({listed})")
    return lines


def kernels_table(kernels: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(op x shape x device rows, a median-time column per implementation and the extension's
    speed-ups; one line per reason for the rows that did not run)."""
    ran = kernels[kernels["reason"].isna() & kernels["median_s"].notna()]
    skipped = kernels[kernels["reason"].notna()]
    order = [i for i in ("python_loop", "pytorch", "torchvision", "extension") if i in set(ran["impl"])]
    wide = ran.pivot_table(index=["op", "shape", "device"], columns="impl", values="median_s", aggfunc="first")
    table = pd.DataFrame(index=wide.index)
    for impl in order:
        table[impl.replace("_", " ")] = wide[impl].map(seconds)
    ext = ran[ran["impl"] == "extension"].set_index(["op", "shape", "device"])
    table["extension vs loop"] = ext["speedup_vs_loop"].reindex(table.index).map(times)
    table["extension vs PyTorch"] = ext["speedup_vs_pytorch"].reindex(table.index).map(times)
    lines = not_run_lines(skipped.assign(status="not run"), "measurement",
                          lambda r: f"{r.op} {r.impl} on {r.device}") if not skipped.empty else []
    return table.reset_index(), lines


def comm_table(comm: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(message size rows, bus bandwidth and time per backend/device; one line per reason for the
    combinations that did not run)."""
    ran = comm[comm["reason"].isna() & comm["median_s"].notna()]
    skipped = comm[comm["reason"].notna()].drop_duplicates(["backend", "device", "reason"])
    table = pd.DataFrame()
    if not ran.empty:
        ran = ran.assign(setup=ran["backend"] + " on " + ran["device"] + ", " + ran["world_size"].astype(str) + " ranks")
        wide = ran.pivot_table(index=["bytes", "size"], columns="setup", values=["busbw_gbps", "median_s"],
                               aggfunc="first").sort_index()
        table = pd.DataFrame(index=wide.index)
        for setup in sorted(ran["setup"].unique()):
            table[f"{setup}: bus GB/s"] = wide[("busbw_gbps", setup)].map(significant)
            table[f"{setup}: time"] = wide[("median_s", setup)].map(seconds)
        table = table.reset_index(level="bytes", drop=True).reset_index().rename(columns={"size": "message"})
    lines = not_run_lines(skipped.assign(status="not run"), "combination", lambda r: f"{r.backend} on {r.device}")
    return table, lines
