"""The probe (dpstudy.engine.probe): how many steps it times (affordable_steps): all of them for
fast steps, fewer for slow ones, never under MIN_STEPS, and the slowest rank decides for every
rank; the probe of each mode chosen by its name, and the modes knowing nothing of it."""

import inspect
from types import SimpleNamespace

import pytest

from dpstudy.engine import probe, probe_timing


def trainer_whose_ranks_warmed_up_in(*seconds):
    return SimpleNamespace(mode=SimpleNamespace(all_gather_floats=lambda mine: list(seconds)))


@pytest.mark.parametrize(
    "warm_ups, steps",
    [
        ((0.01, 0.02), probe_timing.STEPS),  # fast: every step
        ((0.1, 0.6), 4),  # 2 s / 0.6 s: the slowest rank decides
        ((5.0,), probe_timing.MIN_STEPS),  # slow: never fewer than MIN_STEPS
        ((0.0,), probe_timing.STEPS),
    ],
)
def test_slow_steps_are_probed_fewer_times(warm_ups, steps):
    assert probe_timing.PROBE_S == 2.0
    assert probe_timing.affordable_steps(trainer_whose_ranks_warmed_up_in(*warm_ups), 0.01, probe_timing.STEPS) == steps


def test_the_two_steps_take_turns_and_the_exposed_time_is_the_median_round_of_the_slowest_rank(monkeypatch):
    """probe_timing.interleaved: rounds of `with` then `without`; each round's time the slowest rank's; the
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

    monkeypatch.setattr(probe_timing, "per_step", per_step)
    rank1_flat = [t for pair in rank1 for t in pair]
    mode = SimpleNamespace(all_gather_floats=lambda mine: list(mine) + rank1_flat)
    turns = probe_timing.interleaved(SimpleNamespace(mode=mode), "with", "without", steps=8)
    assert calls == [("with", 2), ("without", 2)] * probe_timing.ROUNDS  # 8 steps: 2 a round, in turns
    # the slowest rank per round: with 0.012, 0.020, 0.013, 0.018; without 0.010 x 3, 0.015
    assert turns["sync_step_s"] == pytest.approx(0.0155)  # median of 0.012, 0.013, 0.018, 0.020
    assert turns["nosync_step_s"] == pytest.approx(0.010)
    # differences 0.002, 0.010, 0.003, 0.003: the odd round moves the median little, the mean much
    assert turns["exposed_s"] == pytest.approx(0.003)
    assert turns["exposed_spread_s"] == pytest.approx(0.002)  # inclusive quartiles 0.00275, 0.00475
    assert turns["rounds"] == probe_timing.ROUNDS == 4


def test_modes_know_nothing_of_the_probe_or_the_trainer(tmp_path):
    """A mode wraps the model and owns its collectives; the probe reads the mode, never the other
    way round, so neither the Trainer nor a mode needs the other to be built."""
    from dpstudy.engine import modes
    from dpstudy.record import provenance

    outside = {provenance.module_file("dpstudy.engine.probe"), provenance.module_file("dpstudy.engine.train")}
    folder = provenance.module_file("dpstudy.engine.modes").parent
    files = sorted(folder.glob("*.py"))
    assert {f.stem for f in files} >= {"__init__", "base", "dp", "ddp", "fsdp"}
    found = {f.name: outside & {provenance.module_file(n) for n in provenance.imported_names(f)} for f in files}
    assert found == {f.name: set() for f in files}
    # the check sees such an import, lazy ones too
    lazy = tmp_path / "mode.py"
    lazy.write_text("def probe():\n    from dpstudy.engine import probe\n    import dpstudy.engine.train\n")
    assert {provenance.module_file(n) for n in provenance.imported_names(lazy)} >= outside
    # and no mode's method takes a trainer
    methods = [
        (f"{cls.__name__}.{name}", fn)
        for cls in modes.MODES.values()
        for name, fn in inspect.getmembers(cls, inspect.isroutine)
        if (getattr(fn, "__module__", None) or "").startswith("dpstudy.engine.modes")
    ]
    assert "FullyShardedDataParallel.wrap" in dict(methods)
    assert [name for name, fn in methods if "trainer" in inspect.signature(fn).parameters] == []
    assert not any(hasattr(cls, "probe") for cls in modes.MODES.values())


def test_each_probe_is_a_modes_and_a_mode_without_one_is_not_probed(monkeypatch):
    from dpstudy.engine import modes

    assert set(probe.PROBES) == {"dp", "ddp", "fsdp", "deepspeed"} and set(probe.PROBES) <= set(modes.MODES)
    assert probe.PROBES["fsdp"] is probe.probe_fsdp and probe.PROBES["ddp"] is probe.probe_ddp
    monkeypatch.setattr(probe.compiling, "compiled_graphs", lambda: 0)
    single = SimpleNamespace(mode=SimpleNamespace(name="single"), compiled=False)
    assert probe.measure(single) is None
    # a probe is chosen by the mode's name, and what it returns is checked against the record's fields
    monkeypatch.setitem(probe.PROBES, "single", lambda trainer, steps: {"steps": steps, "sync_step_s": 0.5})
    assert probe.measure(single, steps=3) == {"steps": 3, "sync_step_s": 0.5}
    monkeypatch.setitem(probe.PROBES, "single", lambda trainer, steps: {"steps": steps, "bogus_s": 1.0})
    with pytest.raises(ValueError, match="bogus_s"):
        probe.measure(single)
