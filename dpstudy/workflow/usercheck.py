"""Before any job: a study's own models and data, tried where Snakemake plans.

For every model outside the registry (torchvision:, timm:, a factory) and every model on a dataset
of the user's own, a child process builds the model for the dataset (channels, size, classes) with
the cell's model_args and runs one batch of two images through it: a factory that cannot be
imported, one with the wrong signature, a library model that does not exist or does not take an
argument, a model whose output is not `num_classes` logits, each becomes one error naming the
sweep, the setting and the cause, and the workflow stops before any job starts. A dataset
function is imported and called (its data's shape is what the models are tried on) unless its
prepared data is current. Nothing is written but the verdict: results/plan/user_check.json
remembers a check that passed, keyed by a hash of everything it read, so that planning again
after no change starts no process.

The child runs in its own process so that Snakemake's (which imports no torch) stays light.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dpstudy import models
from dpstudy.data import user
from dpstudy.data.registry import DATASETS
from dpstudy.data.task import Task
from dpstudy.util.atomic import write_json
from dpstudy.util.errors import ConfigError

BATCH = 2  # images per trial batch (BatchNorm in training mode needs two; the trial runs in eval)
TIMEOUT_S = 900


def trials(study: dict[str, Any], cells: Iterable, fingerprints: dict[str, str] | None = None) -> dict[str, Any]:
    """What the child tries: each distinct (model, model_args, dataset) of a cell whose model or
    dataset is not the registry's, with the sweeps that use it; and the user datasets with their
    fingerprints (dpstudy.data.user.fingerprint; computed here unless given)."""
    cells = list(cells)
    combos: dict[str, dict] = {}
    for cell in cells:
        spec = cell.spec
        if models.kind(spec["model"]) == "registry" and not user.is_user(spec["dataset"]):
            continue
        entry = {
            "model": spec["model"],
            "model_args": spec["model_args"],
            "dataset": spec["dataset"],
            "code_path": spec["code_path"],
            "seq_len": spec.get("seq_len"),  # a text model's window (models.window)
        }
        key = json.dumps(entry, sort_keys=True)
        combos.setdefault(key, {**entry, "sweeps": []})
        if cell.sweep not in combos[key]["sweeps"]:
            combos[key]["sweeps"].append(cell.sweep)
    datasets = user.in_study(study, cells)
    if fingerprints is None:
        fingerprints = {name: user.fingerprint(d) for name, d in datasets.items()}
    return {
        "data_root": study["data_root"],
        "models": list(combos.values()),
        "datasets": {name: {**user.settings_of(d), "code_path": d.code_path} for name, d in datasets.items()},
        "fingerprints": {name: fingerprints[name] for name in datasets},
    }


def fingerprint(work: dict[str, Any]) -> str:
    """A hash of the trials and of the sources they import (factories, dataset functions)."""
    digest = hashlib.sha256(json.dumps(work, sort_keys=True).encode())
    for combo in work["models"]:
        source = models.source_file(combo["model"], combo["code_path"])
        digest.update(source.read_bytes() if source else b"")
    return digest.hexdigest()


def check(
    study: dict[str, Any],
    cells: Iterable,
    verdict_path: str,
    fingerprints: dict[str, str] | None = None,
    python: str = sys.executable,
) -> None:
    """Raise ConfigError with every problem of the study's own models and data (see the module
    docstring); quick when nothing changed since the last check passed. `fingerprints`: the user
    datasets', when the caller has them (the workflow does: one walk of an image folder)."""
    work = trials(study, cells, fingerprints)
    if not work["models"]:
        return
    key = fingerprint(work)
    try:
        if json.loads(Path(verdict_path).read_text()).get("fingerprint") == key:
            return
    except (OSError, ValueError):
        pass
    errors = run_child(work, python)
    if errors:
        raise ConfigError("\n".join(errors))
    write_json(verdict_path, {"fingerprint": key, "models": len(work["models"])})


