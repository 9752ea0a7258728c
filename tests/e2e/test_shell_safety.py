"""No config value reaches a rule's shell command as code (issue 13).

Each config value that can reach a shell command is planted with shell code that would create a
sentinel file. Values the schema rejects: the study loader the workflow plans with refuses each,
naming the key (in process), and the real `snakemake -n` fails before any job (two of them).
Values it accepts: every shell command the real dry run prints (`-p`: the exact commands
Snakemake would run, for every job of the DAG) is run with bash, `python` being a stub that records
its arguments; no sentinel may appear, every command must succeed, and each planted value must
arrive whole, as one argument or a string inside a JSON argument. A value the schema should have
rejected but did not has its printed commands run too, so a hole shows as a sentinel.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.workflow import copy_checkout, planned, snakemake

from dpstudy.util.errors import ConfigError
from dpstudy.workflow.planning import load_study

# Shell code that creates the sentinel {s}, in each way a value could break out of a command.
INJECTIONS = {
    "single_quote": "x'; touch {s}; '",
    "double_quote": 'x"; touch {s}; "',
    "substitution": "x$(touch {s})",
    "backticks": "x`touch {s}`",
    "chain": "x && touch {s} #",
    "newline": "x\ntouch {s}\n",
}
BASE = {
    "study": "shell_safety",
    "datasets": {"synthetic": {"train_size": 64, "test_size": 32}},
    "sweeps": [
        {
            "name": "ext",
            "dataset": "synthetic",
            "model": "lenet_ext",
            "grid": {"mode": ["single", "ddp"], "gpus": [1, 2], "backend": ["gloo"]},
        }
    ],
}
# A stub for python: records its arguments, one JSON list a line, and does nothing else.
RECORD_ARGV = "import json, os, sys; open(os.environ['ARGV_LOG'], 'a').write(json.dumps(sys.argv[1:]) + '\\n')"


@pytest.fixture
def checkout(tmp_path) -> Path:
    return copy_checkout(tmp_path / "checkout")


@pytest.fixture
def sentinels(tmp_path) -> Path:
    folder = tmp_path / "sentinels"
    folder.mkdir()
    return folder


def inject(form: str, sentinels: Path, key: str) -> str:
    return INJECTIONS[form].format(s=sentinels / f"{key}-{form}")


# --- the dry run's shell commands, run for real with stubs ---------------------------------------


def printed_jobs(stdout: str) -> list[dict]:
    """[{rule, files (outputs, logs, benchmarks), command}] of a `snakemake -n -p` output; a
    command that spans lines (a quoted newline) runs on until its quotes close."""
    jobs: list[dict] = []
    lines = iter(stdout.splitlines())
    for line in lines:
        if match := re.match(r"^(?:local)?rule (\w+):$", line):
            jobs.append({"rule": match.group(1), "files": [], "command": None})
        elif jobs and (match := re.match(r"^\s+(?:output|log|benchmark): (.*)$", line)):
            jobs[-1]["files"] += match.group(1).split(", ")
        elif jobs and line.startswith("Shell command: "):
            command = line.removeprefix("Shell command: ")
            while not complete(command):
                command += "\n" + next(lines)
            jobs[-1]["command"] = None if command == "None" else command
    return jobs


def complete(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:  # no closing quotation yet
        return False
    return True


def stub_env(tmp_path: Path) -> dict:
    """PATH with `python` and `python3` stubs first; ARGV_LOG where they record their arguments."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        (stubs / name).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(RECORD_ARGV)} "$@"\n')
        (stubs / name).chmod(0o755)
    return {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "ARGV_LOG": str(tmp_path / "argv.jsonl")}


def run_printed_commands(checkout: Path, stdout: str, env: dict) -> list[str]:
    """Run every printed shell command as Snakemake would (its folders made first); the failures."""
    failures = []
    for job in printed_jobs(stdout):
        for path in job["files"]:
            (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        if job["command"] is None:
            continue  # `run:` rules and `all`: Python, no shell
        proc = subprocess.run(
            ["bash", "-c", job["command"]], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
        )
        if proc.returncode != 0:
            failures.append(f"{job['rule']}: exit {proc.returncode}: {job['command']!r}: {proc.stderr[-500:]}")
    return failures


def received(argv_log: Path) -> set[str]:
    """Every argument the stubs received, and every string (key or value) inside a JSON argument."""
    found: set[str] = set()
    for line in argv_log.read_text().splitlines() if argv_log.exists() else []:
        for arg in json.loads(line):
            found.add(arg)
            try:
                found |= json_strings(json.loads(arg))
            except ValueError:
                pass
    return found


def json_strings(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {s for v in value.values() for s in json_strings(v)}
    if isinstance(value, list):
        return {s for v in value for s in json_strings(v)}
    return {value} if isinstance(value, str) else set()


def plan_and_run(checkout: Path, config: dict, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The real dry run of `config` with its shell commands printed, and each command run."""
    proc = snakemake(checkout, "-n", "-p", config=config, check=False)
    failures = run_printed_commands(checkout, proc.stdout, stub_env(tmp_path)) if proc.returncode == 0 else []
    return proc, failures


# --- values the schema rejects -------------------------------------------------------------------


def sweep(config: dict) -> dict:
    return config["sweeps"][0]


# id: (the planted value, with {s} for the sentinel; the key the error names; where it goes)
REJECTED = {
    "study": ("x'; touch {s}; '", "study:", lambda c, v: c.update(study=v)),
    # Python's $ also matches before a final newline: the schema's patterns must not let it through
    "study_trailing_newline": ("quickstart\n", "study:", lambda c, v: c.update(study=v)),
    "md5_trailing_newline": (
        "0" * 32 + "\n",
        "datasets.mnist.md5",
        lambda c, v: c["datasets"].update(mnist={"md5": {"f": v}}),
    ),
    "cuda_arch_the_issues_value": (
        "8.0' ] && touch {s} && [ '1",
        "ext.cuda_arch",
        lambda c, v: c.update(ext={"cuda_arch": v}),
    ),
    "cuda_arch_substitution": ("8.0;$(touch {s})", "ext.cuda_arch", lambda c, v: c.update(ext={"cuda_arch": v})),
    "cuda_arch_newline": ("8.0\ntouch {s}", "ext.cuda_arch", lambda c, v: c.update(ext={"cuda_arch": v})),
    "cuda_arch_trailing_newline": ("8.0\n", "ext.cuda_arch", lambda c, v: c.update(ext={"cuda_arch": v})),
    "datasets_key": ("synthetic`touch {s}`", "datasets", lambda c, v: c["datasets"].update({v: {}})),
    "mirror": ("$(touch {s})", "datasets.mnist.mirror", lambda c, v: c["datasets"].update(mnist={"mirror": v})),
    "md5_value": ("$(touch {s})", "datasets.mnist.md5", lambda c, v: c["datasets"].update(mnist={"md5": {"f": v}})),
    # a file name must be one of the dataset's files (checked against the registry when the study loads)
    "md5_name": (
        "x\ntouch {s}\n",
        "datasets.mnist: md5: unknown file",
        lambda c, v: c["datasets"].update(mnist={"md5": {v: "0" * 32}}),
    ),
    "sweep_name": ('x"; touch {s}; "', "name:", lambda c, v: sweep(c).update(name=v)),
    "sweep_dataset": ("synthetic$(touch {s})", "dataset", lambda c, v: sweep(c).update(dataset=v)),
    "sweep_model": ("lenet && touch {s}", "model", lambda c, v: sweep(c).update(model=v)),
    "library_model": ("torchvision:resnet18;touch {s}", "model", lambda c, v: sweep(c).update(model=v)),
    "factory_model": ("nets:make$(touch {s})", "model", lambda c, v: sweep(c).update(model=v)),
    "dataset_source": (
        "imagefolder`touch {s}`",
        "datasets.own.source",
        lambda c, v: c["datasets"].update(own={"source": v, "path": "x", "image_size": 8}),
    ),
    "grid_value": ("none; touch {s}", "augment", lambda c, v: sweep(c)["grid"].update(augment=[v])),
    "set_value": ("fp32`touch {s}`", "set.precision", lambda c, v: sweep(c).update(set={"precision": v})),
    "defaults_value": ("sgd\ntouch {s}", "defaults.optimizer", lambda c, v: c.update(defaults={"optimizer": v})),
    "device": ("cuda$(touch {s})", "device", lambda c, v: c.update(device=v)),
    "request_gpus": ("always; touch {s}", "request_gpus", lambda c, v: c.update(request_gpus=v)),
    "resources": ("60; touch {s}", "resources.runtime_min", lambda c, v: c.update(resources={"runtime_min": v})),
}


def planted(case: str, sentinels: Path) -> tuple[dict, str]:
    template, key, plant = REJECTED[case]
    config = copy.deepcopy(BASE)
    plant(config, template.format(s=sentinels / case))
    return config, key


@pytest.mark.parametrize("case", REJECTED)
def test_the_study_loader_rejects_the_value_naming_its_key(case, sentinels):
    # What the workflow plans with (dpstudy.workflow.planning, called by rules/common.smk), in process.
    config, key = planted(case, sentinels)
    with pytest.raises(ConfigError) as refused:
        load_study(config, user_check=None, visible_gpus=0, capabilities=[])
    assert key in str(refused.value)


# The issue's own value and a trailing newline, through the real `snakemake -n -p`: its refusal is
# the workflow's, before any job, and nothing it prints runs the planted code.
@pytest.mark.slow
@pytest.mark.parametrize("case", ["cuda_arch_the_issues_value", "study_trailing_newline"])
def test_a_value_the_schema_rejects_fails_the_run_before_any_job(case, checkout, sentinels, tmp_path):
    config, key = planted(case, sentinels)
    proc, _ = plan_and_run(checkout, config, tmp_path)
    ran = sorted(path.name for path in sentinels.iterdir())
    assert not ran, f"the planted shell code ran: {ran}"
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "invalid study config" in output and key in output, output[-2000:]
    assert not planned(proc)  # before any job


# --- values the schema accepts: quoted wherever they reach a shell -------------------------------

DOWNLOADABLE = ["mnist", "fashion_mnist", "cifar10", "stl10"]
# data_root is a path: every injection but the newline, which Snakemake's printout would split.
DATA_ROOT_FORMS = [form for form in INJECTIONS if form != "newline"]
ARCH_LISTS = ["8.0;9.0+PTX", "8.0, 9.0", "8.6 9.0a", "10.0f", "7.5,8.0 9.0+PTX"]


def accepted_study(index: int, sentinels: Path) -> tuple[dict, list[str]]:
    """A study planting shell code in every free-form value it can (data_root and code_path in one
    form; a mirror per downloadable dataset, rotating through every form) and an architecture list
    with spaces; the values that must arrive whole. (md5 file names are not free-form: REJECTED.)"""
    forms = list(INJECTIONS)
    data_root = inject(DATA_ROOT_FORMS[index], sentinels, "data_root")
    mirrors = {
        name: "https://mirror.example/" + inject(forms[(index + j) % len(forms)], sentinels, f"mirror_{name}")
        for j, name in enumerate(DOWNLOADABLE)
    }
    code_path = inject(DATA_ROOT_FORMS[index], sentinels, "code_path")  # reaches the data rule
    config = copy.deepcopy(BASE)
    config.update(
        data_root=data_root,
        code_path=code_path,
        device="cuda" if index == 0 else "auto",  # cuda: the build gets --require-cuda, the cells GPUs
        ext={"cuda_arch": ARCH_LISTS[index]},
    )
    config["datasets"].update({name: {"mirror": mirror} for name, mirror in mirrors.items()})
    config["sweeps"] += [
        {"name": name, "dataset": name, "model": "lenet", "grid": {"mode": ["single"]}} for name in DOWNLOADABLE
    ]
    return config, [data_root, code_path, *mirrors.values(), ARCH_LISTS[index]]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(DATA_ROOT_FORMS)), ids=DATA_ROOT_FORMS)
def test_accepted_values_reach_every_shell_command_quoted(index, checkout, sentinels, tmp_path):
    config, planted = accepted_study(index, sentinels)
    proc, failures = plan_and_run(checkout, config, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rules = {job["rule"] for job in printed_jobs(proc.stdout) if job["command"]}
    assert rules == {
        "prepare_data",
        "build_ext",
        "memory_plan",
        "train",
        "kernel_bench",
        "comm_bench",
        "collect",
        "figures",
        "report",
    }  # every rule with a shell command ran
    ran = sorted(path.name for path in sentinels.iterdir())
    assert not ran, f"the planted shell code ran: {ran}"
    assert not failures, "\n".join(failures)
    missing = [value for value in planted if value not in received(tmp_path / "argv.jsonl")]
    assert not missing, f"values that did not arrive whole: {missing}"
