"""Numbers and tables for people: rounding, plurals, markdown tables, and the compact tables of
the report (the microbenchmarks pivoted, the rows that did not run collapsed into one line each).

Text from records, configs, logs or the scheduler is text: `text()` and `code()` make any value safe
to paste into the report's markdown (no HTML runs, no markdown changes its meaning), and mark the
result `Safe` so that it is not escaped twice."""

from __future__ import annotations

import html
import math
import re

import pandas as pd


class Safe(str):
    """Markdown that shows what it says: the output of text(), code() and code_block(). text() and
    markdown_table() pass it on as it is; joining it with a plain str gives a plain str again, and so
    may a pandas str column (keep Safe values in object columns)."""


# Characters that change the meaning of markdown anywhere in a line (escapes, code, emphasis,
# links, table cells, math in nbconvert's renderer, strike-through, headings).
SPECIAL = re.compile(r"([\\`*\[\]|$~#])")
# An underscore emphasises unless it stands between two letters or digits (snake_case stays readable).
UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")
# At the start of a line: a list item (-, +, 1.), a heading underline (===, ---), a thematic break.
LEADING = re.compile(r"^(?:([-+=])(?=\s|$|\1)|(\d+)([.)])(?=\s|$))")


def blank(value) -> bool:
    """None, NaN, NA, NaT: a value the tables did not record."""
    return value is None or (pd.api.types.is_scalar(value) and not isinstance(value, str) and pd.isna(value))


def one_line(value) -> str:
    """str(value) on one line: a newline in markdown can start a list, a heading or a new table row."""
    return "" if blank(value) else re.sub(r"\s*[\r\n]+\s*", " ", str(value)).strip()


def text(value) -> Safe:
    """`value` as markdown that shows exactly its characters: HTML (&, <, >) as entities, markdown's
    special characters backslash-escaped, URLs left unlinked, one line; None and NaN give "".
    Quotes stay: outside a tag (and `<` never opens one here) they mean nothing."""
    if isinstance(value, Safe):
        return value
    s = UNDERSCORE.sub(r"\\_", SPECIAL.sub(r"\\\1", one_line(value)))
    s = s.replace("://", "\\://")  # mistune links bare URLs and reads no escapes inside them
    s = LEADING.sub(lambda m: f"\\{m[1]}" if m[1] else f"{m[2]}\\{m[3]}", s)
    return Safe(html.escape(s, quote=False))


def code(value) -> Safe:
    """`value` as inline code (cell ids, paths). Backticks show it as it is unless it holds a backtick
    (it would close the span) or a pipe (mistune splits a table row at it even inside backticks):
    then a <code> element whose content is escaped as text()."""
    s = one_line(value)
    if not s:
        return Safe("")
    if "`" in s or "|" in s:
        return Safe(f"<code>{text(s)}</code>")
    return Safe(f"`{s}`")


def code_block(content: str, language: str = "") -> Safe:
    """A fenced code block of `content` (a config file): its fence longer than any run of backticks
    inside, so no line of the content can close it; the renderer escapes the content's HTML."""
    content = content.strip("\n").rstrip()
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", content)), default=0))
    return Safe(f"{fence}{one_line(language)}\n{content}\n{fence}")


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


def milliseconds(value: float) -> str:
    """Seconds as milliseconds to 3 significant digits; rounding's dust (a difference of equal parts) is
    0; NaN is n/a."""
    return "n/a" if pd.isna(value) else significant(round(value * 1e3, 6))


def times(value: float) -> str:
    """A speed-up: 1.52x, 67,800x."""
    return "" if pd.isna(value) else f"{significant(value)}x"


def markdown_table(table: pd.DataFrame, escape: bool = True) -> str:
    """A markdown table of `table`, every header and value through text() (a Safe value, e.g. from
    code(), is kept as it is). escape=False: the values are markdown already, each kept on one line."""
    cell = text if escape else one_line
    lines = ["| " + " | ".join(cell(c) for c in table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def more_in(count: int, where: str, what: str = "", markdown: bool = True) -> str:
    """The last line of a list cut short: '... 3 more cells in `results/tables/util.csv`.' (`what`
    counted and made plural; '' names nothing). markdown=False gives the plain text (a figure's note)."""
    more = plural(count, f"more {what}") if what else f"{count} more"
    return f"... {more} in {code(where) if markdown else where}."


def not_run_lines(rows: pd.DataFrame, what: str, label, shown: int = 6, markdown: bool = True) -> list[str]:
    """One line per distinct reason: '8 cells skipped: mode dp needs CUDA (a, b, ...)'.
    `label(row)` names one row; rows with the same name (repeats) are named once. The lines are
    markdown, statuses, reasons and names through text() (a Safe name, e.g. code(), stays as it is);
    markdown=False gives the plain text (a figure's note)."""
    show = text if markdown else (lambda v: "" if blank(v) else str(v))
    lines = []
    status = rows["status"] if "status" in rows else pd.Series("not run", index=rows.index)
    for (state, reason), group in rows.assign(_status=status).groupby(["_status", "reason"], dropna=False, sort=True):
        names = list(dict.fromkeys(show(label(r)) for r in group.itertuples()))
        listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
        why = show(reason) if isinstance(reason, str) else "no reason recorded"
        lines.append(f"{plural(len(group), what)} {show(state)}: {why} ({listed})")
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
    lines = (
        not_run_lines(skipped.assign(status="not run"), "measurement", lambda r: f"{r.op} {r.impl} on {r.device}")
        if not skipped.empty
        else []
    )
    return table.reset_index(), lines


def comm_table(comm: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(message size rows, all_reduce bus bandwidth and time per backend/device; one line per reason
    for the combinations that did not run). The all_reduce rows only: the other collectives'
    (all_gather, reduce_scatter) are in comm.csv and its figure; a comm.csv from before the
    `collective` column is all all_reduce."""
    if "collective" in comm:
        comm = comm[comm["collective"].fillna("all_reduce") == "all_reduce"]
    ran = comm[comm["reason"].isna() & comm["median_s"].notna()]
    skipped = comm[comm["reason"].notna()].drop_duplicates(["backend", "device", "reason"])
    table = pd.DataFrame()
    if not ran.empty:
        ran = ran.assign(
            setup=ran["backend"] + " on " + ran["device"] + ", " + ran["world_size"].astype(str) + " ranks"
        )
        wide = ran.pivot_table(
            index=["bytes", "size"], columns="setup", values=["busbw_gbps", "median_s"], aggfunc="first"
        ).sort_index()
        table = pd.DataFrame(index=wide.index)
        for setup in sorted(ran["setup"].unique()):
            table[f"{setup}: bus GB/s"] = wide[("busbw_gbps", setup)].map(significant)
            table[f"{setup}: time"] = wide[("median_s", setup)].map(seconds)
        table = table.reset_index(level="bytes", drop=True).reset_index().rename(columns={"size": "message"})
    lines = not_run_lines(skipped.assign(status="not run"), "combination", lambda r: f"{r.backend} on {r.device}")
    return table, lines
