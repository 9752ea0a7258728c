"""How often do a speedup's 95 % intervals contain the true speedup? The evidence behind
dpstudy.analysis.stats' choice of interval.

    .venv/bin/python benchmarks/interval_coverage.py [--simulations 4000]

Simulates a setting and its single-device baseline as log-normal throughputs (multiplicative
noise, as measured) at a known true ratio, for CV 3 % (GPU), 5 % (the target on a quiet CPU host)
and 20 % (the 2-core VM before issue 14) and n = 3, 5, 10 repeats a side, and prints the share of
intervals that contain the true ratio for:
  t-log      Welch's t-interval on the difference of mean log throughputs (dpstudy.analysis.stats.ratio)
  bootstrap  the percentile bootstrap of the ratio of medians (2000 resamples), dpstudy's method
             before issue 14
and how often the bootstrap's point estimate sat in the outer tenth of its own interval (the
t-interval is symmetric on the log scale: never).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpstudy.analysis import stats  # noqa: E402

TRUE_RATIO = 1.6


def bootstrap_ratio(top: np.ndarray, bottom: np.ndarray, rng: np.random.Generator, resamples: int = 2000):
    """The pre-issue-14 interval: medians of independent resamples of both groups."""
    tops = np.median(rng.choice(top, size=(resamples, len(top))), axis=1)
    bottoms = np.median(rng.choice(bottom, size=(resamples, len(bottom))), axis=1)
    low, high = np.quantile(tops / bottoms, [0.025, 0.975])
    return float(np.median(top) / np.median(bottom)), float(low), float(high)


def simulate(n: int, cv: float, simulations: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log(1 + cv**2))
    hits = {"t-log": 0, "bootstrap": 0, "edge": 0}
    for _ in range(simulations):
        top = 1000 * TRUE_RATIO * rng.lognormal(0, sigma, n)
        bottom = 1000 * rng.lognormal(0, sigma, n)
        _, low, high = stats.ratio(top, bottom)
        hits["t-log"] += low <= TRUE_RATIO <= high
        point, low, high = bootstrap_ratio(top, bottom, rng)
        hits["bootstrap"] += low <= TRUE_RATIO <= high
        hits["edge"] += min(point - low, high - point) <= 0.1 * (high - low)
    return {k: v / simulations for k, v in hits.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--simulations", type=int, default=4000)
    args = parser.parse_args()
    print(f"coverage of nominal 95 % intervals of a speedup, {args.simulations} simulated studies each")
    print(f"{'CV':>5} {'n':>3} {'t-log':>7} {'bootstrap':>10} {'bootstrap point in outer 10 %':>28}")
    for cv in (0.03, 0.05, 0.20):
        for n in (3, 5, 10):
            r = simulate(n, cv, args.simulations)
            print(f"{cv:>5.0%} {n:>3} {r['t-log']:>7.1%} {r['bootstrap']:>10.1%} {r['edge']:>28.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
