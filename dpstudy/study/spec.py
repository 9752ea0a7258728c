"""A cell spec: the complete settings one training run takes (docs/design.md, Cells).

`load_spec` accepts inline JSON or a path, rejects unknown keys and bad values with an error
naming the key, fills the documented defaults from dpstudy/study/schema.yaml and checks the rules that
JSON Schema cannot express (registries, backend per mode, batch divisibility).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpstudy.study import modes, schema
from dpstudy.util.errors import ConfigError


def load_spec(text_or_path: str) -> dict[str, Any]:
    """Parse a SPEC argument: a JSON object inline, or the path of a JSON file."""
    text = text_or_path.strip()
    if not text.startswith("{"):
        path = Path(text_or_path)
        if not path.is_file():
            raise ConfigError(f"spec {text_or_path!r} is neither a JSON object nor a file")
        text = path.read_text()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"spec is not valid JSON: {e}") from None
    return complete(raw)


def complete(raw: dict[str, Any], where: str = "spec: ") -> dict[str, Any]:
    """Validate a spec and return it with every default filled in, keys sorted."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}expected a JSON object, got {type(raw).__name__}")
    schema.check(raw, "spec", where)
    spec = {**schema.defaults("spec"), **raw}
    if "shard" not in raw:  # fsdp without a shard shards full; the other modes take none
        spec["shard"] = shard_of(spec["mode"], spec["shard"])
    check_rules(spec, where)
    return dict(sorted(spec.items()))


def check_rules(cell: dict[str, Any], where: str = "") -> None:
    """The cross-key rules of a cell; `where` prefixes the message (e.g. the sweep's name)."""
    from dpstudy import models

    try:
        kind = models.kind(cell["model"])
    except ConfigError as error:
        raise ConfigError(f"{where}{error}") from None
    if cell.get("model_args") and kind == "registry":
        models.check_args(cell["model"], cell["model_args"], where)  # the keys its ModelInfo.args name
    gap = setup_gap(cell) or modes.missing_extra(cell["mode"]) or device_gap(cell)
    if gap:
        raise ConfigError(where + gap)
    gpus, nodes = cell["gpus"], cell.get("nodes", 1)
    if cell.get("batch_scope") == "global" and cell["batch"] % devices(cell):
        over = f"gpus {gpus}" if nodes == 1 else f"nodes x gpus {devices(cell)}"
        raise ConfigError(f"{where}batch {cell['batch']} is not divisible by {over} under batch_scope 'global'")
    if cell.get("workers", 0) and cell.get("loader") != "torch":
        raise ConfigError(f"{where}workers {cell['workers']} needs loader 'torch'")
    gap = replicate_gap(cell) or knob_gap(cell)
    if gap:
        raise ConfigError(where + gap)


# What each mode is (its processes, backends, shards, knobs) is dpstudy.study.modes' table.


def setup_gap(cell: dict[str, Any]) -> str | None:
    """Why a cell's mode, gpus, nodes, backend and shard do not go together, or None: the one
    statement of these rules (spec validation raises it, a sweep's grid prunes by it)."""
    mode, gpus, backend, nodes = cell["mode"], cell["gpus"], cell["backend"], cell.get("nodes", 1)
    facts, shard = modes.TABLE[mode], cell.get("shard", modes.NO_SHARD)
    if facts.one_device and gpus != 1:
        return f"mode {mode!r} needs gpus 1, got gpus {gpus}"
    if backend not in facts.backends:
        verb = "takes" if len(facts.backends) == 1 else "needs"
        return f"mode {mode!r} {verb} backend {modes.listed(repr(b) for b in facts.backends)}, got backend {backend!r}"
    if nodes > 1 and not facts.per_device:
        spanning = modes.listed(modes.per_device_modes(), "and")
        return f"mode {mode!r} runs as one process on one node, got nodes {nodes}; only {spanning} span nodes"
    if shard not in facts.shards:
        if facts.shards == (modes.NO_SHARD,):
            sharding = modes.sharding_modes()
            who = f"{modes.listed(sharding, 'and')} {'shards' if len(sharding) == 1 else 'shard'}"
            return f"mode {mode!r} takes shard 'none' (only {who}), got shard {shard!r}"
        takes = modes.listed(repr(s) for s in facts.shards)
        return f"mode {mode!r} needs shard {takes}, got shard {shard!r}"
    if facts.no_compile and cell.get("compile"):
        return f"compile: true is not supported with mode {mode!r}: {facts.no_compile}"
    return None


def device_gap(cell: dict[str, Any]) -> str | None:
    """Why a mode cannot use the cell's backend on the device the cell names (DeepSpeed on CUDA
    communicates over NCCL only), or None; device auto is decided where the cell runs (hardware_gap)."""
    facts = modes.TABLE[cell["mode"]]
    if cell.get("device") == "cuda" and cell["backend"] not in (*facts.cuda_backends, modes.NO_BACKEND):
        return cuda_backend_gap(cell["mode"], cell["backend"])
    return None


def cuda_backend_gap(mode: str, backend: str) -> str:
    takes = modes.listed(modes.TABLE[mode].cuda_backends)
    return f"mode {mode!r} on CUDA communicates over {takes} only, got backend {backend!r} (gloo runs on device cpu)"


