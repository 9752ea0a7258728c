"""Build the dpstudy operator library with torch.utils.cpp_extension and describe it in build.json.

The compiler runs in a child Python process: cpp_extension loads what it builds into the process
that built it, and a process can hold only one library for the `dpstudy` namespace. The child
compiles, loads the library and lists its operators; only then is the .so moved into place and
build.json written (both atomically), so a failed build never leaves a half-built extension.

Which CUDA architectures: `cuda_arch` (an architecture list, see dpstudy.ext.arch), else the
visible GPUs'; with `require_cuda` and neither, arch.DEFAULT_CUDA_ARCH ("8.0;9.0+PTX": Ampere,
Ada, Hopper, and newer GPUs through PTX). `require_cuda` (the workflow passes it when the study
runs CUDA cells) turns "no CUDA kernels can be built here" into an error instead of a CPU-only
library that CUDA cells could not use.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dpstudy.ext import cache
from dpstudy.ext.arch import DEFAULT_CUDA_ARCH, split
from dpstudy.util.atomic import write_json
from dpstudy.util.hashing import files_under, tree_sha256
from dpstudy.util.proc import output_of

NAME = "dpstudy_ext"
SO_NAME = f"{NAME}.so"
CSRC = Path(__file__).resolve().parent / "csrc"
IMPORT_ROOT = str(Path(importlib.util.find_spec("dpstudy").origin).parents[1])  # the folder holding dpstudy/
OPS = ("rgb_to_grayscale", "conv2d", "conv2d_backward", "max_pool2d", "max_pool2d_backward")
SCHEMA = "dpstudy.ext-build/1"
CFLAGS = ["-O3", "-fopenmp"]  # at::parallel_for is OpenMP inline code: without -fopenmp it runs serially
LDFLAGS = ["-fopenmp"]
CUDA_CFLAGS = ["-O3"]


def sources(with_cuda: bool) -> list[Path]:
    files = sorted(CSRC.glob("*.cpp"))
    return files + sorted((CSRC / "cuda").glob("*.cu")) if with_cuda else files


def sources_sha256() -> str:
    """Hash of every file under csrc/ (headers included), by relative path and content."""
    return tree_sha256(files_under(CSRC), CSRC)


class CudaUnavailable(RuntimeError):
    """CUDA kernels were required (require_cuda) but cannot be built here; the message says why."""


def cuda_plan(cpu_only: bool | None, cuda_arch: str | None, require_cuda: bool = False) -> dict[str, Any]:
    """Whether CUDA kernels go in, for which architectures, and why not when they don't."""
    import torch

    arch, arch_source = (split(cuda_arch, "--cuda-arch"), "argument") if cuda_arch else ([], None)
    if require_cuda and not arch and not torch.cuda.is_available():
        arch, arch_source = split(DEFAULT_CUDA_ARCH), "default"  # required, and nothing says for which GPUs
    if cpu_only is None:
        cpu_only = os.environ.get("DPSTUDY_EXT_CPU_ONLY", "") == "1"
    home = cuda_home()
    if cpu_only:
        note = "CPU-only build requested (cpu_only=True or DPSTUDY_EXT_CPU_ONLY=1)"
    elif torch.version.cuda is None:
        note = f"CPU-only build: torch {torch.__version__} has no CUDA"
    elif home is None:
        note = "CPU-only build: no CUDA toolkit (bin/nvcc + include/cuda_runtime.h) found; set CUDA_HOME"
    elif not arch and not torch.cuda.is_available():
        # Minutes of nvcc for kernels nothing here can run; a GPU node builds its own.
        note = (
            f"CPU-only build: no GPU is visible, so CUDA kernels could not run here; set ext.cuda_arch "
            f'(e.g. "{DEFAULT_CUDA_ARCH}"), device: cuda, or --cuda-arch to compile them anyway'
        )
    else:
        if not arch:
            arch, arch_source = _visible_arch(), "visible GPUs"
        return {
            "with_cuda": True,
            "cuda_arch": arch,
            "cuda_arch_source": arch_source,
            "cuda_home": str(home),
            "nvcc": _version(home / "bin" / "nvcc"),
            "note": None,
        }
    return {
        "with_cuda": False,
        "cuda_arch": [],
        "cuda_arch_source": None,
        "cuda_home": None,
        "nvcc": None,
        "note": note,
    }


def cuda_home() -> Path | None:
    """The CUDA toolkit: $CUDA_HOME or $CUDA_PATH, else torch's guess, else /usr/local/cuda.

    torch guesses from the nvcc on PATH, which is wrong when that nvcc is a wrapper script
    outside the toolkit, hence the check for the headers.
    """
    from torch.utils.cpp_extension import CUDA_HOME

    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), CUDA_HOME, "/usr/local/cuda"):
        if candidate and all((Path(candidate) / f).exists() for f in ("bin/nvcc", "include/cuda_runtime.h")):
            return Path(candidate)
    return None


def _visible_arch() -> list[str]:
    import torch

    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return sorted(f"{major}.{minor}" for major, minor in caps)


def _version(program: str | Path) -> str:
    """The first line of `program --version`; for nvcc the one with the release number."""
    out = output_of([str(program), "--version"], timeout_s=30)
    if out is None:
        return f"unknown ({program} --version failed)"
    lines = [line.strip() for line in out.splitlines() if line.strip()] or ["unknown"]
    if Path(program).name == "nvcc":
        return next((line for line in lines if "release" in line), lines[-1])
    return lines[0]


