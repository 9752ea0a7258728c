"""Will a forecast fit (dpstudy.analysis.capacity): its need against a budget or the CUDA device."""

import pandas as pd
import pytest

from dpstudy.analysis import capacity

ROWS = pd.DataFrame(
    {
        "env_device": ["cuda", "cuda", "cuda", "cpu"],
        "devices": [2, 4, 8, 4],
        "predicted_memory_mb": [70_000.0, 40_000.0, None, 500.0],
    }
)
SPLIT = pd.DataFrame({"context_mb": [760.0, 758.0, None], "total_mb": [81_559.0, 81_079.0, 81_079.0]})


def test_a_cuda_forecast_needs_its_margin_and_the_measured_context_within_the_smallest_device():
    table = capacity.with_fit(ROWS, SPLIT, None)
    # 70,000 MB + 10 % + the median context 759 MB = 77,759 <= 81,079 (the smallest device)
    assert table["need_mb"].iloc[0] == pytest.approx(70_000 * 1.1 + 759)
    assert table["capacity_mb"].iloc[0] == 81_079 and bool(table["fits"].iloc[0])
    assert pd.isna(table["fits"].iloc[2]) and pd.isna(table["need_mb"].iloc[2])  # no memory forecast
    # a CPU study without a budget has nothing to fit in; with one, no CUDA context is added
    assert pd.isna(table["capacity_mb"].iloc[3]) and pd.isna(table["fits"].iloc[3])
    budgeted = capacity.with_fit(ROWS, SPLIT, 64.0)
    assert budgeted["capacity_mb"].tolist() == [64 * 1024] * 4
    assert budgeted["fits"].tolist()[:2] == [False, True] and bool(budgeted["fits"].iloc[3])
    assert budgeted["need_mb"].iloc[3] == pytest.approx(550.0)


def test_without_a_measured_context_a_cuda_forecast_counts_the_plans_allowance():
    # 76 GiB = 77,824 MB: 70,000 + 10 % + the 1,024 MB allowance (study.budget.CUDA_RUNTIME_MB) does not
    # fit; with the 759 MB context the cells measured it does
    table = capacity.with_fit(ROWS.iloc[:1], SPLIT.assign(context_mb=None), 76.0)
    assert table["need_mb"].iloc[0] == pytest.approx(70_000 * 1.1 + 1024) and not table["fits"].iloc[0]
    assert capacity.with_fit(ROWS.iloc[:1], SPLIT, 76.0)["fits"].iloc[0]
