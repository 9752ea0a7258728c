"""How gpu-check's figures read and are judged: their formats (FORMATS), a figure's target
(Target) and the figure itself (Figure). No torch here: the summary is written on any machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ---- how figures read -------------------------------------------------------------------------


def _number(value: float, digits: int = 3) -> str:
    """A few significant digits with thousands separators: 41,200 / 3.35 / 0.0123."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    text = f"{round(value, decimals):,.{max(0, decimals)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _percent(share: float) -> str:
    pct = 100 * share
    return f"{_number(pct, 2)} %" if abs(pct) < 10 else f"{pct:.0f} %"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def _bytes_per_s(bps: float) -> str:
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if abs(bps) >= scale:
            return f"{_number(bps / scale)} {unit}"
    return f"{bps:.0f} B/s"


def _flops(flops: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(flops) >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.0f} FLOP"


FORMATS: dict[str, Callable[[Any], str]] = {
    "count": lambda v: f"{int(v):,}",
    "img_per_s": lambda v: f"{_number(v)} img/s",
    "samples_per_s": lambda v: f"{_number(v)} samples/s",
    "tokens_per_s": lambda v: f"{_number(v)} tokens/s",
    "ratio": lambda v: f"{_number(v)}x",
    "share": _percent,
    "duration": _duration,
    "bytes_per_s": _bytes_per_s,
    "gb_per_s": lambda v: f"{_number(v)} GB/s",
    "tflops": lambda v: f"{_number(v)} TFLOP/s",
    "flop": _flops,
    "ms": lambda v: f"{_number(v)} ms",
    "us": lambda v: f"{_number(v)} µs",
    "mb": lambda v: f"{_number(v)} MB",
    "bool": lambda v: "yes" if v else "no",
}


@dataclass(frozen=True)
class Target:
    """A figure's target: `op` one of >=, >, <=, <, ==, true; `text` overrides how it reads."""

    op: str
    value: Any = True
    text: str | None = None

    def met(self, measured: Any) -> bool:
        if measured is None:
            return False
        if self.op == "true":
            return measured is True
        if isinstance(measured, (int, float)) and not math.isfinite(measured):
            return False
        return {
            ">=": measured >= self.value,
            ">": measured > self.value,
            "<=": measured <= self.value,
            "<": measured < self.value,
            "==": measured == self.value,
        }[self.op]

    def describe(self, fmt: str) -> str:
        if self.text:
            return self.text
        symbol = {">=": "≥", ">": ">", "<=": "≤", "<": "<", "==": "="}[self.op]
        return f"{symbol} {FORMATS[fmt](self.value)}"


@dataclass(frozen=True)
class Figure:
    key: str  # in the raw file's "figures"
    label: str
    fmt: str  # a key of FORMATS
    target: Target | None = None
