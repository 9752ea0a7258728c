"""Whether a run learned: a verdict on its epochs, beside its status.

A cell at `lr: 80` ran to the end with a training loss of 137 and 10 % test accuracy on 10
classes: `ok` (its throughput is a measurement like any other) but no model to speak of. The
verdict is `learned: false` with the first of these reasons, else `learned: true`:
- a loss that is not finite (nan, inf) in some epoch;
- a training loss that ended above the first epoch's (several epochs);
- a final test accuracy at chance: at most 1/classes plus three binomial standard deviations of
  the test set's size (10 classes, 2,000 test images: up to 12.0 %), so that a small test set does
  not call a model that learned a little a failure, nor chance a success;
- for a text, a final test loss at or above the unigram entropy of its tokens (`chance_loss`): no
  better than predicting every token by its frequency, so nothing of the context was learned.
The engine writes it into record.summary (`learned`, `learned_reason`); the report keeps such
cells out of accuracy comparisons and out of its fastest verdicts.
"""

from __future__ import annotations

import math

CHANCE_SDS = 3.0  # how many binomial standard deviations above 1/classes still count as chance


def chance_ceiling(classes: int, test_samples: int) -> float:
    """The highest test accuracy that is still chance for `classes` on `test_samples` images."""
    p = 1.0 / classes
    return p + CHANCE_SDS * math.sqrt(p * (1 - p) / max(test_samples, 1))


def verdict(
    epochs: list[dict], classes: int, test_samples: int, chance_loss: float | None = None
) -> tuple[bool, str | None]:
    """(learned, why not) of a run's epochs (record.epochs); a run without epochs learned nothing
    to judge: (True, None), as its status already says what happened. `chance_loss` (text): the
    loss of predicting by frequency alone, which replaces chance accuracy."""
    for e in epochs:
        for key, name in (("train_loss", "training loss"), ("test_loss", "test loss")):
            value = e.get(key)
            if value is not None and not math.isfinite(value):
                # The epoch, not the step: the loss is summed on the device and read once an epoch,
                # as a per-step check would sync the host every step (dpstudy.engine.train).
                return False, f"{name} became {value} in epoch {e['epoch']}"
    if not epochs:
        return True, None
    first, last = epochs[0], epochs[-1]
    if len(epochs) > 1 and last["train_loss"] > first["train_loss"]:
        return False, (
            f"training loss rose from {first['train_loss']:.4g} (epoch {first['epoch']}) "
            f"to {last['train_loss']:.4g} (epoch {last['epoch']})"
        )
    if chance_loss is not None:
        if last["test_loss"] >= chance_loss:
            return False, (
                f"final test loss {last['test_loss']:.3f} nats is no better than predicting every token by its "
                f"frequency ({chance_loss:.3f} nats, the unigram entropy of the training text)"
            )
        return True, None
    ceiling = chance_ceiling(classes, test_samples)
    if classes > 1 and test_samples > 0 and last["test_acc"] <= ceiling:
        return False, (
            f"final test accuracy {100 * last['test_acc']:.1f} % is chance for {classes} classes "
            f"(at most {100 * ceiling:.1f} % on {test_samples:,} test images)"
        )
    return True, None
