"""CUDA architecture lists of the extension: their syntax, the default, what the workflow builds,
and whether a build's kernels run on a given GPU. Plain Python (no torch): the Snakefile plans
with it on a login node, and the tests run it on any machine.

An entry is `M.m` (machine code sm_Mm, which runs on GPUs of capability M.x for x >= m), with
`+PTX` also PTX compute_Mm (the driver JIT-compiles it for any GPU of capability >= M.m), `M.ma`
(architecture-specific features: runs on M.m only) or `M.mf` (family-specific: runs on M.x for
x >= m). Entries are separated by `;` (also `,` or spaces), as in TORCH_CUDA_ARCH_LIST; LIST
below is the one statement of that syntax (the study's ext.cuda_arch is checked against it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dpstudy.util import nvml
from dpstudy.util.errors import ConfigError

# What the workflow builds for a study that runs CUDA cells and names no ext.cuda_arch (plus the
# GPUs the planning host sees): sm_80 machine code runs on every Ampere and Ada GPU (A100, A30,
# A10, A40, L4, L40S), sm_90 on Hopper (H100, H200, GH200), and the 9.0 PTX is JIT-compiled by
# the driver for newer GPUs such as Blackwell (B200, GB200). Turing (T4, 7.5) is not covered.
DEFAULT_CUDA_ARCH = "8.0;9.0+PTX"

ENTRY = re.compile(r"([0-9]+)\.([0-9]+)([af]?)(\+PTX)?")
SEPARATORS = re.compile(r"[;, ]+")
# A whole list: entries separated by ';', ',' or spaces, nothing else (used with fullmatch).
LIST = re.compile(rf"{ENTRY.pattern}(?:{SEPARATORS.pattern}{ENTRY.pattern})*")


@dataclass(frozen=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "a": this exact GPU only; "f": its family
    ptx: bool = False

    @classmethod
    def parse(cls, entry: str) -> Arch:
        match = ENTRY.fullmatch(entry)
        if match is None:
            raise ConfigError(f"{entry!r} is not a CUDA architecture such as 8.0, 9.0a, 10.0f or 9.0+PTX")
        major, minor, suffix, ptx = match.groups()
        return cls(int(major), int(minor), suffix, bool(ptx))

    @property
    def capability(self) -> tuple[int, int]:
        return self.major, self.minor

    def runs_on(self, capability: tuple[int, int]) -> bool:
        """Whether this entry's code runs on a GPU of `capability` (major, minor)."""
        if self.suffix == "a":
            return tuple(capability) == self.capability
        if capability[0] == self.major and capability[1] >= self.minor:
            return True  # machine code runs on later minors of its major; a family's likewise
        # PTX is JIT-compiled for any later GPU; an 'f' PTX only within its family (above)
        return self.ptx and not self.suffix and tuple(capability) >= self.capability

    def describe(self) -> str:
        code = f"sm_{self.major}{self.minor}{self.suffix}"
        return f"{code} + PTX compute_{self.major}{self.minor}{self.suffix}" if self.ptx else code

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}{'+PTX' if self.ptx else ''}"


def split(text: str, key: str = "ext.cuda_arch") -> list[str]:
    """The entries of an architecture list; ConfigError naming `key` and `text` if it is not one.

    fullmatch: a trailing newline would pass `$` under Python's re."""
    if not isinstance(text, str) or not LIST.fullmatch(text):
        raise ConfigError(
            f"{key}: {text!r} is not a CUDA architecture list such as {DEFAULT_CUDA_ARCH!r} "
            "(entries M.m, M.ma, M.mf or M.m+PTX separated by ';')"
        )
    return [entry for entry in SEPARATORS.split(text) if entry]


def planned_arch(study_arch: str | None, cuda_cells: bool, visible: Iterable[tuple[int, int]]) -> str | None:
    """The architecture list the workflow builds the extension for, or None for a CPU-only build.

    The study's ext.cuda_arch when it sets one; else, when the study runs CUDA cells, the default
    plus the capability of every GPU visible here (native code for them, and whatever the default
    misses); else None: a CPU study needs no kernels."""
    if study_arch is not None:
        split(study_arch)
        return study_arch
    if not cuda_cells:
        return None
    entries = [Arch.parse(entry) for entry in split(DEFAULT_CUDA_ARCH)]
    listed = {(a.capability, a.suffix) for a in entries}
    entries += [Arch(*cap) for cap in sorted(set(map(tuple, visible))) if (cap, "") not in listed]
    return ";".join(str(a) for a in sorted(entries, key=lambda a: (a.capability, a.suffix, a.ptx)))


def build_args(study_arch: str | None, cuda_cells: bool, visible: Iterable[tuple[int, int]]) -> list[str]:
    """Arguments of scripts/build_ext.py (after --out) for the workflow's build_ext job: the
    planned architectures, and --require-cuda when CUDA cells will need the kernels."""
    arch = planned_arch(study_arch, cuda_cells, visible)
    return [*(["--cuda-arch", arch] if arch else []), *(["--require-cuda"] if cuda_cells else [])]


def visible_capabilities() -> list[tuple[int, int]]:
    """Compute capabilities of the GPUs this host sees, through NVML (no torch, milliseconds)."""
    return nvml.query(
        lambda n: [
            tuple(n.nvmlDeviceGetCudaComputeCapability(n.nvmlDeviceGetHandleByIndex(i)))
            for i in range(n.nvmlDeviceGetCount())
        ],
        [],
    )


def covers(arch_list: Iterable[str], capability: tuple[int, int]) -> bool:
    """Whether kernels built for `arch_list` run on a GPU of `capability`."""
    return any(Arch.parse(entry).runs_on(capability) for entry in arch_list)


def missing_kernels(
    build: dict[str, Any] | None, capability: tuple[int, int], where: str, gpu_name: str | None = None
) -> str | None:
    """Why the build that `build` (its build.json) describes cannot run on a GPU of `capability`,
    or None when it can. `where` names the build's folder in the reason, `gpu_name` the GPU."""
    major, minor = capability
    gpu = f"this GPU's sm_{major}{minor}" + (f" ({gpu_name})" if gpu_name else "")
    fix = f"rebuild it with ext.cuda_arch including {major}.{minor}"
    if not build:
        return f"the extension in {where} has no readable build.json, so its kernels for {gpu} are unknown; {fix}"
    if not build.get("with_cuda"):
        return f"the extension in {where} was built without CUDA kernels ({build.get('note')}); {fix}"
    if covers(build["cuda_arch"], capability):
        return None
    built_for = ", ".join(Arch.parse(entry).describe() for entry in build["cuda_arch"])
    return f"the extension in {where} was built for {built_for}, not for {gpu}; {fix}"
