"""Bar charts of many settings: a bar per setting while they fit on a screen, beyond that a bar per
group of settings with the least telling keys folded into its median, and a height to match."""

from __future__ import annotations

import pandas as pd

from dpstudy.report.figures.layout import MAX_BARS, MAX_HEIGHT, setting_of

# Keys that say how a cell ran (a colour of their own), never folded into a median of a bar chart;
# the batch keys are folded last.
CORE_KEYS = ("dataset", "model", "mode", "backend", "nodes", "gpus", "devices", "device", "env_device")
BATCH_KEYS = ("batch", "global_batch", "batch_scope")


def bar_size(bars: int) -> dict:
    """Height grows with the number of bars up to about a screen; width stays readable for long cell ids."""
    height = min(MAX_HEIGHT, max(2.5, 1.0 + 0.3 * bars))
    return {"height": height, "aspect": 8.0 / height}


def short(key: str, value) -> str:
    """A key's value in a bar's label: 'ddp', 'g4', 'b256', 'lr 0.05'; '' for backend none."""
    if pd.isna(value):
        return f"{key} ?"
    if key in ("dataset", "model", "mode"):
        return str(value)
    if key == "backend":
        return "" if value == "none" else str(value)
    if key in ("gpus", "batch"):
        return f"{key[0]}{value}"
    return f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"


LABEL_WIDTH = 48  # characters of a bar's label per line: longer ids wrap at their dashes


def wrapped(label: str, width: int = LABEL_WIDTH) -> str:
    """A long setting id on several lines, broken after its dashes: a figure keeps room for its bars
    (the ids of language-model cells that set model_args and seq_len run past 90 characters)."""
    lines, line = [], ""
    for part in label.split("-"):
        piece = part if not line else f"-{part}"
        if line and len(line) + len(piece) > width:
            lines.append(line + "-")
            line = part
        else:
            line += piece
    return "\n".join([*lines, line])


def fold_keys(rows: pd.DataFrame, limit: int) -> tuple[list[str], list[str]]:
    """(kept, folded) varied setting keys, folding the keys with most values first (the batch keys
    last, CORE_KEYS never) until the kept keys make at most `limit` groups."""
    from dpstudy.analysis.stats import varied_keys

    kept = varied_keys(rows)
    folded: list[str] = []

    def groups() -> int:
        return rows[kept].drop_duplicates().shape[0] if kept else 1

    others = sorted((k for k in kept if k not in CORE_KEYS + BATCH_KEYS), key=lambda k: -rows[k].nunique(dropna=False))
    for key in others:
        if groups() <= limit:
            break
        kept.remove(key)
        folded.append(key)
    if groups() > limit:
        folded += [k for k in kept if k in BATCH_KEYS]
        kept = [k for k in kept if k not in BATCH_KEYS]
    return kept, folded


def bar_groups(rows: pd.DataFrame, limit: int = MAX_BARS) -> tuple[pd.Series, list[str], list[str]]:
    """(a bar label per row, the labels in order, the keys folded away) for rows that carry `cell`
    and the setting keys: a bar per setting (its id without the repeat) while there are at most
    `limit` settings; beyond, a bar per group of settings that differ only in the folded keys."""
    settings = setting_of(rows["cell"])
    if settings.nunique() <= limit:
        settings = settings.map(wrapped)
        return settings, sorted(settings.unique()), []
    kept, folded = fold_keys(rows, limit)
    named = [k for k in kept if k not in ("devices", "global_batch", "env_device")] or kept
    combos = rows[kept].drop_duplicates().sort_values(kept, ignore_index=True)
    names = (
        [
            " ".join(filter(None, (short(k, v) for k, v in zip(named, values))))
            for values in combos[named].itertuples(index=False)
        ]
        if named
        else ["all settings"] * len(combos)
    )
    labels = (
        rows[kept].merge(combos.assign(_label=names), on=kept, how="left")["_label"]
        if kept
        else (pd.Series("all settings", index=range(len(rows))))
    )
    return pd.Series(labels.to_numpy(), index=rows.index), list(dict.fromkeys(names)), folded
