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
    par = SimpleNamespace(all_gather_floats=lambda mine: list(mine) + rank1_flat)
    turns = probe.interleaved(SimpleNamespace(par=par), "with", "without", steps=8)
    assert calls == [("with", 2), ("without", 2)] * probe.ROUNDS  # 8 steps: 2 a round, in turns
    # the slowest rank per round: with 0.012, 0.020, 0.013, 0.018; without 0.010 x 3, 0.015
    assert turns["sync_step_s"] == pytest.approx(0.0155)  # median of 0.012, 0.013, 0.018, 0.020
    assert turns["nosync_step_s"] == pytest.approx(0.010)
    # differences 0.002, 0.010, 0.003, 0.003: the odd round moves the median little, the mean much
    assert turns["exposed_s"] == pytest.approx(0.003)
    assert turns["exposed_spread_s"] == pytest.approx(0.002)  # inclusive quartiles 0.00275, 0.00475
    assert turns["rounds"] == probe.ROUNDS == 4


class Batches:
    """A loader of `count` batches of `size` samples of 4 features, 3 classes."""

    def __init__(self, size: int, count: int = 4):
        self.size, self.count = size, count

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self):
        import torch

        for _ in range(self.count):
            yield torch.randn(self.size, 4), torch.randint(0, 3, (self.size,))


def one_device_trainer(size: int, compiled: bool = False):
    import contextlib

    import torch.nn as nn

    calls = []

    class Counted(nn.Linear):
        def forward(self, x):
            calls.append(len(x))
            return super().forward(x)

    par = SimpleNamespace(all_gather_floats=lambda mine: list(mine), synchronize=lambda: None)
    model = Counted(4, 3)
    trainer = SimpleNamespace(
        compiled=compiled,
        model=model,
        autocast=contextlib.nullcontext,
        train_data=Batches(size),
        par=par,
        spec={"epochs": 1},
    )
    return trainer, calls


def test_one_device_times_its_step_at_its_batch_half_and_a_quarter_leaving_no_gradient():
    trainer, calls = one_device_trainer(size=12)
    points = probe.batch_points(trainer, steps=3)
    assert set(points) == {"steps", "batch_step_s", "half_batch_step_s", "quarter_batch_step_s"}
    assert points["steps"] == 3 and all(points[k] > 0 for k in points if k != "steps")
    # a warm-up of each shape, then 3 timed steps at 12, 6 and 3 samples
    assert calls == [12, 12, 6, 3] + [12] * 3 + [6] * 3 + [3] * 3
    assert all(p.grad is None for p in trainer.model.parameters())


def test_a_fraction_under_two_samples_is_left_out_and_a_compiled_model_is_not_probed():
    trainer, calls = one_device_trainer(size=6)  # a quarter would be 1 sample: BatchNorm fails on it
    assert set(probe.batch_points(trainer, steps=2)) == {"steps", "batch_step_s", "half_batch_step_s"}
    assert min(calls) == 3
    compiled, calls = one_device_trainer(size=12, compiled=True)
    assert probe.batch_points(compiled, steps=2) is None and calls == []
