"""The extension's CUDA build where users build it (issue 13): the architecture lists (schema,
plan, coverage), --require-cuda, a lenet_ext cell refusing a GPU the build has no kernels for, and
the planned build of a `device: cuda` study, compiled on this GPU-less host."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.workflow import REPO, copy_checkout, snakemake

from dpstudy.data import store as data
from dpstudy.ext import arch
from dpstudy.ext.arch import DEFAULT_CUDA_ARCH
from dpstudy.record import fields as record
from dpstudy.study import sweeps
from dpstudy.study.schema import schema
from dpstudy.util.errors import ConfigError

CUDA_STUDY = {
    "study": "cuda_build",
    "device": "cuda",
    "datasets": {"synthetic": {"train_size": 64, "test_size": 32}},
    "bench": {"kernels": False, "comm": False},
    "sweeps": [{"name": "ext", "dataset": "synthetic", "model": "lenet_ext", "grid": {"mode": ["single"]}}],
}


def with_arch(value) -> dict:
    return {"sweeps": CUDA_STUDY["sweeps"], "ext": {"cuda_arch": value}}


def torch_can_compile_cuda() -> bool:
    import torch

    from dpstudy.ext import builder

    return bool(torch.version.cuda and builder.cuda_home())


# --- the list syntax: dpstudy.ext.arch.LIST, checked when a study loads and when the plan splits it ----

GOOD_LISTS = [
    "8.0",
    "8.0;9.0+PTX",
    "9.0a",
    "10.0f",
    "9.0+PTX",
    "12.1a+PTX",
    "8.0,9.0",
    "8.0, 9.0",
    "8.0 9.0+PTX",
    "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX",
    "8.0;;9.0",
]
BAD_LISTS = [
    "",
    "8",
    ".0",
    "8.",
    "sm_80",
    "8.0;",
    ";8.0",
    "8.0+ptx",
    "8.0+PTX+PTX",
    "9.0b",
    "9.0af",
    "Ampere",
    "8.0\t9.0",
    "8.0\n9.0",
    "\uff18.\uff10",
    "8.0' ] && touch /tmp/x && [ '1",
    "$(touch x)",
    "`touch x`",
    "8.0;$(id)",
    "8.0 && id",
    "8.0|id",
    "8.0 # comment",
]


@pytest.mark.parametrize("value", GOOD_LISTS)
def test_architecture_lists_pass_the_schema_and_split(value):
    assert sweeps.load(with_arch(value))["ext"]["cuda_arch"] == value
    assert arch.split(value) == [e for e in re.split("[;, ]+", value) if e]


@pytest.mark.parametrize("value", BAD_LISTS)
def test_anything_else_is_a_config_error_naming_key_and_value(value):
    with pytest.raises(ConfigError) as error:
        sweeps.load(with_arch(value))
    assert "ext.cuda_arch" in str(error.value) and repr(value) in str(error.value)
    with pytest.raises(ConfigError, match="ext.cuda_arch"):
        arch.split(value)


def test_a_trailing_newline_is_refused_by_the_study_and_the_plan():
    # Python's re lets $ match before a final newline: arch.split matches the whole text instead.
    with pytest.raises(ConfigError, match=r"ext.cuda_arch: '8.0\\n' is not a CUDA architecture list"):
        sweeps.load(with_arch("8.0\n"))
    with pytest.raises(ConfigError, match=r"ext.cuda_arch: '8.0\\n' is not a CUDA architecture list"):
        arch.build_args("8.0\n", True, [])


def test_null_and_a_missing_key_mean_no_list():
    assert sweeps.load(with_arch(None))["ext"]["cuda_arch"] is None
    assert sweeps.load({"sweeps": CUDA_STUDY["sweeps"]})["ext"]["cuda_arch"] is None


def test_the_default_list_is_documented_where_users_read():
    description = " ".join(schema()["properties"]["ext"]["properties"]["cuda_arch"]["description"].split())
    assert DEFAULT_CUDA_ARCH == "8.0;9.0+PTX" and f'"{DEFAULT_CUDA_ARCH}"' in description
    assert arch.split(DEFAULT_CUDA_ARCH) == ["8.0", "9.0+PTX"]


# --- the plan: which architectures the workflow's build_ext gets -------------------------------


@pytest.mark.parametrize(
    "study_arch, cuda_cells, visible, args",
    [
        (None, False, [], []),  # a CPU study: no kernels, as before
        (None, False, [(8, 6)], []),  # GPUs seen but the study runs on the CPU (device cpu, request_gpus never)
        ("8.6", False, [], ["--cuda-arch", "8.6"]),  # asked for: built when possible, not required
        (None, True, [], ["--cuda-arch", "8.0;9.0+PTX", "--require-cuda"]),  # a login node without GPUs
        (None, True, [(9, 0)], ["--cuda-arch", "8.0;9.0+PTX", "--require-cuda"]),  # already listed
        (None, True, [(8, 6), (7, 5), (8, 6), (12, 0)], ["--cuda-arch", "7.5;8.0;8.6;9.0+PTX;12.0", "--require-cuda"]),
        ("9.0a", True, [(8, 0)], ["--cuda-arch", "9.0a", "--require-cuda"]),  # the study's list wins
        ("8.0, 9.0", True, [], ["--cuda-arch", "8.0, 9.0", "--require-cuda"]),
    ],
)
def test_build_args(study_arch, cuda_cells, visible, args):
    assert arch.build_args(study_arch, cuda_cells, visible) == args


def test_a_bad_study_list_is_refused_by_the_plan_too():
    with pytest.raises(ConfigError, match="ext.cuda_arch"):
        arch.planned_arch("8.0; touch x", True, [])


def test_visible_capabilities_never_raise():
    caps = arch.visible_capabilities()  # without a driver (this host): []
    assert isinstance(caps, list) and all(len(cap) == 2 and all(isinstance(v, int) for v in cap) for cap in caps)


# --- coverage: does a build's code run on a GPU of this capability? ----------------------------


@pytest.mark.parametrize(
    "entries, capability, runs",
    [
        (["8.0"], (8, 0), True),
        (["8.0"], (8, 6), True),
        (["8.0"], (8, 9), True),  # later minors of its major
        (["8.0"], (9, 0), False),
        (["8.0"], (7, 5), False),
        (["8.6"], (8, 0), False),  # not a later major, not earlier
        (["9.0+PTX"], (9, 0), True),
        (["9.0+PTX"], (10, 0), True),
        (["9.0+PTX"], (12, 1), True),  # PTX: any later GPU
        (["9.0+PTX"], (8, 9), False),
        (["9.0a"], (9, 0), True),
        (["9.0a"], (10, 0), False),
        (["9.0a+PTX"], (10, 0), False),  # a: this GPU only
        (["10.0f"], (10, 0), True),
        (["10.0f"], (10, 3), True),
        (["10.3f"], (10, 0), False),  # f: its family
        (["10.0f"], (12, 0), False),
        (["10.0f+PTX"], (12, 0), False),
        (["8.0", "9.0+PTX"], (7, 5), False),
        (["8.0", "9.0+PTX"], (8, 6), True),
        (["8.0", "9.0+PTX"], (10, 0), True),
        ([], (8, 0), False),
    ],
)
def test_covers(entries, capability, runs):
    assert arch.covers(entries, capability) is runs


def test_the_default_covers_current_data_center_gpus():
    gpus = {"A100": (8, 0), "A10": (8, 6), "L4": (8, 9), "L40S": (8, 9), "H100": (9, 0), "B200": (10, 0)}
    assert all(arch.covers(arch.split(DEFAULT_CUDA_ARCH), cap) for cap in gpus.values())
    assert not arch.covers(arch.split(DEFAULT_CUDA_ARCH), (7, 5))  # T4: named in the refusal instead


def test_a_cpu_only_build_is_refused_with_its_note_and_the_fix():
    build = {"with_cuda": False, "cuda_arch": [], "note": "CPU-only build: no GPU is visible, so ..."}
    reason = arch.missing_kernels(build, (8, 6), "results/ext", "NVIDIA A10")
    assert reason == (
        "the extension in results/ext was built without CUDA kernels (CPU-only build: no GPU is "
        "visible, so ...); rebuild it with ext.cuda_arch including 8.6"
    )


def test_a_build_for_other_gpus_is_refused_naming_both():
    build = {"with_cuda": True, "cuda_arch": ["8.0", "9.0+PTX"], "note": None}
    assert arch.missing_kernels(build, (7, 5), "results/ext", "Tesla T4") == (
        "the extension in results/ext was built for sm_80, sm_90 + PTX compute_90, not for this GPU's sm_75 "
        "(Tesla T4); rebuild it with ext.cuda_arch including 7.5"
    )
    assert arch.missing_kernels(build, (8, 6), "results/ext", "NVIDIA A10") is None
    assert "no readable build.json" in arch.missing_kernels(None, (8, 0), "results/ext")


# --- the refusal in a training run: a failed record with the reason ------------------------------


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """A 'loaded' extension whose build.json says what the test writes, and a GPU of capability
    7.5 (a T4) behind device 0: the check reads nothing else, so no library and no GPU are needed."""
    import torch

    from dpstudy.ext import loader

    folder = tmp_path / "ext"
    folder.mkdir()
    monkeypatch.setattr(loader, "_loaded", folder / "dpstudy_ext.so")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla T4")
    return folder / "build.json"


def test_check_kernels_refuses_a_gpu_the_build_has_no_kernels_for(fake_build):
    from dpstudy.ext.loader import MissingKernels, check_kernels

    fake_build.write_text(json.dumps({"with_cuda": True, "cuda_arch": ["8.0", "9.0+PTX"], "note": None}))
    check_kernels([])  # the CPU: nothing to check
    with pytest.raises(
        MissingKernels,
        match=r"built for sm_80, sm_90 \+ PTX compute_90, not for this GPU's "
        r"sm_75 \(Tesla T4\); rebuild it with ext.cuda_arch including 7.5",
    ):
        check_kernels([0])
    fake_build.write_text(json.dumps({"with_cuda": True, "cuda_arch": ["7.5"], "note": None}))
    check_kernels([0])


def test_a_lenet_ext_cell_on_such_a_gpu_is_a_failed_record_with_the_reason(fake_build, tmp_path, monkeypatch):
    import torch

    from dpstudy import models
    from dpstudy.engine import cell
    from dpstudy.engine.modes.base import Mode
    from dpstudy.models.lenet import LeNet
    from dpstudy.study import spec as specs

    fake_build.write_text(
        json.dumps({"with_cuda": False, "cuda_arch": [], "note": "CPU-only build: torch has no CUDA"})
    )
    # A CPU run whose process drives "GPU 0", with a plain LeNet standing in for the built library.
    monkeypatch.setattr(Mode, "devices", lambda self: [0])
    monkeypatch.setattr(models, "build", lambda name, task, *_: LeNet(task.channels, task.size, task.classes))
    data.prepare("synthetic", tmp_path / "data", {"train_size": 64, "test_size": 32})
    spec = specs.complete(
        {
            "dataset": "synthetic",
            "model": "lenet_ext",
            "mode": "single",
            "epochs": 1,
            "data_root": str(tmp_path / "data"),
        }
    )
    threads, cores = torch.get_num_threads(), os.sched_getaffinity(0)
    try:  # run() sets this process's threads and pins it to its cores, as it owns a cell's process
        code = cell.run(spec, str(tmp_path / "cell"), "cell", time.time(), cores=1)
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, cores)
    rec = record.read(tmp_path / "cell/record.json")
    assert code == 1 and rec["status"] == "failed" and not rec["epochs"]
    assert rec["reason"].startswith(
        f"rank 0: MissingKernels: the extension in {fake_build.parent} was built without CUDA kernels "
        "(CPU-only build: torch has no CUDA); rebuild it with ext.cuda_arch including 7.5"
    )


# --- --require-cuda: no silent CPU-only library for a study that runs CUDA cells ----------------


def test_required_kernels_that_cannot_be_built_are_an_error_before_compiling(tmp_path):
    from dpstudy.ext import builder

    with pytest.raises(builder.CudaUnavailable, match="cannot be built here: CPU-only build requested"):
        builder.build(tmp_path, cuda_arch=DEFAULT_CUDA_ARCH, cpu_only=True, require_cuda=True)
    assert not list(tmp_path.iterdir())


def test_build_ext_script_fails_with_the_reason(tmp_path):
    env = {**os.environ, "DPSTUDY_EXT_CPU_ONLY": "1", "PYTHONPATH": str(REPO)}
    # Both runs at once: each is mostly importing torch, on one core.
    required, bad_list = (
        subprocess.Popen(
            [sys.executable, "scripts/build_ext.py", "--out", str(tmp_path / "ext"), *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in (["--require-cuda"], ["--cuda-arch", "8.0; id"])
    )
    _, stderr = required.communicate(timeout=120)
    assert required.returncode == 1 and "the study runs CUDA cells, so the extension needs CUDA kernels" in stderr
    assert "DPSTUDY_EXT_CPU_ONLY=1" in stderr
    _, stderr = bad_list.communicate(timeout=120)
    assert bad_list.returncode == 1 and "--cuda-arch: '8.0; id' is not a CUDA architecture list" in stderr
    assert not (tmp_path / "ext/build.json").exists()


@pytest.mark.skipif(not torch_can_compile_cuda(), reason="needs a CUDA torch and nvcc")
def test_required_kernels_without_a_gpu_or_a_list_use_the_default(monkeypatch):
    from dpstudy.ext import builder

    monkeypatch.delenv("DPSTUDY_EXT_CPU_ONLY", raising=False)
    plan = builder.cuda_plan(None, None, require_cuda=True)
    assert plan["with_cuda"] and plan["cuda_arch"] == ["8.0", "9.0+PTX"] and plan["cuda_arch_source"] == "default"


# --- the workflow: a device: cuda study on this GPU-less host ------------------------------------


def planned_build_command(checkout: Path) -> str:
    proc = snakemake(checkout, "-n", "-p", "results/ext/build.json", config=CUDA_STUDY)
    commands = re.findall(r"^Shell command: (python scripts/build_ext\.py .*)$", proc.stdout, re.MULTILINE)
    assert len(commands) == 1, proc.stdout
    return commands[0]


def test_a_cuda_study_plans_a_build_with_kernels_on_a_gpu_less_host(tmp_path):
    command = planned_build_command(copy_checkout(tmp_path))
    assert command == (
        "python scripts/build_ext.py --out results/ext --cuda-arch '8.0;9.0+PTX' --require-cuda"
        " > results/logs/build_ext.log 2>&1"
    )


@pytest.mark.slow
@pytest.mark.skipif(not torch_can_compile_cuda(), reason="needs a CUDA torch and nvcc")
def test_the_planned_cuda_build_compiles_the_kernels_here(tmp_path):
    """The build a device: cuda study plans, run by Snakemake here: nvcc compiles the .cu files (one
    translation unit, dpstudy.ext.builder.unity_sources) for the study's list, the child process
    loads the library, and every operator has a CUDA kernel registered (running them needs a GPU:
    tests/unit/ext/test_ext.py's gpu tests). One architecture, sm_90 with its PTX; the default
    list's plan is test_a_cuda_study_plans_a_build_with_kernels_on_a_gpu_less_host's. The only CUDA
    compile of the suite."""
    checkout = copy_checkout(tmp_path)
    snakemake(
        checkout,
        "--cores",
        "2",
        "results/ext/build.json",
        config={**CUDA_STUDY, "ext": {"cuda_arch": "9.0+PTX"}},
        env={"DPSTUDY_EXT_CPU_ONLY": "0"},
        timeout=1500,
    )
    info = json.loads((checkout / "results/ext/build.json").read_text())
    assert info["with_cuda"] and info["cuda_arch"] == ["9.0+PTX"] and info["note"] is None
    assert info["cuda_arch_source"] == "argument"
    assert {"csrc/cuda/conv2d.cu", "csrc/cuda/max_pool2d.cu", "csrc/cuda/grayscale.cu"} <= set(info["sources"])
    build = checkout / "results/ext/build"
    assert (build / "dpstudy_ext_cuda.cuda.o").exists() and (build / "dpstudy_ext_cpp.o").exists()
    unit = (build / "dpstudy_ext_cuda.cu").read_text()
    assert [line.rsplit("/", 1)[-1] for line in unit.splitlines()[1:]] == [
        'conv2d.cu"',
        'grayscale.cu"',
        'max_pool2d.cu"',
    ]
    flags = (build / "build.ninja").read_text()
    assert all(flag in flags for flag in ("code=sm_90", "code=compute_90")) and "sm_80" not in flags
    # each operator's CUDA kernel registered by the one unit (a registration needs no GPU)
    code = (
        "import sys, torch; torch.ops.load_library(sys.argv[1])\n"
        "print(sorted(op for op in sys.argv[2:] if torch._C._dispatch_has_kernel_for_dispatch_key("
        "f'dpstudy::{op}', 'CUDA')))"
    )
    from dpstudy.ext.builder import OPS  # the operators the extension declares

    ops = list(OPS)
    proc = subprocess.run(
        [sys.executable, "-c", code, info["so"], *ops], capture_output=True, text=True, check=True, timeout=120
    )
    assert proc.stdout.split("\n")[0] == str(sorted(ops)), proc.stderr


def test_a_library_built_for_another_torch_is_refused_with_what_to_do(tmp_path):
    # Loading it would fail with an undefined symbol (seen: a 2.14 build in torch 2.6), or worse.
    (tmp_path / "dpstudy_ext.so").write_bytes(b"not loaded")
    other = "1.13.1+cu117"  # not the running torch, whichever that is
    (tmp_path / "build.json").write_text(json.dumps({"torch": other, "sources_sha256": "x"}))
    code = (
        "import sys; from dpstudy.ext.loader import load_library, ExtensionMismatch\n"
        "try:\n    load_library(sys.argv[1])\nexcept ExtensionMismatch as e:\n    print(e); sys.exit(3)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    assert (
        f"{tmp_path / 'dpstudy_ext.so'} was built for torch {other}, but this is torch {torch.__version__}: "
        f"rebuild it (`python scripts/build_ext.py --out {tmp_path}`"
    ) in proc.stdout
