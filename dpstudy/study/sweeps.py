"""A study config -> the cells table (docs/design.md, Cells), validated before any job exists."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dpstudy import models
from dpstudy.ext import arch as ext_arch
from dpstudy.study import datasets, forecast_requests, modes, schema
from dpstudy.study import spec as specs
from dpstudy.study.cells import cell_id
from dpstudy.util.errors import ConfigError

# The spec keys a sweep may vary besides the settings (schema $defs/settings).
SWEPT_SPEC_KEYS = ("mode", "gpus", "nodes", "batch", "backend", "shard")


class JsonDict(dict):
    """A key-sorted dict whose str() is JSON: `{params.spec:q}` in a shell command gives a quoted
    JSON object, while Snakemake's params trigger compares the repr, which depends on nothing
    but the content (not on the order in which config files were merged)."""

    def __init__(self, data: dict[str, Any]):
        super().__init__(sorted((k, sort_keys(v)) for k, v in data.items()))

    def __str__(self) -> str:
        return json.dumps(self, sort_keys=True)


def sort_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: sort_keys(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [sort_keys(v) for v in value]
    return value


@dataclass(frozen=True)
class Cell:
    id: str
    sweep: str
    spec: dict[str, Any]  # complete, key-sorted, plain types: the train rule's params
    resources: dict[str, Any]  # job_resources of the schema: what a scheduler is asked for

    @property
    def gpus(self) -> int:
        return self.spec["gpus"]

    def params(self) -> JsonDict:
        """The spec as the train rule's params: keys that hold nothing (model_args {}, code_path
        null) are left out, so that a setting added later reruns none of the cells made before it."""
        return JsonDict({k: v for k, v in self.spec.items() if v is not None and v != {}})


def load(config: dict[str, Any], config_files: Iterable[str] = ()) -> dict[str, Any]:
    """The validated study with every documented default filled in; `config_files` are the files
    it came from (the first one's folder is the default code_path)."""
    study = copy.deepcopy(config)
    sweeps = study.get("sweeps")
    for i, sweep in enumerate(sweeps if isinstance(sweeps, list) else []):
        # Checked one by one first, so that an error names the sweep rather than its index.
        label = sweep.get("name", f"#{i + 1}") if isinstance(sweep, dict) else f"#{i + 1}"
        schema.check(sweep, "sweep", where=f"sweep {label!r}: ")
    schema.check(study, where="config: ")
    for key, prop in schema.schema()["properties"].items():
        prop = schema.resolve(prop)
        if "default" in prop:
            study.setdefault(key, copy.deepcopy(prop["default"]))
        if prop.get("type") == "object" and "properties" in prop:  # e.g. ext, bench
            for inner, inner_prop in prop["properties"].items():
                if "default" in inner_prop:
                    study[key].setdefault(inner, inner_prop["default"])
    if study["ext"]["cuda_arch"] is not None:
        ext_arch.split(study["ext"]["cuda_arch"])  # the list syntax; the error names ext.cuda_arch
    if study["code_path"] is None:
        study["code_path"] = default_code_path(config_files)
    for name, overrides in study["datasets"].items():
        users = [sweep["name"] for sweep in study["sweeps"] if sweep["dataset"] == name]
        datasets.check_overrides(name, overrides, study["code_path"], used_by=users)
    for sweep in study["sweeps"]:
        datasets.check_named(sweep["dataset"], study["datasets"], f"sweep {sweep['name']!r}: ")
    names = [s["name"] for s in study["sweeps"]]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(f"config: sweep name {duplicated[0]!r} is used more than once")
    allowed = set(SWEPT_SPEC_KEYS) | set(schema.property_names("settings"))
    for sweep in study["sweeps"]:
        grid = sweep.get("grid", {})
        unknown = sorted(set(grid) - allowed)
        if unknown:
            raise ConfigError(
                f"sweep {sweep['name']!r}: unknown grid key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}"
            )
        for key, values in grid.items():  # before pruning compares them
            ref = "spec" if key in schema.property_names("spec") else "settings"
            for value in values:
                schema.check_property(ref, key, value, where=f"sweep {sweep['name']!r}: ")
    forecast_requests.requests(study)  # a setting the model cannot forecast: an error naming it
    return study


def default_code_path(config_files: Iterable[str]) -> str | None:
    """The folder of the study's config file (the first one), relative to the working directory
    when inside it: where the study's own models and dataset functions are imported from."""
    import os

    files = list(config_files)
    if not files:
        return None
    folder = os.path.dirname(os.path.abspath(files[0]))
    inside = not os.path.relpath(folder).startswith("..")
    return os.path.relpath(folder) if inside else folder


def sweep_combinations(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    grid = sweep.get("grid", {})
    keys = sorted(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def normalise(combo: dict[str, Any]) -> dict[str, Any] | None:
    """The combination as a cell runs it (the one-process modes take backend none, whatever the
    grid's backends; a mode without shards takes shard none, a sharding mode its default where
    the grid gives none), or None when it cannot run: another sharding mode's shard, or
    dpstudy.study.spec.setup_gap (single needs gpus 1, one-process modes run on one node,
    process-group modes need a backend)."""
    mode, shard = combo["mode"], combo.get("shard", modes.NO_SHARD)
    facts = modes.TABLE[mode]
    if shard not in (*facts.shards, modes.NO_SHARD) and facts.shards != (modes.NO_SHARD,):
        return None  # e.g. fsdp's full beside deepspeed's stages in one grid: each mode its own
    combo = {**combo, "backend": specs.backend_of(mode, combo["backend"]), "shard": specs.shard_of(mode, shard)}
    return None if specs.setup_gap(combo) else combo


def dataset_of(study: dict[str, Any], sweep: dict[str, Any]) -> str:
    """The sweep's dataset, or its generated stand-in when the study asks for one (config stand_in)."""
    from dpstudy.data.registry import DATASETS

    dataset = DATASETS.get(sweep["dataset"])
    return dataset.stand_in if study["stand_in"] and dataset and dataset.stand_in else sweep["dataset"]


def sweep_cells(study: dict[str, Any], sweep: dict[str, Any]) -> list[Cell]:
    where = f"sweep {sweep['name']!r}: "
    base = {**schema.defaults("settings"), **study["defaults"], **sweep.get("set", {})}
    if study["stand_in"]:  # a sweep made for GPUs, shrunk for a CPU
        base.update(sweep.get("stand_in_set", {}))
    dims = {**schema.defaults("spec"), "device": study["device"], "data_root": study["data_root"]}
    # The id names every key the sweep itself sets (grid or set): two sweeps that differ only in
    # a set value (say epochs 200 vs 100) then never claim the same id, and adding a sweep never
    # renames the cells of another.
    # repeats is not a setting of a cell: it shows as -r{k}
    varied = [k for k in (*sweep.get("grid", {}), *sweep.get("set", {})) if k != "repeats"]
    resources = {**study["resources"], **sweep.get("resources", {})}
    cells: list[Cell] = []
    for combo in sweep_combinations(sweep):
        settings = {**base, **combo}
        candidate = {k: settings.get(k, dims.get(k)) for k in SWEPT_SPEC_KEYS}
        candidate.setdefault("mode", settings.get("mode"))
        if candidate["mode"] is None:
            raise ConfigError(f"{where}no mode: give grid.mode ({', '.join(modes.TABLE)})")
        kept = normalise(candidate)
        if kept is None:
            continue
        repeats = settings.pop("repeats")
        raw = {
            **{k: v for k, v in settings.items() if k not in SWEPT_SPEC_KEYS},
            **kept,
            "dataset": dataset_of(study, sweep),
            "model": sweep["model"],
            "device": study["device"],
            "data_root": study["data_root"],
            "code_path": study["code_path"] if models.kind(sweep["model"]) == "factory" else None,
        }
        # a mode's or a shard's own settings (DDP's knobs, HSDP's replicate): the sweep's cells of
        # other modes and shards run without them
        own = {*modes.TABLE[kept["mode"]].knobs, *modes.scheme(kept["mode"], kept["shard"]).knobs}
        raw.update(dict.fromkeys(k for k in modes.knobs() if k not in own))
        for repeat in range(repeats):
            spec = specs.complete({**raw, "repeat": repeat}, where)
            cells.append(Cell(cell_id(spec, varied, repeats), sweep["name"], spec, resources))
    check_grid_modes(sweep, cells, where)
    return cells


def check_grid_modes(sweep: dict[str, Any], cells: list[Cell], where: str) -> None:
    """A sweep's grid that names what none of its modes can use: a process-group mode without a
    backend, nodes without a mode that spans them, a shard no mode of the grid takes, a mode's
    own settings without a cell of that mode."""
    grid = sweep.get("grid", {})
    named = [m for m in modes.TABLE if m in grid.get("mode", [])]
    per_device = [m for m in named if modes.TABLE[m].per_device]
    for mode in per_device:
        if not any(c.spec["mode"] == mode for c in cells):
            raise ConfigError(f"{where}mode {mode} needs backend nccl or gloo in grid.backend")
    most_nodes = max(grid.get("nodes", [1]))
    if most_nodes > 1 and not per_device:
        raise ConfigError(
            f"{where}nodes {most_nodes} needs mode {modes.listed(modes.per_device_modes())} in grid.mode: "
            f"{modes.listed(modes.one_process_modes(), 'and')} run as one process on one node"
        )
    for shard in grid.get("shard", []):
        takers = [m for m in modes.sharding_modes() if shard in modes.TABLE[m].shards]
        if shard != modes.NO_SHARD and not set(takers) & set(named):
            owner = f"mode {modes.listed(takers)}" if takers else "a sharding mode"
            raise ConfigError(f"{where}grid.shard {shard} needs {owner} in grid.mode: only it shards so")
    for owner in modes.TABLE.values():
        knobs = [
            f"{part}.{key}"
            for part in ("grid", "set")
            for key in owner.knobs
            if sweep.get(part, {}).get(key) is not None
        ]
        if knobs and not any(c.spec["mode"] == owner.name for c in cells):
            raise ConfigError(f"{where}{', '.join(knobs)} needs {owner.name} cells: {owner.full_name}'s arguments")


def expand(study: dict[str, Any]) -> list[Cell]:
    """Every cell of the study, duplicates collapsed, in sweep order."""
    cells: dict[str, Cell] = {}
    for sweep in study["sweeps"]:
        for cell in sweep_cells(study, sweep):
            seen = cells.get(cell.id)
            if seen is None:
                cells[cell.id] = cell
            elif seen.spec != cell.spec:
                differing = sorted(k for k in cell.spec if cell.spec[k] != seen.spec.get(k))
                raise ConfigError(
                    f"sweeps {seen.sweep!r} and {cell.sweep!r} both define cell {cell.id} with different "
                    f"{', '.join(differing)}; vary those keys in a grid or give the sweeps distinct grids"
                )
    return list(cells.values())


def run_priorities(cells: Iterable[Cell]) -> dict[str, int]:
    """Snakemake priorities (higher runs first) that interleave the repeats: every setting's repeat 0,
    then every setting's repeat 1, and so on, each round in sweep order. A slow drift of the machine
    (another job, a thermal or frequency change) then touches every setting alike instead of all the
    repeats of the one that happened to run at the time."""
    order = sorted(cells, key=lambda c: c.spec["repeat"])  # stable: sweep order within a round
    return {cell.id: len(order) - i for i, cell in enumerate(order)}


def floor_rounds(cells: Iterable[Cell], priorities: dict[str, int]) -> dict[int, int]:
    """{repeat round: Snakemake priority} of the machine's floor runs (dpstudy.microbench.floor): one
    per round where there are two rounds or more (a CV needs two runs), each at the lowest priority
    of its round's cells, above every later round's: the workflow runs it after its round's cells
    (its inputs) and before the next round's."""
    rounds: dict[int, int] = {}
    for cell in cells:
        repeat = cell.spec["repeat"]
        rounds[repeat] = min(rounds.get(repeat, priorities[cell.id]), priorities[cell.id])
    return dict(sorted(rounds.items())) if len(rounds) >= 2 else {}


def plain(value: Any) -> Any:
    """`value` with every mapping a dict and every sequence a list: Snakemake reads a JSON
    --configfile into OrderedDicts, which yaml.safe_dump refuses."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def write_yaml(study: dict[str, Any], path: str) -> None:
    import yaml

    from dpstudy.util.atomic import write_text

    write_text(path, yaml.safe_dump(plain(study), sort_keys=False))


def within_gpu_budget(cells: list[Cell], gpu_resource: int | None, gpu_jobs: bool) -> tuple[list[Cell], list[Cell]]:
    """(kept, left out): when jobs reserve GPUs (`gpu_jobs`), cells that need more than
    `--resources gpu=N` are left out; CPU jobs reserve none and all stay."""
    if gpu_resource is None or not gpu_jobs:
        return cells, []
    kept = [c for c in cells if c.gpus <= gpu_resource]
    return kept, [c for c in cells if c not in kept]
