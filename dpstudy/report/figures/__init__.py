"""Figures from the tidy tables: one function per file of dpstudy.study.outputs.FIGURES, each one
seaborn grid, in a module per topic; render draws them all.

Every function takes the tables of dpstudy.analysis.collect ({"cells", "epochs", "ranks", "util", "settings",
"scaling"}) and returns a matplotlib Figure. Speedup, efficiency, throughput and final accuracy are
the settings table's (a marker per setting, its 95 % interval as an error bar), never recomputed
here: a figure shows the numbers the report prints. Cells that did not finish (skipped, oom, failed)
are listed with their reason under every figure, so nothing disappears silently. outputs.FIGURES is
the one list of figure files (the Snakefile names the rule's outputs from it without importing
this package); a topic module marks the function of each with @layout.figure, named after its file.
"""

from __future__ import annotations

import os

# Files only, also on machines without a display; set before the modules below import matplotlib.
os.environ.setdefault("MPLBACKEND", "Agg")

from pathlib import Path

import seaborn as sns

from dpstudy.report.figures import (  # noqa: F401 (each registers its figures)
    accuracy,
    backends,
    forecasts,
    heatmaps,
    memory,
    scaling,
    strategies,
    usage,
)
from dpstudy.report.figures.layout import DPI, DRAWN, Draw, Tables
from dpstudy.study import outputs
from dpstudy.util.atomic import atomic_output

assert set(DRAWN) == set(outputs.FIGURES), (
    f"dpstudy.study.outputs.FIGURES names each figure file: drawn {sorted(DRAWN)}, named {sorted(outputs.FIGURES)}"
)
FIGURES: dict[str, Draw] = {name: DRAWN[name] for name in outputs.FIGURES}


def render(tables: Tables, out_dir: str | Path) -> list[Path]:
    """Write every figure of FIGURES into out_dir, each file atomically."""
    import matplotlib.pyplot as plt

    sns.set_theme(style="whitegrid", context="notebook")
    paths = []
    for name, make in FIGURES.items():
        fig = make(tables)
        try:
            with atomic_output(Path(out_dir) / name) as tmp:
                fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
        finally:
            plt.close(fig)
        paths.append(Path(out_dir) / name)
    return paths
