"""nccl-tests' bus factors, the one definition: the bytes each collective moves per rank over a
ring, as a share of its total size S. busbw = algbw x the factor; comm_bench reports busbw with it
(dpstudy.microbench.comm), and the models price a collective at n ranks with it
(dpstudy.analysis.step_model)."""

from __future__ import annotations

FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


def bus_factor(collective: str, world_size: int) -> float:
    """busbw / algbw of `collective` over `world_size` ranks: 2(n-1)/n for all_reduce, (n-1)/n for
    all_gather and reduce_scatter."""
    return FACTORS[collective](world_size)
