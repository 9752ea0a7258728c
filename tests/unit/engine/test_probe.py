"""How many steps the probe times (dpstudy.engine.probe.affordable_steps): all of them for fast
steps, fewer for slow ones, never under MIN_STEPS, and the slowest rank decides for every rank."""

from types import SimpleNamespace

import pytest

from dpstudy.engine import probe


def trainer_whose_ranks_warmed_up_in(*seconds):
    return SimpleNamespace(par=SimpleNamespace(all_gather_floats=lambda mine: list(seconds)))


@pytest.mark.parametrize(
    "warm_ups, steps",
    [
        ((0.01, 0.02), probe.STEPS),  # fast: every step
        ((0.1, 0.6), 4),  # 2 s / 0.6 s: the slowest rank decides
        ((5.0,), probe.MIN_STEPS),  # slow: never fewer than MIN_STEPS
        ((0.0,), probe.STEPS),
    ],
)
def test_slow_steps_are_probed_fewer_times(warm_ups, steps):
    assert probe.PROBE_S == 2.0
    assert probe.affordable_steps(trainer_whose_ranks_warmed_up_in(*warm_ups), 0.01, probe.STEPS) == steps
