"""Before any job: every text cell's window against its model and its data, where Snakemake plans
and without torch. A seq_len longer than the model's context, a tokenizer with more symbols than
the model's embedding, or a window that leaves a rank without a sample of the corpus would each
fail every such cell at its first step; each is one error naming the sweep and both numbers.
Hugging Face models are checked by dpstudy.workflow.usercheck's child instead, which builds them
(their context is their config's)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dpstudy import models
from dpstudy.data import store
from dpstudy.data.registry import DATASETS
from dpstudy.models.tasks import cell_task
from dpstudy.study import spec as specs
from dpstudy.util.errors import ConfigError


def is_text(name: str, study: dict[str, Any]) -> bool:
    if name in DATASETS:
        return DATASETS[name].is_text
    return (study["datasets"].get(name) or {}).get("source") == "text"


def problem(spec: dict[str, Any], study: dict[str, Any]) -> str | None:
    """Why the text cell `spec` cannot train, or None."""
    name = spec["dataset"]
    overrides = study["datasets"].get(name) or {}
    try:
        task = cell_task(spec, overrides if name not in DATASETS else None, spec.get("code_path"))
        if models.kind(spec["model"]) == "registry":
            models.check_vocab(task.vocab_size, spec["model_args"].get("vocab_size", task.vocab_size), spec["model"])
    except ConfigError as error:
        return str(error)
    sizes = store.split_sizes(name, spec["data_root"], overrides)
    if sizes is None:  # a download not yet made: the engine checks the prepared splits
        return None
    for split, tokens in zip(("train", "test"), sizes, strict=True):
        windows, devices = max(0, (tokens - 1) // task.seq_len), specs.devices(spec)
        if windows < devices:
            return (
                f"seq_len {task.seq_len} is too long for dataset {name!r}: its {split} split has {tokens:,} tokens, "
                f"{windows} window(s) of {task.seq_len + 1} for {devices} device(s); use a shorter seq_len or more text"
            )
    return None


def check(study: dict[str, Any], cells: Iterable) -> None:
    """ConfigError listing every sweep whose text cells cannot train (see the module docstring)."""
    found: dict[str, list[str]] = {}
    seen = set()
    for cell in cells:
        spec = cell.spec
        if not is_text(spec["dataset"], study) or models.kind(spec["model"]) not in ("registry", "factory"):
            continue
        key = (
            cell.sweep,
            spec["dataset"],
            spec["model"],
            repr(spec["model_args"]),
            spec["seq_len"],
            specs.devices(spec),
        )
        if key in seen:
            continue
        seen.add(key)
        if models.kind(spec["model"]) == "factory" and spec.get("seq_len") is None:
            continue  # a factory's context is known once built: the user check tries it
        why = problem(spec, study)
        if why and why not in found.setdefault(cell.sweep, []):
            found[cell.sweep].append(why)
    if found:
        raise ConfigError("\n".join(f"sweep {sweep!r}: {why}" for sweep, whys in found.items() for why in whys))
