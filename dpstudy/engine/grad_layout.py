"""How a mode moves a model's gradients and parameters: DDP's buckets and FSDP's units, in bytes.

A forecast prices communication per message, each with its latency (dpstudy.analysis.comm_fit),
not as one all-reduce of the whole gradient: ResNet-18's 44.7 MB go out as 3 DDP buckets, LeNet's
0.25 MB as 1, and at a few tens of microseconds per call on Gloo the count matters for small models.
Everything here reads shapes and dtypes only, so a model built on the meta device (no memory, no
data) gives the same layout as the trained one.

DDP (torch.nn.parallel.DistributedDataParallel, torch >= 2.9): the first iteration runs with one
bucket, then the reducer rebuilds its buckets in the order the gradients became ready, at most
`first_bucket_mb` (1 MiB by default) for the first and `bucket_cap_mb` (25) for the rest. Gradients
become ready roughly in reverse order of the parameters, so the buckets here are assigned over the
parameters reversed, by torch's own `_compute_bucket_assignment_by_size`, the function the reducer
uses; the steady state's plan therefore matches DDP's wherever backward runs the layers in reverse.
The small first bucket is DDP's only where bucket_cap_mb is left at its default (None): a cap
given, even 25, caps the first bucket alike (BucketCapacityConfig).

FSDP (dpstudy.engine.modes.fsdp): one all-gather (before forward, again before backward when shard
is full) and one reduce-scatter per unit, a unit being a block of `shard_units` or the root with
what no block holds.
"""

from __future__ import annotations

import torch
import torch.nn as nn

MIB = 1 << 20
DEFAULT_BUCKET_CAP_MB = 25  # what DistributedDataParallel's bucket_cap_mb=None means


def first_bucket_bytes() -> int:
    """DDP's cap on the first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB)."""
    import torch.distributed as dist

    return int(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MIB))


def nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def ddp_buckets(model: nn.Module, bucket_cap_mb: float | None = None) -> list[int]:
    """Bytes of each bucket DDP all-reduces in a steady step, in the order they go out (the last
    layers' first), for DDP's `bucket_cap_mb` (None: its default)."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return []
    ready = list(reversed(params))  # the order backward finishes them in, roughly
    cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MIB)
    limits = [first_bucket_bytes(), cap] if bucket_cap_mb is None else [cap]
    buckets, _ = dist._compute_bucket_assignment_by_size(ready, limits, [False] * len(ready))
    return [nbytes(ready[i] for i in bucket) for bucket in buckets]


def fsdp_units(model: nn.Module) -> list[int]:
    """Bytes of the parameters of each FSDP unit (unsharded), the blocks' first and the root's
    (what no block holds) last; a root that holds nothing is left out."""
    from dpstudy.engine.modes.fsdp import shard_units

    units = shard_units(model)
    inside = {id(p) for unit in units for p in unit.parameters()}
    sizes = [nbytes(unit.parameters()) for unit in units]
    root = nbytes(p for p in model.parameters() if id(p) not in inside)
    return sizes + ([root] if root else [])


def on_meta(build) -> nn.Module:
    """The model `build()` makes, on the meta device: shapes without memory."""
    with torch.device("meta"):
        return build()