def _cached(path: Path, expected: dict[str, Any]) -> dict[str, Any] | None:
    """The existing build.json when its .so is present and it was built from the same inputs."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = all(info.get(key) == value for key, value in expected.items())
    return info if same and Path(info.get("so", "")).exists() else None


def build(
    out_dir: str | Path = "results/ext",
    cuda_arch: str | None = None,
    cpu_only: bool | None = None,
    force: bool = False,
    require_cuda: bool = False,
) -> dict[str, Any]:
    """Build the library into `out_dir` and return build.json's content.

    An up-to-date build (same sources, torch and CUDA plan) is reused unless `force`; else the
    same build from the machine's cache (dpstudy.ext.cache) is copied in, else it compiles; ninja
    keeps `out_dir/build` so that a rebuild recompiles only changed files. With `require_cuda`, a build
    that could not include CUDA kernels raises CudaUnavailable before compiling anything.
    """
    import torch

    out = Path(out_dir).resolve()
    plan = cuda_plan(cpu_only, cuda_arch, require_cuda)
    if require_cuda and not plan["with_cuda"]:
        raise CudaUnavailable(
            f"dpstudy.ext: the study runs CUDA cells, so the extension needs CUDA kernels, "
            f"but they cannot be built here: {plan['note']}"
        )
    if plan["note"]:
        print(f"dpstudy.ext: {plan['note']}", file=sys.stderr)
    expected = {
        "schema": SCHEMA,
        "torch": torch.__version__,
        "sources_sha256": sources_sha256(),
        "with_cuda": plan["with_cuda"],
        "cuda_arch": plan["cuda_arch"],
    }
    if not force and (info := _cached(out / "build.json", expected)):
        return info
    cxx = _version(os.environ.get("CXX", "c++"))
    inputs = {  # what the library depends on: the key of its entry in the machine's cache
        **expected,
        "cflags": CFLAGS,
        "ldflags": LDFLAGS,
        "cuda_cflags": CUDA_CFLAGS if plan["with_cuda"] else [],
        "cxx": cxx,
        "nvcc": plan["nvcc"],
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    out.mkdir(parents=True, exist_ok=True)
    with cache.entry(inputs) as entry:
        stored = None if force or entry is None else cache.lookup(entry, inputs)
        if stored:
            cache.copy_out(entry, out / SO_NAME)
            info = {key: value for key, value in stored.items() if key != "inputs"}
            info.update(so=str(out / SO_NAME), cache=f"copied from {entry}")
            print(f"dpstudy.ext: the same build is in the cache: copied from {entry}", file=sys.stderr)
        else:
            info = _compile(out, plan, expected, cxx)
            if entry is not None:
                cache.store(entry, out / SO_NAME, info, inputs)
                info["cache"] = f"compiled here, stored in {entry}"
            else:
                info["cache"] = "off"
    write_json(out / "build.json", info)
    return info


def _compile(out: Path, plan: dict[str, Any], expected: dict[str, Any], cxx: str) -> dict[str, Any]:
    """Compile into out/build, put the library at out/dpstudy_ext.so; build.json's content."""
    import torch

    start = time.perf_counter()
    built = _compile_in_child(out / "build", sources(plan["with_cuda"]), plan)
    tmp = out / f".{SO_NAME}.{os.getpid()}.tmp"
    shutil.copy2(built["so"], tmp)
    os.replace(tmp, out / SO_NAME)  # a rename: processes that mapped the old file keep it intact
    return {
        **expected,
        "so": str(out / SO_NAME),
        "ops": built["ops"],
        "cuda_arch_source": plan["cuda_arch_source"],
        "note": plan["note"],
        "torch_cuda": torch.version.cuda,
        "cuda_home": plan["cuda_home"],
        "nvcc": plan["nvcc"],
        "cxx": cxx,
        "cflags": CFLAGS,
        "cuda_cflags": CUDA_CFLAGS if plan["with_cuda"] else [],
        "sources": [str(p.relative_to(CSRC.parent)) for p in sources(plan["with_cuda"])],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "build_s": round(time.perf_counter() - start, 1),
    }


def _compile_in_child(build_dir: Path, files: list[Path], plan: dict[str, Any]) -> dict[str, Any]:
    build_dir.mkdir(parents=True, exist_ok=True)
    # The child imports this package from where this process did, installed or not.
    path = os.pathsep.join(filter(None, [IMPORT_ROOT, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    if plan["with_cuda"]:
        env.update(CUDA_HOME=plan["cuda_home"], TORCH_CUDA_ARCH_LIST=";".join(plan["cuda_arch"]))
    spec = {"build_dir": str(build_dir), "sources": [str(f) for f in files], "with_cuda": plan["with_cuda"]}
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp, "result.json")
        code = "import sys; from dpstudy.ext.builder import _compile_and_load; _compile_and_load(*sys.argv[1:])"
        # The compiler's output goes to stderr: the caller's log, not its stdout.
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec), str(result)], env=env, stdout=sys.stderr)
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(
                f"dpstudy.ext: building {NAME} in {build_dir} failed (exit {proc.returncode}); "
                "the compiler's messages are above"
            )
        return json.loads(result.read_text())


def _compile_and_load(spec_json: str, result_path: str) -> None:
    """Child process: compile, load, check that every operator registered, report."""
    import torch
    from torch.utils import cpp_extension

    spec = json.loads(spec_json)
    so = cpp_extension.load(
        name=NAME,
        sources=spec["sources"],
        build_directory=spec["build_dir"],
        extra_cflags=CFLAGS,
        extra_ldflags=LDFLAGS,
        extra_cuda_cflags=CUDA_CFLAGS,
        with_cuda=spec["with_cuda"],
        is_python_module=False,
        verbose=True,
    )
    missing = [op for op in OPS if not hasattr(torch.ops.dpstudy, op)]
    if missing:
        raise RuntimeError(f"dpstudy.ext: {so} loaded but does not register {missing}")
    Path(result_path).write_text(json.dumps({"so": str(so), "ops": list(OPS)}))
