"""How many steps the probe times (dpstudy.engine.probe.affordable_steps): all of them for fast
steps, fewer for slow ones, never under MIN_STEPS, and the slowest rank decides for every rank."""

from types import SimpleNamespace

import pytest

from dpstudy.engine import probe


def trainer_whose_ranks_warmed_up_in(*seconds):
    return SimpleNamespace(mode=SimpleNamespace(all_gather_floats=lambda mine: list(seconds)))


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


def test_the_two_steps_take_turns_and_the_exposed_time_is_the_median_round_of_the_slowest_rank(monkeypatch):
    """probe.interleaved: rounds of `with` then `without`; each round's time the slowest rank's; the
    medians, and the rounds' differences' median and interquartile range."""
    calls = []
    # seconds per step as rank 0 times them, round by round: (with, without); rank 1 is slower on
    # `with` in round 2 only, and a drift slows round 3 for both steps alike
    rank0 = [(0.012, 0.010), (0.012, 0.010), (0.013, 0.010), (0.018, 0.015)]
    rank1 = [(0.011, 0.010), (0.020, 0.010), (0.012, 0.010), (0.017, 0.015)]
    timings = iter(t for pair in rank0 for t in pair)

    def per_step(trainer, work, steps):
        calls.append((work, steps))
        return next(timings)

    monkeypatch.setattr(probe, "per_step", per_step)
    rank1_flat = [t for pair in rank1 for t in pair]
    mode = SimpleNamespace(all_gather_floats=lambda mine: list(mine) + rank1_flat)
    turns = probe.interleaved(SimpleNamespace(mode=mode), "with", "without", steps=8)
    assert calls == [("with", 2), ("without", 2)] * probe.ROUNDS  # 8 steps: 2 a round, in turns
    # the slowest rank per round: with 0.012, 0.020, 0.013, 0.018; without 0.010 x 3, 0.015
    assert turns["sync_step_s"] == pytest.approx(0.0155)  # median of 0.012, 0.013, 0.018, 0.020
    assert turns["nosync_step_s"] == pytest.approx(0.010)
    # differences 0.002, 0.010, 0.003, 0.003: the odd round moves the median little, the mean much
    assert turns["exposed_s"] == pytest.approx(0.003)
    assert turns["exposed_spread_s"] == pytest.approx(0.002)  # inclusive quartiles 0.00275, 0.00475
    assert turns["rounds"] == probe.ROUNDS == 4
