"""The kinds of fact a mode has (dpstudy.study.mode_table holds every mode's, dpstudy.study.modes
reads them): a `ModeFacts` per mode, a `Scheme` per way it spreads the model, the `Collective`s of a
step as the step model prices them. Data only: no torch, no behaviour."""

from __future__ import annotations

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
    of the gradients outside the step (DDP's reducer); `bucket` names the knob of the gradient
    bucket's elements it allocates whole (ZeRO's), `kept_whole` the one below whose elements a
    parameter stays whole on every device, `gathered` the one that bounds the elements it gathers
    and keeps live at once (ZeRO-3's, whose gathered parameters and their full gradients exist
    during the step beside the shards). `collectives` are what the step model
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
    bucket: str = ""  # the knob of the gradient bucket's elements, allocated whole (ZeRO's)
    kept_whole: str = ""  # the knob below whose elements a parameter is not sharded (ZeRO-3's)
    gathered: str = ""  # the knob bounding the parameters gathered at once, and their gradients (ZeRO-3's)
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
    casts_module: bool = False  # its module in the compute dtype (bf16, fp16), an fp32 master beside
    cuda_backends: tuple[str, ...] = PROCESS_GROUP_BACKENDS  # the backends it runs with on GPUs
    # whose probe fields (grad_bytes, buckets, ...) mean what its own do: a forecast of one of its
    # schemes reads the message layout of those modes' settings (DDP's and FSDP's are one: an FSDP
    # setting is forecast from DDP's cells); ZeRO counts its own
    layout: str = "torch"
    knob_defaults: dict = field(default_factory=dict)  # what a null knob means, for the memory plan
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


# The settings of one mode or one shard only, its knobs: each a JSON Schema of its value (null:
