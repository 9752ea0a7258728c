"""Cells packed into scheduler jobs (dpstudy.jobs.packing): full jobs, repeats spread, shapes never
mixed, small studies and long cells left alone, bad input named."""

from __future__ import annotations

import pytest

from dpstudy.jobs.packing import Packable, groups, jobs, pack, within_jobs


def study(settings: int, repeats: int, minutes: float = 1.0, nodes: int = 1, prefix: str = "s") -> list[Packable]:
    """`settings` x `repeats` cells in the study's order: repeats interleaved (every r0, then every r1)."""
    return [
        Packable(f"{prefix}{s}-r{r}", f"{prefix}{s}", nodes, minutes) for r in range(repeats) for s in range(settings)
    ]


def test_sixty_one_minute_cells_fill_six_ten_minute_jobs_evenly():
    cells = study(20, 3)
    packed = pack(cells, minutes_per_job=10)
    made = groups(packed)
    assert len(made) == 6 and sorted(len(v) for v in made.values()) == [10] * 6
    assert sorted(c for v in made.values() for c in v) == sorted(c.cell for c in cells)  # each cell once


def test_the_repeats_of_a_setting_go_to_different_jobs():
    packed = pack(study(20, 3), minutes_per_job=20)
    for cells in groups(packed).values():
        settings = [c.split("-r")[0] for c in cells]
        assert len(settings) == len(set(settings)), cells
    # where there are fewer jobs than repeats, they share as evenly as they can
    crowded = groups(pack(study(2, 4), minutes_per_job=4))
    assert sorted(len(v) for v in crowded.values()) == [4, 4]


def test_cells_of_different_node_counts_never_share_a_job():
    cells = study(10, 3, nodes=1) + study(10, 3, nodes=2, prefix="m")
    packed = pack(cells, minutes_per_job=15)
    nodes = {c.cell: c.nodes for c in cells}
    for name, members in groups(packed).items():
        assert len({nodes[c] for c in members}) == 1
        assert name.startswith(f"pack-{nodes[members[0]]}n-")
    assert len(groups(packed)) == 4  # 30 minutes of each shape: two jobs each


def test_a_study_that_would_not_fill_a_job_and_a_long_cell_stay_jobs_of_their_own():
    assert set(pack(study(5, 1), minutes_per_job=30).values()) == {None}
    cells = [*study(10, 2), Packable("long-r0", "long", 1, 45.0)]
    packed = pack(cells, minutes_per_job=10)
    assert packed["long-r0"] is None and all(packed[c.cell] for c in cells[:-1])


@pytest.mark.parametrize("minutes_per_job", [0, -5, float("nan")])
def test_a_bad_minutes_per_job_is_named(minutes_per_job):
    with pytest.raises(ValueError, match="minutes_per_job"):
        pack(study(2, 1), minutes_per_job)


def test_a_cell_without_an_estimate_is_named():
    with pytest.raises(ValueError, match="s1-r0"):
        pack([Packable("s0-r0", "s0", 1, 1.0), Packable("s1-r0", "s1", 1, float("nan"))], 10)


def test_a_limit_on_jobs_packs_more_cells_per_job_and_says_how_long_they_became():
    cells = study(20, 3)  # 60 one-minute cells: 6 jobs of 10 minutes
    packed, minutes = within_jobs(cells, minutes_per_job=10, max_jobs=4)
    assert jobs(packed) <= 4 and minutes > 10
    assert sorted(c for v in groups(packed).values() for c in v) == sorted(c.cell for c in cells)
    assert within_jobs(cells, 10, None) == (pack(cells, 10), 10)
    # a small study left as a job per cell still packs when that is too many jobs
    small = study(5, 1)
    packed, _ = within_jobs(small, minutes_per_job=30, max_jobs=2)
    assert jobs(packed) == 1 and set(packed.values()) == {"pack-1n-0"}
    # long cells too, when the limit asks for it; one job per node count is the least there is
    mixed = [*study(3, 1), Packable("long-r0", "long", 1, 90.0), *study(2, 1, nodes=2, prefix="m")]
    packed, minutes = within_jobs(mixed, minutes_per_job=30, max_jobs=2)
    assert jobs(packed) == 2 and minutes > 90
    with pytest.raises(ValueError, match="at least 2 jobs"):
        within_jobs(mixed, 30, max_jobs=1)
