"""The step model's parts and its calibration (dpstudy.analysis.step_model) on numbers whose answer is known."""

import math

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


def test_one_batch_cannot_tell_a_share_from_a_fixed_cost_and_takes_the_share():
    made = step_model.calibrate([0.004], [0.002], [0.5])
    assert made["share"] == pytest.approx(1.5) and made["fixed_s"] == 0


def test_a_line_the_measurements_bend_below_physics_is_kept_as_measured():
    # a remainder that falls with the batch (a share below 1) and one that starts below 0 (a negative fixed
    # cost): an overstated exposed time, shown, not forced to 0 (the residual stays 0 on two settings)
    falling = step_model.calibrate([0.004, 0.016], [0.004, 0.002], [0.5, 0.5])
    assert falling["share"] == pytest.approx(1 - 1 / 6) and falling["fixed_s"] == pytest.approx(0.004 + 0.004 / 6)
    negative = step_model.calibrate([0.004, 0.016], [0.001, 0.010], [0.5, 0.5])
    assert negative["share"] == pytest.approx(1.75) and negative["fixed_s"] == pytest.approx(-0.002)