def run_child(work: dict[str, Any], python: str) -> list[str]:
    try:
        done = subprocess.run(
            [python, "-m", "dpstudy.workflow.usercheck"],
            input=json.dumps(work),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return [f"checking the study's own models and data took more than {TIMEOUT_S} s"]
    if done.returncode != 0:
        return [f"checking the study's own models and data failed:\n{done.stderr.strip()[-3000:]}"]
    return json.loads(done.stdout)["errors"]


# ---- the child ----------------------------------------------------------------------------------


def dataset_shape(name: str, settings: dict, data_root: str, fingerprint: str | None) -> Task:
    """The Task of a dataset for the trial (channels, size, classes): the registry's, an image
    folder's settings and class folders, or a function's data (its prepared meta when current,
    else the function called)."""
    if name in DATASETS:
        info = DATASETS[name]
        if getattr(info, "is_text", False):
            return Task.text(info.vocab_size, 1)  # the window is the model's: try_model sets it
        return Task.image(info.channels, info.size, len(info.classes))
    dataset = user.describe(name, {k: v for k, v in settings.items() if k != "code_path"}, settings["code_path"])
    if dataset.is_text:
        from dpstudy.data import text, user_text

        if user_text.tokenizer_kind(dataset.tokenizer) == "byte":
            text.read_text(dataset)  # every file UTF-8, or the file and the offset of its first bad byte
        return Task.text(user_text.vocab_size(dataset), 1)  # the window is the model's: try_model sets it
    if dataset.is_folder:
        classes = user.class_folders(dataset.path, "")
        return Task.image(dataset.channels, dataset.image_size, len(classes))
    from dpstudy.data import store, user_function

    if store.is_ready(name, data_root):
        meta = store.load_meta(name, data_root)
        if meta.get("fingerprint") == fingerprint:
            return Task.image(meta["shape"][0], meta["shape"][1], len(meta["classes"]))
    splits, classes = user_function.read_function(dataset)
    shape = splits["train"][0].shape
    return Task.image(shape[1], shape[2], len(classes))


def try_model(combo: dict, task: Task) -> str | None:
    """None when the model builds for the task and gives its logits (task.output_shape); else why."""
    import torch

    inputs = task.input_shape(BATCH)
    try:
        if task.is_text:
            spec = {"model": combo["model"], "model_args": combo["model_args"], "seq_len": combo.get("seq_len")}
            task = Task.text(task.vocab_size, models.window(spec))
            inputs = task.input_shape(BATCH)
        model = models.build(combo["model"], task, combo["model_args"], combo["code_path"])
        model.eval()
        with torch.no_grad():
            output = model(task.example_batch(BATCH)[0])
    except ConfigError as error:
        return str(error)
    except Exception as error:
        return f"fails on a batch {inputs}: {type(error).__name__}: {str(error).strip().splitlines()[0]}"
    got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
    expected = task.output_shape(BATCH)
    if got != expected:
        what = "one logit per vocabulary symbol per position" if task.is_text else "one logit per class"
        return f"returned {got} for a batch {inputs}; expected {expected}: {what}"
    return None


def sweeps_text(sweeps: list[str]) -> str:
    return f"sweep{'s' if len(sweeps) > 1 else ''} {', '.join(map(repr, sweeps))}: "


def child(work: dict[str, Any]) -> list[str]:
    errors, shapes = [], {}
    for name, settings in work["datasets"].items():
        users = list(dict.fromkeys(s for c in work["models"] if c["dataset"] == name for s in c["sweeps"]))
        try:
            shapes[name] = dataset_shape(name, settings, work["data_root"], work["fingerprints"].get(name))
        except ConfigError as error:  # a function that cannot be imported or called
            errors.append(f"{sweeps_text(users)}dataset {name!r}: {error}")
        except Exception as error:  # or that fails, or returns what is no dataset
            errors.append(f"{sweeps_text(users)}dataset {name!r}: {type(error).__name__}: {error}")
    for combo in work["models"]:
        where = sweeps_text(combo["sweeps"])
        args = f" with model_args {combo['model_args']}" if combo["model_args"] else ""
        name = combo["dataset"]
        if name in DATASETS:
            shapes.setdefault(name, dataset_shape(name, {}, work["data_root"], None))
        if name not in shapes:
            continue  # its dataset's error is reported
        problem = try_model(combo, shapes[name])
        if problem:
            errors.append(f"{where}model {combo['model']!r}{args} on dataset {name!r}: {problem}")
    return errors


def main() -> int:
    work = json.loads(sys.stdin.read())
    print(json.dumps({"errors": child(work)}))
    return 0


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
