"""One way to ask NVML (nvidia-ml-py) a question: the GPUs' facts without importing torch."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


def query(read: Callable[[Any], T], default: T) -> T:
    """`read(pynvml)` inside an NVML session; `default` where there is no NVIDIA driver or NVML
    cannot answer (no library, a driver too old for the call)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return default
    try:
        return read(pynvml)
    except Exception:
        return default
    finally:
        pynvml.nvmlShutdown()
