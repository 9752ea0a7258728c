"""Settings against settings: the comparisons the report states, one row each (the `comparisons` table).

Three kinds, each between settings of the settings table (dpstudy.analysis.stats.settings_table),
named by its `setting` numbers:

  nodes     DDP at equal world size spread over several nodes (`setting`) against one node
            (`other`), every other key equal; both with a speedup. value: the throughput ratio
            far / near (`stats.ratio` of the repeats, with its 95 % interval).
  accuracy  the settings that share every baseline key (BASELINE_KEYS: the same run but for mode,
            devices and backend) and have a final test accuracy, when there are two or more: the
            most accurate (`setting`) against the least (`other`). value: the gap in final test
            accuracy, best - worst (`stats.difference` of the repeats' means, with its interval).
  backend   DDP over NCCL (`setting`) against Gloo (`other`), every other key equal. value: the
            throughput ratio NCCL / Gloo (`stats.ratio`, with its interval).

`members` lists every setting of the comparison (space-separated `setting` numbers, in table
order; an accuracy group may have more than two). `claim` is +1 / -1 / 0 as `stats.compare` says
of the two settings' own 95 % intervals of the metric (above, below, or overlapping or without
an interval): what the report claims. `repeats` is the fewest repeats among `members`. `largest`
marks the comparison of its kind with the largest value (the first of equals).
"""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.keys import BASELINE_KEYS, SETTING_KEYS
from dpstudy.study import modes

COLUMNS = ("kind", "setting", "other", "members", "value", "low", "high", "claim", "repeats", "largest")
KINDS = ("nodes", "accuracy", "backend")


def repeats_of(settings: pd.DataFrame, cells: pd.DataFrame, metric: str) -> dict[int, pd.Series]:
    """{setting number: the `metric` of its repeats}, from the settings table's `cells` column."""
    values = cells.set_index("cell")[metric]
    return {row["setting"]: values.loc[row["cells"].split(" ")] for _, row in settings.iterrows()}


def row(kind: str, a, b, members: pd.DataFrame, estimate: stats.Estimate, metric: str) -> dict:
    claim = stats.compare(stats.value(a, metric), stats.value(b, metric))
    return {
        "kind": kind,
        "setting": a["setting"],
        "other": b["setting"],
        "members": " ".join(str(s) for s in members["setting"]),
        "value": estimate[0],
        "low": estimate[1],
        "high": estimate[2],
        "claim": claim,
        "repeats": members["repeats"].min(),
    }


def across_nodes(settings: pd.DataFrame, throughput: dict[int, pd.Series]) -> list[dict]:
    """Each multi-node setting against each one-node setting of the same world size."""
    rows = settings[(settings["devices"] > 1) & settings["speedup"].notna()]
    keys = [k for k in SETTING_KEYS if k not in ("gpus", "nodes")]
    out = []
    for _, group in rows.groupby(keys, dropna=False):
        for _, far in group[group["nodes"] > 1].iterrows():
            for _, near in group[group["nodes"] == 1].iterrows():
                estimate = stats.ratio(throughput[far["setting"]], throughput[near["setting"]])
                out.append(row("nodes", far, near, pd.DataFrame([far, near]), estimate, "samples_per_s"))
    return out


def accuracy_gaps(settings: pd.DataFrame, accuracies: dict[int, pd.Series]) -> list[dict]:
    """The most against the least accurate setting of every group that differs only in mode,
    devices or backend. All equal: the first against the last, never a setting against itself.
    A setting that did not learn is no party to an accuracy claim."""
    rows = settings.dropna(subset=["final_test_acc"])
    rows = rows[rows["learned"].fillna(True).astype(bool)]
    out = []
    for _, group in rows.groupby(list(BASELINE_KEYS), dropna=False):
        if len(group) < 2:
            continue
        best, worst = group["final_test_acc"].idxmax(), group["final_test_acc"].idxmin()
        if worst == best:
            worst = group.index[-1]
        best, worst = group.loc[best], group.loc[worst]
        point, low, high = stats.difference(accuracies[best["setting"]], accuracies[worst["setting"]])
        # the gap quoted is the settings' own means apart (the same numbers, in the same order)
        gap = best["final_test_acc"] - worst["final_test_acc"]
        out.append(row("accuracy", best, worst, group, (gap, low, high), "final_test_acc"))
    return out


def backends(settings: pd.DataFrame, throughput: dict[int, pd.Series]) -> list[dict]:
    """NCCL against Gloo at otherwise equal settings."""
    ddp = settings[settings["mode"].isin(modes.per_device_modes())]
    keys = [k for k in SETTING_KEYS if k != "backend"]
    out = []
    for _, group in ddp.groupby(keys, dropna=False):
        by_backend = group.set_index("backend")
        if {"nccl", "gloo"} <= set(by_backend.index):
            nccl, gloo = by_backend.loc["nccl"], by_backend.loc["gloo"]
            estimate = stats.ratio(throughput[nccl["setting"]], throughput[gloo["setting"]])
            out.append(row("backend", nccl, gloo, group, estimate, "samples_per_s"))
    return out


def comparisons_table(settings: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """The `comparisons` table (see the module's docstring) of `settings` (settings_table of
    `cells`) and `cells`, whose rows give the repeats."""
    throughput = repeats_of(settings, cells, "samples_per_s")
    accuracies = repeats_of(settings, cells, "final_test_acc")
    rows = [*across_nodes(settings, throughput), *accuracy_gaps(settings, accuracies), *backends(settings, throughput)]
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "largest"])
    table["largest"] = False
    for kind in KINDS:
        values = table.loc[table["kind"] == kind, "value"]
        if values.notna().any():
            table.loc[values.idxmax(), "largest"] = True
    return table.astype(
        {
            "setting": "Int64",
            "other": "Int64",
            "claim": "Int64",
            "repeats": "Int64",
            "value": float,
            "low": float,
            "high": float,
            "largest": bool,
        }
    )[list(COLUMNS)]
