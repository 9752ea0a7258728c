"""A study's datasets (config `datasets`, each sweep's `dataset`), checked when the study loads, so
a wrong key, a missing folder or an unknown name stops the workflow before any job starts: a
registry dataset's overrides against the registry, a user's own dataset by dpstudy.data.user."""

from __future__ import annotations

from dpstudy.data import user
from dpstudy.data.registry import DATASETS, DOWNLOADED_ONLY, GENERATED_ONLY, info
from dpstudy.study import schema
from dpstudy.util import refs
from dpstudy.util.errors import ConfigError


def check_named(name: str, declared: dict, where: str) -> None:
    """A sweep's dataset is the registry's, declared under `datasets`, or a function."""
    if name in DATASETS or name in declared or refs.split(name):
        return
    raise ConfigError(
        f"{where}dataset {name!r} is not one of the registry's ({', '.join(sorted(DATASETS))}), not declared "
        f"under datasets (an image folder: datasets.{name}: {{path: ..., image_size: ...}}; a text: "
        f"datasets.{name}: {{source: text, path: ...}}) and not a function <module>:<callable>"
    )


def check_overrides(
    name: str, overrides: dict | None, code_path: str | None = None, used_by: list[str] | tuple = ()
) -> dict:
    """The settings of one dataset (config `datasets.NAME`), validated; ConfigError names the key,
    and the sweeps that use the dataset (`used_by`). A user dataset's folder is looked at (it
    exists, has class folders with images; a text's files and tokenizer)."""
    overrides = {} if overrides is None else overrides
    sweeps = f"sweep{'s' if len(used_by) > 1 else ''} {', '.join(map(repr, used_by))}: " if used_by else ""
    where = f"{sweeps}datasets.{name}: "
    schema.check(overrides, "dataset_overrides", where)
    if user.is_user(name):
        wrong = [k for k in (*DOWNLOADED_ONLY, *GENERATED_ONLY) if k in overrides]
        if wrong:
            raise ConfigError(f"{where}{wrong[0]!r} applies to the registry's datasets only")
        user.describe(name, overrides, code_path, sweeps)
        return overrides
    dataset = info(name)
    own = [k for k in user.OWN_KEYS if k in overrides]
    if own:
        raise ConfigError(f"{where}{own[0]!r} applies to a dataset of your own, not to the registry's {name!r}")
    wrong_kind = DOWNLOADED_ONLY if dataset.generated else GENERATED_ONLY
    for key in wrong_kind:
        if key in overrides:
            kind = "downloaded" if dataset.generated else "generated"
            raise ConfigError(f"{where}{key!r} applies to {kind} datasets only")
    for file in overrides.get("md5", {}):
        if file not in dataset.files:
            raise ConfigError(f"{where}md5: unknown file {file!r}, not one of {list(dataset.files)}")
    return overrides
