"""Whether a run learned (dpstudy.record.learning): the verdict on its epochs, beside its status."""

from __future__ import annotations

import math

import pytest

from dpstudy.record import learning


def epochs(*rows):
    return [
        {"epoch": i + 1, "train_loss": loss, "test_loss": test_loss, "test_acc": acc}
        for i, (loss, test_loss, acc) in enumerate(rows)
    ]


def test_a_run_that_learned():
    assert learning.verdict(epochs((0.9, 0.5, 0.85), (0.3, 0.2, 0.95)), 10, 2000) == (True, None)


def test_the_lr_80_run_is_at_chance():
    # the cell: loss 137, 10.0 % on 10 classes (2,000 test images: chance is up to 12.0 %)
    learned, why = learning.verdict(epochs((150.0, 140.0, 0.098), (137.0, 139.0, 0.100)), 10, 2000)
    assert not learned
    assert why == "final test accuracy 10.0 % is chance for 10 classes (at most 12.0 % on 2,000 test images)"


def test_a_non_finite_loss_names_its_epoch_first():
    learned, why = learning.verdict(epochs((2.0, 1.0, 0.5), (math.nan, math.nan, 0.1)), 10, 2000)
    assert (learned, why) == (False, "training loss became nan in epoch 2")
    learned, why = learning.verdict(epochs((2.0, math.inf, 0.5)), 10, 2000)
    assert (learned, why) == (False, "test loss became inf in epoch 1")


def test_a_training_loss_that_rose():
    learned, why = learning.verdict(epochs((0.5, 0.4, 0.9), (0.8, 0.6, 0.9)), 10, 2000)
    assert (learned, why) == (False, "training loss rose from 0.5 (epoch 1) to 0.8 (epoch 2)")


@pytest.mark.parametrize(
    "classes, test_samples, accuracy, learned",
    [
        (10, 2000, 0.121, True),  # above 10 % + 3 sd (0.67 points): better than chance
        (10, 2000, 0.119, False),
        (3, 36, 0.55, False),  # 36 test images: 57 % is still within chance for 3 classes
        (3, 36, 0.60, True),
        (2, 0, 0.5, True),  # no test-set size known: no chance verdict
    ],
)
def test_chance_depends_on_the_classes_and_the_test_set_s_size(classes, test_samples, accuracy, learned):
    assert learning.verdict(epochs((1.0, 1.0, accuracy)), classes, test_samples)[0] is learned


def test_no_epochs_no_verdict():
    assert learning.verdict([], 10, 2000) == (True, None)
