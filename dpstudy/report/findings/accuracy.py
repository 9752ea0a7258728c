"""Is accuracy the same across modes: the most against the least accurate of each group of settings
that differ only in mode, devices or backend."""

from __future__ import annotations

from dpstudy.analysis import stats
from dpstudy.analysis.keys import BASELINE_KEYS
from dpstudy.report.findings.phrases import (
    SETTINGS_CSV,
    Tables,
    batch_phrase,
    by_setting,
    clipped,
    dataset_model,
    extra_keys,
    members,
    not_measured,
    varied,
    who,
)


def accuracy(tables: Tables) -> str:
    """The comparisons of kind "accuracy": per group of settings that differ only in mode, devices
    or backend, the most against the least accurate, and the largest of those gaps."""
    comparisons, settings = tables["comparisons"], by_setting(tables)
    gaps = comparisons[comparisons["kind"] == "accuracy"]
    note = "Test accuracy is computed once over the whole test set, counts all-reduced across ranks (not per rank)."
    keys = [k for k in varied(tables) if k in BASELINE_KEYS]
    if gaps.empty:
        return not_measured("no setting finished in more than one mode") + " " + note
    lines = []
    for _, gap in gaps.iterrows():
        best, group = settings.loc[gap["setting"]], settings.loc[members(gap)]
        parts = ", ".join(
            f"{who(r)} {stats.interval_text(tuple(v * 100 for v in stats.value(r, 'final_test_acc')), '{:.1f}', ' %')}"
            for _, r in group.iterrows()
        )
        verdict = (
            "differ beyond noise"
            if gap["claim"]
            else ("within noise" if gap["repeats"] > 1 else "one run each: no claim")
        )
        lines.append(f"- {dataset_model(best)} at {batch_phrase(best)}{extra_keys(best, keys)}: {parts}: {verdict}.")
    widest = gaps[gaps["largest"].astype(bool)].iloc[0]
    best, worst, claim = settings.loc[widest["setting"]], settings.loc[widest["other"]], widest["claim"]
    head = (
        f"Final test accuracy differed by at most {widest['value'] * 100:.1f} points across modes at equal "
        "settings "
        f"(largest gap: {dataset_model(best)} at {batch_phrase(best)}{extra_keys(best, keys)}, "
        f"{who(best)} {best['final_test_acc'] * 100:.1f} % "
        f"vs {who(worst)} {worst['final_test_acc'] * 100:.1f} %"
        + ("; beyond noise" if claim else "; within noise" if worst["repeats"] > 1 else "")
        + ")."
    )
    return head + "\n\n" + "\n".join(clipped(lines, SETTINGS_CSV, "group")) + "\n\n" + note
