"""What a mode is, read from one table of data (no torch): dpstudy.study.mode_table's rows, each of
the kinds dpstudy.study.mode_facts defines, and the questions every other module asks of them.

A mode (`TABLE`) runs as one process or one process per device, takes its backends, and spreads
the model in one or more ways, its shards: each (mode, shard) is a `Scheme`, the unit the step
model prices, the memory plan predicts and the report names. Validation (dpstudy.study.spec), the
schema's enums (dpstudy.study.schema), the memory plan, the step model and its breakdown, the
forecasts, the report's phrases and the figures' legends all ask here; the engine's mode classes
(dpstudy.engine.modes) implement the rows, one class per mode. Outside these and those classes no
module compares a mode's name. docs/extending.md lists what a new mode adds.
"""

from __future__ import annotations

import functools
import importlib.util

from dpstudy.study.mode_facts import NO_BACKEND, NO_SHARD, PROCESS_GROUP_BACKENDS, STATE, ModeFacts, Scheme
from dpstudy.study.mode_table import DDP_KNOBS, KNOBS, REFERENCE, TABLE

__all__ = [
    "BASELINE",
    "DDP_KNOBS",
    "KNOBS",
    "NO_BACKEND",
    "NO_SHARD",
    "PROCESS_GROUP_BACKENDS",
    "REFERENCE",
    "SHARDS",
    "STATE",
    "TABLE",
    "ModeFacts",
    "Scheme",
]

SHARDS = tuple(dict.fromkeys(s for mode in TABLE.values() for s in mode.shards))
BASELINE = next(name for name, mode in TABLE.items() if mode.one_device)


def scheme(mode_name: str, shard: str | None = None) -> Scheme:
    """The scheme of a mode and shard; a mode's default where the shard is missing or not its own
    (an fsdp setting without a shard shards full)."""
    of = TABLE[mode_name]
    return of.by_shard.get(shard if isinstance(shard, str) else "", of.schemes[0])


def scheme_name(mode_name: str, shard: str | None = None) -> str:
    """'ddp', 'fsdp full': the mode, then its shard where it has shards."""
    made = scheme(mode_name, shard)
    return mode_name if made.shard == NO_SHARD else f"{mode_name} {made.shard}"


def of_scheme(name: str) -> tuple[ModeFacts, Scheme]:
    """The mode and scheme of a scheme_name."""
    mode_name, _, shard = name.partition(" ")
    return TABLE[mode_name], scheme(mode_name, shard or NO_SHARD)


def schemes() -> list[str]:
    """Every scheme's name, in the table's order."""
    return [scheme_name(m.name, s.shard) for m in TABLE.values() for s in m.schemes]


def multi_device_schemes() -> list[str]:
    """The schemes of the modes that run on several devices."""
    return [name for name in schemes() if not of_scheme(name)[0].one_device]


def priced_schemes() -> list[str]:
    """The schemes the step model prices and forecasts."""
    return [name for name in schemes() if of_scheme(name)[1].collectives and not of_scheme(name)[1].unpriced]


def forecast_modes() -> list[str]:
    """The modes with a scheme the step model forecasts."""
    return list(dict.fromkeys(of_scheme(name)[0].name for name in priced_schemes()))


def transfer_modes() -> list[str]:
    """The modes whose step copies batches and replicas (DP), priced as transfers."""
    return [name for name, m in TABLE.items() if m.transfers]


def per_device_modes() -> list[str]:
    return [name for name, m in TABLE.items() if m.per_device]


def one_process_modes() -> list[str]:
    return [name for name, m in TABLE.items() if not m.per_device]


def sharding_modes() -> list[str]:
    """The modes that take a shard other than none."""
    return [name for name, m in TABLE.items() if m.shards != (NO_SHARD,)]


def shard_of(mode_name: str, shard: str | None) -> str:
    """The shard a cell of the mode runs with: its own where the mode takes it, else the mode's default."""
    return scheme(mode_name, shard).shard


def knobs() -> tuple[str, ...]:
    """Every setting that belongs to one mode or one shard (None or missing for the others)."""
    return tuple(dict.fromkeys(k for m in TABLE.values() for k in (*m.knobs, *(k for s in m.schemes for k in s.knobs))))


def degree(scheme_: Scheme, devices: int, replicas: int | None) -> int:
    """Over how many devices the scheme's sharded state is split."""
    if not scheme_.sharded:
        return 1
    return devices // replicas if scheme_.over == "replica" and replicas else devices


def state_share(scheme_: Scheme, part: str, devices: int, replicas: int | None = None) -> float:
    """The share of a model state part (STATE) one device holds: 1, or 1 / the degree where sharded."""
    return 1 / degree(scheme_, devices, replicas) if part in scheme_.sharded else 1.0


def display(mode_name: str, shard: str | None = None) -> str:
    """'DP', 'DDP', 'FSDP full': the mode's label, then its shard's."""
    made = scheme(mode_name, shard)
    return f"{TABLE[mode_name].label}{f' {made.label}' if made.label else ''}"


@functools.cache
def missing_extra(mode_name: str) -> str | None:
    """Why this Python cannot run the mode (its optional package is not installed), or None."""
    of = TABLE[mode_name]
    if of.package is None or importlib.util.find_spec(of.package) is not None:
        return None
    return (
        f"mode {mode_name!r} needs the optional package {of.package!r}, which this Python lacks: dpstudy's "
        f"extra {of.extra!r} (make setup installs it unless EXTRAS leaves it out; pip install 'dpstudy[{of.extra}]')"
    )


def listed(names, last: str = "or") -> str:
    """'a', 'a or b', 'a, b or c'."""
    names = [str(n) for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def variants() -> list[str]:
    """Every figure legend's variant (dpstudy.report.figures.layout.labelled) in the table's order:
    the scheme, then the backend of a mode with a process group."""
    return [
        name if backend == NO_BACKEND else f"{name}/{backend}"
        for name in schemes()
        for backend in sorted(of_scheme(name)[0].backends)
    ]
