"""Memory peaks and GPU utilisation sampling."""

from __future__ import annotations

import os
import resource
import threading
import time
from contextlib import ExitStack

import psutil
import torch

from dpstudy.util import nvml


def peak_memory_mb(devices: list[int]) -> list[float]:
    """CUDA max allocated per driven device, else this process's peak RSS."""
    if devices:
        return [torch.cuda.max_memory_allocated(i) / 2**20 for i in devices]
    return [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]  # Linux reports KiB


def peak_reserved_mb(devices: list[int]) -> list[float]:
    """CUDA max reserved (the caching allocator's segments) per driven device."""
    return [torch.cuda.max_memory_reserved(i) / 2**20 for i in devices]


def process_used_mb(device: int) -> float | None:
    """This process's memory on a CUDA device as the driver counts it (NVML), context and all;
    None without NVML or where it cannot tell this process's share."""

    def read(pynvml) -> float | None:
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(device).uuid}")
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        mine = [p for p in processes if p.pid == os.getpid()]
        if not mine and len(processes) == 1:  # a container's PID namespace hides our pid: the only one is us
            mine = processes
        used = mine[0].usedGpuMemory if len(mine) == 1 else None
        return used / 2**20 if used else None  # None also where the driver does not say (NVML_VALUE_NOT_AVAILABLE)

    return nvml.query(read, None)


def rss_kib(field: str) -> int | None:
    """VmRSS, VmHWM (peak) ... of this process in KiB, from /proc/self/status; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            line = next((line for line in f if line.startswith(f"{field}:")), None)
    except OSError:
        return None
    return int(line.split()[1]) if line else None


def reset_rss_peak() -> bool:
    """Set this process's peak resident memory (VmHWM) to its current one (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def reset_peaks(devices: list[int]) -> None:
    for i in devices:
        torch.cuda.reset_peak_memory_stats(i)


class UtilSampler:
    """A thread that samples NVML utilisation and memory of the given CUDA devices.

    NVML numbers devices differently from CUDA (and CUDA_VISIBLE_DEVICES renumbers them), so
    devices are matched by UUID. One NVML session (dpstudy.util.nvml) stays open from start to stop.
    """

    def __init__(self, devices: list[int], interval_s: float = 0.5):
        self.devices, self.interval_s = devices, interval_s
        self.samples: dict[str, list[dict]] = {str(i): [] for i in devices}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list = []
        self._session = ExitStack()
        self._nvml = None

    def start(self) -> UtilSampler:
        if not self.devices:
            return self
        self._nvml = self._session.enter_context(nvml.session())
        try:
            if self._nvml is None:
                raise RuntimeError("NVML is not available (no NVIDIA driver or no nvidia-ml-py)")
            self._handles = [
                self._nvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(i).uuid}")
                for i in self.devices
            ]
        except Exception as e:  # no NVML: the record simply has no utilisation
            print(f"[dpstudy] GPU utilisation not sampled: {e}", flush=True)
            self._session.close()
            return self
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        t = time.perf_counter() - self._t0
        for i, handle in zip(self.devices, self._handles):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            self.samples[str(i)].append(
                {"t": round(t, 3), "gpu_util": rates.gpu, "mem_util": rates.memory, "mem_mb": memory.used / 2**20}
            )

    def stop(self) -> dict[str, list[dict]] | None:
        """The samples (None when nothing was sampled); a second call returns them unchanged."""
        if self._thread is None:
            return None
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            try:
                # One more at the end: NVML's utilisation covers the last sample period, so a run
                # shorter than the interval still has its number.
                self._sample()
            finally:
                self._session.close()
        return self.samples


class HostLoad:
    """How much CPU the rest of the machine used while a window of training ran.

    On a shared CPU host, other processes (and a hypervisor's steal time on a VM) are the largest
    source of run-to-run noise: a rank that loses its core for a while loses throughput. A mark
    holds the machine's busy + steal time and this process's own CPU time (its DataLoader workers
    included); two marks give both as cores over the window, so a run measured on a busy machine
    can be told from a quiet one.
    """

    def __init__(self):
        self.process = psutil.Process()

    def mark(self) -> tuple[float, float, float]:
        """(monotonic seconds, machine busy + steal CPU seconds, own CPU seconds)."""
        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        busy += getattr(t, "steal", 0.0)
        return time.monotonic(), busy, self.own_cpu()

    def own_cpu(self) -> float:
        total = 0.0
        for proc in (self.process, *self.process.children(recursive=True)):
            try:
                times = proc.cpu_times()
            except psutil.Error:  # a worker that just exited
                continue
            total += times.user + times.system
        return total

    @staticmethod
    def cores(start: tuple[float, float, float], end: tuple[float, float, float]) -> tuple[float, float]:
        """(machine's busy cores, this process's cores) over the window between two marks."""
        wall = max(end[0] - start[0], 1e-9)
        return (end[1] - start[1]) / wall, (end[2] - start[2]) / wall
