"""The step model's parts and its calibration (dpstudy.analysis.step_model) on numbers whose answer is known."""

import math
import statistics

import pytest

from dpstudy.analysis import step_model


def test_a_step_adds_its_parts_and_its_overlap_is_what_it_hid_of_the_priced_collectives():
    made = step_model.step(0.010, 1.2, 0.003, 0.004, 0.25, data_s=0.001)
    assert made.sharing_s == pytest.approx(0.002) and made.exposed_s == pytest.approx(0.003)
    assert made.total_s == pytest.approx(0.010 + 0.002 + 0.003 + 0.003 + 0.001)
    assert made.overlap == pytest.approx(0.25)
    # exposed beyond what the collectives cost alone: an overlap below 0, kept as measured
    slower = step_model.Step(0.010, 0.0, 0.0, 0.006, comm_s=0.004)
    assert slower.overlap == pytest.approx(-0.5)
    assert math.isnan(step_model.Step(0.010, 0.0, 0.0, 0.0).overlap)  # nothing priced


def test_two_batches_give_the_share_and_the_fixed_cost():
    # remainder = 0.5 t1 + 2 ms at t1 = 4 and 16 ms
    made = step_model.calibrate([0.004, 0.016], [0.004, 0.010], [0.5, 0.7])
    assert made["share"] == pytest.approx(1.5) and made["fixed_s"] == pytest.approx(0.002)
    assert made["overlap"] == pytest.approx(0.6) and made["settings"] == 2


def test_one_odd_setting_among_four_moves_neither():
    t1s = [0.004, 0.008, 0.016, 0.032]
    remainders = [0.5 * t + 0.002 for t in t1s]
    remainders[1] += 0.010  # one setting 10 ms slow
    made = step_model.calibrate(t1s, remainders, [math.nan] * 4)
    assert made["share"] == pytest.approx(1.5) and made["fixed_s"] == pytest.approx(0.002)
    assert math.isnan(made["overlap"])  # none priced (no fit): no overlap


@pytest.mark.parametrize(
    "t1s, remainders",
    [
        ([0.004], [0.002]),  # one batch: cannot tell a share from a fixed cost
        ([0.004, 0.016], [0.004, 0.002]),  # a remainder that falls with the batch: noise
        ([0.004, 0.016], [0.001, 0.010]),  # a line that starts below 0 (fixed -2 ms): noise
    ],
)
def test_what_cannot_be_told_apart_is_taken_as_the_hosts_share(t1s, remainders):
    made = step_model.calibrate(t1s, remainders, [0.5] * len(t1s))
    assert made["fixed_s"] == 0
    ratios = [r / t for r, t in zip(remainders, t1s, strict=True)]
    assert made["share"] == pytest.approx(1 + statistics.median(ratios))
