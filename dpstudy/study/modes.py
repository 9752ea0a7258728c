"""Every fact of every mode, in one table of data (no torch): what a mode is, read here and
nowhere else.

A mode (`TABLE`) runs as one process or one process per device, takes its backends, and spreads
the model in one or more ways, its shards: each (mode, shard) is a `Scheme`, the unit the step
model prices, the memory plan predicts and the report names. Validation (dpstudy.study.spec), the
schema's enums (dpstudy.study.schema), the memory plan, the step model and its breakdown, the
forecasts, the report's phrases and the figures' legends all read this table; the engine's mode
classes (dpstudy.engine.modes) implement it, one class per mode. docs/extending.md lists what a
new mode adds: a row here, a class there, a probe, tests.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

NO_SHARD = "none"  # the shard of a mode that does not shard
NO_BACKEND = "none"  # the backend of a mode without a process group
PROCESS_GROUP_BACKENDS = ("nccl", "gloo")
STATE = ("params", "grads", "optimizer")  # the model state a scheme keeps whole or sharded


@dataclass(frozen=True)
class Collective:
    """One collective of a step as the step model prices it: comm_bench's operation, called once
    per message of the layout's `count` (buckets, units), moving the layout's `size` bytes in all
    (grad_bytes, gather_bytes: dpstudy.analysis.step_model.layout_of)."""

    op: str
    count: str
    size: str


@dataclass(frozen=True)
class Scheme:
    """One way of a mode to spread the model: a step's collectives and what each device holds.

    `sharded`: the parts of the model state (STATE) each device holds 1 / degree of, the rest it
    holds whole; the degree is the world size, or under `over` "replica" the devices of one replica
    (HSDP: devices / replicate). `master`: the scheme keeps an fp32 copy of its shard of the
    parameters beside the model's (DeepSpeed's ZeRO optimizer). `buckets`: it holds one more copy
    of the gradients outside the step (DDP's reducer). `collectives` are what the step model
    prices; a scheme with `unpriced` (the reason) is calibrated for its breakdown but never
    forecast."""

    shard: str
    label: str  # after the mode's label in the report: "full" in "FSDP full"; "" for none
    collectives: tuple[Collective, ...] = ()
    unpriced: str = ""
    sharded: tuple[str, ...] = ()
    over: str = "world"
    master: bool = False
    buckets: bool = False
    knobs: tuple[str, ...] = ()  # settings of this shard only (hybrid: replicate)
    description: str = ""


@dataclass(frozen=True)
class ModeFacts:
    """One mode's facts. `processes`: "one" (one process drives the cell's devices) or
    "per_device" (torchrun starts one per device, in a process group over one of `backends`, on
    one node or several). `memory` is how the memory plan predicts it (dpstudy.workflow.memory_plan):
    "plain" (the model's own step at the per-device batch, the scheme's facts added), "dp"
    (DataParallel's device 0 gathers the batch), "fake" (the mode itself on fake tensors over a
    fake process group). `needs_cuda`: why it runs on GPUs only; `extra`: the optional package it
    needs, as `pip install dpstudy[<extra>]` names it, and `package` its import name."""

    name: str
    label: str  # the report's: "DDP"
    full_name: str  # what implements it: "DistributedDataParallel"
    description: str
    processes: str
    schemes: tuple[Scheme, ...]  # the first is the default shard
    memory: str = "plain"
    one_device: bool = False  # the baseline every speedup is measured against
    needs_cuda: str = ""
    transfers: bool = False  # its step copies batches and replicas (DP): priced as transfers
    knobs: tuple[str, ...] = ()  # settings of this mode only (None for every other mode)
    extra: str | None = None
    package: str | None = None
    no_compile: str = ""  # why it refuses compile: true
    by_shard: dict[str, Scheme] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "by_shard", {s.shard: s for s in self.schemes})

    @property
    def backends(self) -> tuple[str, ...]:
        return PROCESS_GROUP_BACKENDS if self.per_device else (NO_BACKEND,)

    @property
    def per_device(self) -> bool:
        return self.processes == "per_device"

    @property
    def shards(self) -> tuple[str, ...]:
        return tuple(self.by_shard)

    @property
    def default_shard(self) -> str:
        return self.schemes[0].shard


# DistributedDataParallel's arguments a study may set (schema $defs/settings); None: DDP's default,
# the only value of the other modes.
DDP_KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "broadcast_buffers", "static_graph")
GATHER, SCATTER = Collective("all_gather", "units", "gather_bytes"), Collective("reduce_scatter", "units", "grad_bytes")

TABLE: dict[str, ModeFacts] = {
    mode.name: mode
    for mode in (
        ModeFacts(
            "single",
            "one device",
            "one device",
            "one device, one process",
            "one",
            (Scheme(NO_SHARD, ""),),
            one_device=True,
        ),
        ModeFacts(
            "dp",
            "DP",
            "nn.DataParallel",
            "nn.DataParallel: one process drives every GPU of the cell",
            "one",
            (Scheme(NO_SHARD, "", unpriced="its scatter, replicate and gather"),),
            memory="dp",
            needs_cuda="nn.DataParallel splits batches over GPUs only",
            transfers=True,
        ),
        ModeFacts(
            "ddp",
            "DDP",
            "DistributedDataParallel",
            "DistributedDataParallel via torchrun",
            "per_device",
            (Scheme(NO_SHARD, "", (Collective("all_reduce", "buckets", "grad_bytes"),), buckets=True),),
            knobs=DDP_KNOBS,
        ),
        ModeFacts(
            "fsdp",
            "FSDP",
            "FSDP2's fully_shard",
            "fully_shard (FSDP2) per block and at the root, via torchrun",
            "per_device",
            (
                Scheme(
                    "full",
                    "full",
                    (GATHER, GATHER, SCATTER),
                    sharded=STATE,
                    description="parameters re-gathered for backward, like ZeRO-3",
                ),
                Scheme(
                    "grad_op",
                    "grad_op",
                    (GATHER, SCATTER),
                    sharded=STATE,
                    description="parameters kept from forward to backward, like ZeRO-2",
                ),
                Scheme(
                    "hybrid",
                    "hybrid",
                    unpriced="its two-level collectives",
                    sharded=STATE,
                    over="replica",
                    knobs=("replicate",),
                    description=(
                        "HSDP: `replicate` replicas, each sharded full over devices / replicate devices, "
                        "their gradients all-reduced between replicas"
                    ),
                ),
            ),
            memory="fake",
        ),
    )
}
# The plainest process-group scheme: the one whose calibration a priced scheme that did not run
# borrows (the same ranks on the same host and backend), and the one the backends figure compares.
REFERENCE = ("ddp", NO_SHARD)
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


def missing_extra(mode_name: str) -> str | None:
    """Why this Python cannot run the mode (its optional package is not installed), or None."""
    of = TABLE[mode_name]
    if of.package is None or importlib.util.find_spec(of.package) is not None:
        return None
    return (
        f"mode {mode_name!r} needs the optional package {of.package!r}: install dpstudy's extra "
        f"{of.extra!r} (make setup EXTRAS=...,{of.extra}, or pip install 'dpstudy[{of.extra}]')"
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
