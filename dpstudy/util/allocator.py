"""The memory allocator a cell's processes run with, chosen by the launcher and read back by each rank.

glibc's malloc hands a training step's large activations back to the OS when they are freed and
faults them in again at the next step: a CPU cell's throughput then varies several times more from
run to run than with jemalloc preloaded or glibc told to keep its memory (benchmarks/noise_floor.py
measures it; docs/report.md quotes the figures). PyTorch's tuning guide recommends jemalloc or
TCMalloc for the same reason. The study's `allocator` names the
set-up:

- jemalloc, tcmalloc: the library through LD_PRELOAD, found by `ldconfig -p` (Debian:
  libjemalloc2, libtcmalloc-minimal4; `make system-packages` installs jemalloc), told to keep
  the memory it frees (LIBRARY_KEEP);
- glibc: glibc's own malloc told to keep what it has (GLIBC_KEEP's variables);
- system: the process as the system starts it;
- auto (the default): the best one present, in that order.

`in_this_process()` is what a rank records: the allocator library mapped into it (from
/proc/self/maps, whatever asked for it) and the malloc variables it sees.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dpstudy.util.errors import ConfigError

CHOICES = ("auto", "jemalloc", "tcmalloc", "glibc", "system")
# the shared objects each library ships as, most specific first, and the Debian package holding it
LIBRARIES = {
    "jemalloc": (("libjemalloc.so.2", "libjemalloc.so"), "libjemalloc2"),
    "tcmalloc": (("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so"), "libtcmalloc-minimal4"),
}
# glibc keeps freed memory: no mmap below its 32 MiB ceiling (64-bit), no trimming, 1 GiB of slack
GLIBC_KEEP = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
    "MALLOC_TOP_PAD_": str(1 << 30),
}
# ... and the libraries likewise: jemalloc's default decay hands pages back after 10 s, which at
# batch 256 cost a LeNet cell 35 % of its throughput here (6,840 samples/s against 10,580 without)
LIBRARY_KEEP = {
    "jemalloc": {"MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"},
    "tcmalloc": {"TCMALLOC_RELEASE_RATE": "0"},
}
VARIABLES = tuple(GLIBC_KEEP) + ("MALLOC_ARENA_MAX", "MALLOC_CONF", "TCMALLOC_RELEASE_RATE", "LD_PRELOAD")


@dataclass(frozen=True)
class Setup:
    """What the launcher gives a cell's processes: the allocator's name, the library it preloads
    (None for glibc and system) and the variables it sets."""

    name: str
    library: str | None = None
    variables: dict[str, str] = field(default_factory=dict)

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with this set-up: the library first in LD_PRELOAD (kept: what was there), its
        variables set (MALLOC_CONF joined with one already there)."""
        out = {**env, **self.variables}
        if env.get("MALLOC_CONF") and "MALLOC_CONF" in self.variables:  # the user's options win: last
            out["MALLOC_CONF"] = f"{self.variables['MALLOC_CONF']},{env['MALLOC_CONF']}"
        if self.library:
            out["LD_PRELOAD"] = " ".join(filter(None, [self.library, env.get("LD_PRELOAD", "")]))
        return out

    def describe(self) -> str:
        if self.library:
            return f"{self.name} ({self.library}), keeping freed memory"
        return "glibc, keeping freed memory" if self.name == "glibc" else "as the system starts it"


def find_library(name: str) -> str | None:
    """The path of allocator `name`'s library on this host, from the linker's cache."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    paths = dict(re.findall(r"^\s*(\S+) \([^)]*\) => (\S+)$", listing, flags=re.MULTILINE))
    sonames, _ = LIBRARIES[name]
    found = next((paths[so] for so in sonames if so in paths and Path(paths[so]).exists()), None)
    # the path the kernel maps it from (/lib is /usr/lib on Debian): what a rank reads back
    return os.path.realpath(found) if found else None


def resolve(choice: str, key: str = "allocator") -> Setup:
    """The set-up `choice` means on this host; a library that is not here is a ConfigError."""
    if choice not in CHOICES:
        raise ConfigError(f"{key}: {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "system":
        return Setup("system")
    if choice == "glibc":
        return Setup("glibc", variables=dict(GLIBC_KEEP))
    if choice == "auto":
        for name in LIBRARIES:
            if path := find_library(name):
                return Setup(name, path, dict(LIBRARY_KEEP[name]))
        return Setup("glibc", variables=dict(GLIBC_KEEP))
    path = find_library(choice)
    if path is None:
        sonames, package = LIBRARIES[choice]
        raise ConfigError(
            f"{key}: {choice!r}: no {' or '.join(sonames)} on this host (ldconfig -p lists none); install "
            f"it (Debian: apt-get install {package}; `make system-packages` installs libjemalloc2), "
            "or choose auto, glibc or system"
        )
    return Setup(choice, path, dict(LIBRARY_KEEP[choice]))


def in_this_process() -> dict:
    """{name, library, variables} of the allocator this process runs with: a jemalloc or tcmalloc
    library mapped into it, else glibc (tuned when GLIBC_KEEP's variables are set)."""
    variables = {key: os.environ[key] for key in VARIABLES if key in os.environ}
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    for name in LIBRARIES:
        mapped = re.search(rf"(/\S*/lib{name}[^/\s]*\.so[^/\s]*)$", maps, flags=re.MULTILINE)
        if mapped:
            return {"name": name, "library": mapped.group(1), "variables": variables}
    tuned = all(variables.get(key) == value for key, value in GLIBC_KEEP.items())
    return {"name": "glibc" if tuned else "system", "library": None, "variables": variables}
