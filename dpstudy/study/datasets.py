"""A study's dataset overrides (config `datasets`), checked against the registry when the study
loads, so a wrong key stops the workflow before any job starts."""

from __future__ import annotations

from dpstudy.data.registry import DOWNLOADED_ONLY, GENERATED_ONLY, info
from dpstudy.study import schema
from dpstudy.util.errors import ConfigError


def check_overrides(name: str, overrides: dict | None) -> dict:
    """The overrides of one dataset (config `datasets.NAME`), validated; ConfigError names the key."""
    dataset, overrides = info(name), {} if overrides is None else overrides
    where = f"datasets.{name}: "
    schema.check(overrides, "dataset_overrides", where)
    wrong_kind = DOWNLOADED_ONLY if dataset.generated else GENERATED_ONLY
    for key in wrong_kind:
        if key in overrides:
            kind = "downloaded" if dataset.generated else "generated"
            raise ConfigError(f"{where}{key!r} applies to {kind} datasets only")
    for file in overrides.get("md5", {}):
        if file not in dataset.files:
            raise ConfigError(f"{where}md5: unknown file {file!r}, not one of {list(dataset.files)}")
    return overrides
