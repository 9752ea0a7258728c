"""The source reports side by side with ours: their published figure, ours, and whether their
finding holds here (the comparisons are in sources.yaml, next to this file)."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.report.text import markdown_table, significant, text
from dpstudy.util import yamlfile

SOURCES_FILE = Path(__file__).with_name("sources.yaml")
# metric -> (cells.csv column, scale to the source's unit, unit)
METRICS = {
    "epoch_s": ("median_epoch_s", 1.0, "s"),
    "total_s": ("epochs_s", 1.0, "s"),
    "test_acc": ("final_test_acc", 100.0, "%"),
    "mem_mb": ("peak_mem_mb_max", 1.0, "MB"),
}
FINDINGS = ("b_lower", "b_higher", "similar")
# Time metrics: "is b faster than a" is answered with b's speedup over a, the throughput ratio of
# dpstudy.analysis.stats (the number the rest of the report quotes when a is b's single-device baseline).
TIMES = ("epoch_s", "total_s")


@functools.cache
def sources() -> dict[str, Any]:
    return yamlfile.safe_load(SOURCES_FILE.read_text())


def alternatives(match: dict[str, Any]) -> list[dict[str, Any]]:
    """Every way to satisfy `match`, in preference order (a list value names alternatives)."""
    keys = list(match)
    options = [v if isinstance(v, list) else [v] for v in match.values()]
    return [dict(zip(keys, combo)) for combo in itertools.product(*options)]


def matching(cells: pd.DataFrame, want: dict[str, Any]) -> pd.DataFrame:
    mask = pd.Series(True, index=cells.index)
    for key, value in want.items():
        mask &= cells[key] == value
    return cells[mask]


def our_side(cells: pd.DataFrame, side: dict[str, Any], metric: str) -> dict[str, Any]:
    """Our value for one side of a comparison: the first alternative that finished, else why not."""
    column, scale, _ = METRICS[metric]
    tried = []
    for want in alternatives(side["match"]):
        found = matching(cells, want)
        ok = found[found["status"] == "ok"]
        if not ok.empty:
            value = stats.mean_interval(ok[column] * scale, log=metric in TIMES)
            return {
                "value": value,
                "want": want,
                "repeats": len(ok),
                "values": (ok[column] * scale).tolist(),
                "speeds": ok["samples_per_s"].tolist(),
            }
        tried.append(found)
    found = pd.concat(tried)
    if found.empty:
        return {"missing": "not in this study"}
    reasons = sorted({str(r) for r in found["reason"].dropna()}) or sorted(set(found["status"]))
    return {"missing": "cannot run here: " + "; ".join(reasons)}


def verdict(
    finding: str, a: dict, b: dict, tolerance: float | None, names: tuple[str, str] = ("a", "b"), metric: str = ""
) -> str:
    """Does their finding hold for our a and b? For a time, the ratio quoted is b's speedup over a
    (throughput b / a, with its interval); otherwise the ratio b / a of the metric."""
    if "missing" in a or "missing" in b:
        return "cannot tell: " + (a.get("missing") or b.get("missing"))
    (pa, *_), (pb, *_) = a["value"], b["value"]
    if finding == "similar":
        holds = abs(pb - pa) <= tolerance
        return f"{'yes' if holds else 'no'}: {significant(abs(pb - pa))} apart (their tolerance {tolerance})"
    want = -1 if finding == "b_lower" else 1
    if metric in TIMES:  # lower time = higher throughput: compare speeds, quote the speedup
        value, want = stats.ratio(b["speeds"], a["speeds"]), -want
        quoted = f"{names[1]} runs at {stats.interval_text(value, unit='x')} the throughput of {names[0]}"
    else:
        value = stats.ratio(b["values"], a["values"])
        quoted = f"{names[1]} / {names[0]} = {stats.interval_text(value, significant, 'x')}"
    side = stats.versus(value, 1.0)
    if not stats.has_interval(value[1], value[2]):
        side = (value[0] > 1) - (value[0] < 1)
        return f"{'yes' if side == want else 'no'} ({quoted}; too few runs for an interval)"
    if side == 0:
        return f"within noise ({quoted})"
    return f"{'yes' if side == want else 'no, the opposite'} ({quoted}, beyond noise)"


def label(side: dict, ours: dict) -> str:
    """A side's label, saying which alternative ran when it is not the first (NCCL -> Gloo)."""
    if "want" not in ours:
        return side["label"]
    first = alternatives(side["match"])[0]
    swapped = [f"{ours['want'][k]} for {first[k]}" for k in first if ours["want"][k] != first[k]]
    return side["label"] + (f" ({', '.join(swapped)})" if swapped else "")


def ours_text(side: dict, ours: dict, unit: str) -> str:
    if "missing" in ours:
        return f"{side['label']}: {ours['missing']}"
    return f"{label(side, ours)}: {stats.interval_text(ours['value'], significant, ' ' + unit)}"


def side_by_side(study: str, cells: pd.DataFrame, stand_in: bool = False) -> str | None:
    """Markdown: the source's figures beside ours, or None when `study` reproduces no source."""
    source = sources().get(study)
    if source is None:
        return None
    head = (
        f"Source {text(source['source'])} ran on {text(source['hardware'])}; this study ran on "
        f"{', '.join(text(d) for d in sorted(cells['env_device'].dropna().unique())) or 'no device'}"
        + (" with generated stand-ins for the datasets (config `stand_in`)" if stand_in else "")
        + "."
    )
    if not source["comparisons"]:
        return head + " The source publishes no figure to compare with."
    rows = []
    for c in source["comparisons"]:
        unit = METRICS[c["metric"]][2]
        a, b = our_side(cells, c["a"], c["metric"]), our_side(cells, c["b"], c["metric"])
        rows.append(
            {
                "question": c["question"],
                "theirs": f"{c['a']['label']}: {c['a']['theirs']:g} {unit}; "
                f"{c['b']['label']}: {c['b']['theirs']:g} {unit}",
                "ours": f"{ours_text(c['a'], a, unit)}; {ours_text(c['b'], b, unit)}",
                "their finding": c["says"],
                "holds here?": verdict(
                    c["finding"], a, b, c.get("tolerance"), (c["a"]["label"], c["b"]["label"]), c["metric"]
                ),
            }
        )
    return (
        head
        + "\n\n"
        + markdown_table(pd.DataFrame(rows))
        + (
            "\n\nTimes are not comparable across hardware or data: the question is whether the source's finding, "
            "a relation between two of its cells, holds between the same two cells here."
        )
    )
