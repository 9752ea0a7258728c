"""The one way to open NVML (nvidia-ml-py): the GPUs' facts without importing torch.

`session()` is the only place that calls nvmlInit and nvmlShutdown; `query()` asks one question
inside a session of its own, and a long reader (the engine's utilisation sampler) keeps one open.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


@functools.cache
def driver_library() -> bool:
    """Whether the driver's NVML library loads, found as pynvml finds it on Linux. Without it pynvml
    could only fail, and importing pynvml costs 60 ms: every Snakemake run and job asks for the GPUs."""
    if not sys.platform.startswith("linux"):
        return True  # pynvml looks elsewhere there: let it
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@contextmanager
def session() -> Iterator[Any]:
    """The pynvml module inside an NVML session, shut down when the block ends; None where there
    is no NVIDIA driver or no nvidia-ml-py, so that callers report nothing instead of failing."""
    if not driver_library():
        yield None
        return
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def query(read: Callable[[Any], T], default: T) -> T:
    """`read(pynvml)` inside an NVML session; `default` where there is none or NVML cannot answer
    (a driver too old for the call)."""
    with session() as nvml:
        if nvml is None:
            return default
        try:
            return read(nvml)
        except Exception:
            return default


def gpu_count() -> int:
    """The GPUs NVML sees on this host, whatever CUDA_VISIBLE_DEVICES says (0 without a driver)."""
    return query(lambda n: n.nvmlDeviceGetCount(), 0)