def knob_gap(cell: dict[str, Any]) -> str | None:
    """Why a setting of one mode (DDP's knobs) or one shard (ZeRO-3's) is set on a cell of
    another, or None."""
    facts = modes.TABLE[cell["mode"]]
    mine = modes.scheme(cell["mode"], cell.get("shard")).knobs
    for owner in modes.TABLE.values():
        for key in owner.knobs:
            if key not in facts.knobs and cell.get(key) is not None:
                return (
                    f"{key} {json.dumps(cell[key])} is {owner.full_name}'s: mode {owner.name} only, "
                    f"not mode {cell['mode']!r} (leave it null)"
                )
        for scheme in owner.schemes:
            for key in (k for k in scheme.knobs if k not in mine and cell.get(k) is not None):
                return (
                    f"{key} {json.dumps(cell[key])} belongs to shard {scheme.shard!r} of mode {owner.name!r} only, "
                    f"got mode {cell['mode']!r} with shard {cell.get('shard')!r} (leave it null)"
                )
    return None


def replicate_gap(cell: dict[str, Any]) -> str | None:
    """Why a cell's replicate does not go with its shard and devices, or None: the one statement
    of these rules. replicate is shard hybrid's only; hybrid needs 2 or more replicas (one is
    shard full), each of 2 or more devices (one device a replica is DDP), and the devices divided
    evenly; null means one replica per node, so on one node it must be given."""
    shard, replicate, n = cell.get("shard", modes.NO_SHARD), cell.get("replicate"), devices(cell)
    if "replicate" not in modes.scheme(cell["mode"], shard).knobs:
        if replicate is None:
            return None
        owner, of = next((m, s) for m in modes.TABLE.values() for s in m.schemes if "replicate" in s.knobs)
        return (
            f"replicate {replicate} is the replica count of mode {owner.name!r} with shard {of.shard!r}, "
            f"got mode {cell['mode']!r} with shard {shard!r} (leave it null)"
        )
    count = replicas(cell)
    if count is None:
        return (
            f"shard 'hybrid' on one node needs replicate, the number of replicas its {n} devices form "
            "(each shards the model over devices / replicate); null means one replica per node"
        )
    if count < 2:
        return f"replicate {count} is one replica, which is shard 'full'; shard 'hybrid' needs replicate 2 or more"
    if n % count:
        return f"replicate {count} does not divide the cell's {n} devices (nodes x gpus)"
    if n // count < 2:
        return (
            f"replicate {count} over {n} devices leaves one device a replica, nothing to shard; "
            "shard 'hybrid' needs 2 or more devices a replica (a replica a device is mode ddp)"
        )
    return None


def replicas(spec: dict[str, Any]) -> int | None:
    """The replicate degree of a shard hybrid cell: its replicate, else its nodes when it spans
    several (one replica per node); None on one node without replicate (replicate_gap says so)."""
    if spec.get("replicate") is not None:
        return spec["replicate"]
    nodes = spec.get("nodes", 1)
    return nodes if nodes > 1 else None


def backend_of(mode: str, backend: str) -> str:
    """The backend a cell of `mode` runs with: none for the one-process modes."""
    return backend if modes.TABLE[mode].per_device else modes.NO_BACKEND


def shard_of(mode: str, shard: str) -> str:
    """The sharding a cell of `mode` runs with: its own where the mode takes it, else the mode's
    default (fsdp: full; the other modes: none)."""
    return modes.shard_of(mode, shard)


def one_process_per_device(spec: dict[str, Any]) -> bool:
    """torchrun starts one process per device (ddp, fsdp), each with its share of the batch."""
    return modes.TABLE[spec["mode"]].per_device


def devices(spec: dict[str, Any]) -> int:
    """Devices the cell trains on: gpus per node times nodes (the world size of ddp and fsdp)."""
    return spec["gpus"] * spec.get("nodes", 1)


def per_device_batch(spec: dict[str, Any]) -> int:
    """Samples each device sees per step."""
    return spec["batch"] // devices(spec) if spec["batch_scope"] == "global" else spec["batch"]


def global_batch(spec: dict[str, Any]) -> int:
    return per_device_batch(spec) * devices(spec)


def scaled_lr(spec: dict[str, Any]) -> float:
    return spec["lr"] * devices(spec) if spec["lr_scaling"] == "linear" else spec["lr"]


def hardware_gap(spec: dict[str, Any], visible_gpus: int) -> str | None:
    """Why this machine cannot run the cell with `visible_gpus` CUDA devices, or None.

    The one statement of these rules: the engine asks it with torch's device count before a
    process group exists, and the launcher asks it without starting torch when its job reserved
    no GPU (the cell then sees none)."""
    wants_cuda = spec["device"] == "cuda" or (spec["device"] == "auto" and visible_gpus > 0)
    if spec["device"] == "cuda" and visible_gpus == 0:
        return "device 'cuda' was requested but no CUDA device is visible"
    needs_cuda = modes.TABLE[spec["mode"]].needs_cuda
    if needs_cuda and not wants_cuda:
        return f"mode {spec['mode']} needs CUDA: {needs_cuda}"
    if spec["backend"] == "nccl" and not wants_cuda:
        return "backend nccl needs CUDA GPUs; on CPU only gloo runs"
    if wants_cuda and spec["backend"] not in (*modes.TABLE[spec["mode"]].cuda_backends, modes.NO_BACKEND):
        return cuda_backend_gap(spec["mode"], spec["backend"])
    if wants_cuda and spec["gpus"] > visible_gpus:
        return f"the cell needs {spec['gpus']} GPUs but {visible_gpus} are visible"
    return None


def gap_before_start(spec: dict[str, Any], job_gpus: int) -> str | None:
    """Why the cell cannot run, when that is known before torch starts: its job reserved no GPU
    (`job_gpus` 0), so it sees none (dpstudy.jobs.gpus.job_environment). The launcher writes
    such a cell's skipped record without training, and the workflow gives that job one core."""
    return hardware_gap(spec, 0) if job_gpus == 0 else None
