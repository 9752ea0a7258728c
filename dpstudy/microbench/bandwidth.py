"""Achieved memory bandwidth of rgb_to_grayscale: bytes moved / time, against the device's peak.

The batch is far larger than any L2 cache (hundreds of MB), so every byte comes from and goes to
device memory: 3 bytes read and 1 written per pixel. Each run is timed with CUDA events around
the call on the current stream (host timers on CPU), after warm-up runs; the median counts.
The output is checked against dpstudy.ext.reference after the memory it will occupy was filled
with a poison value, so a kernel that skips pixels cannot pass on stale results.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from dpstudy.ext import reference

# 2048 images of 3x256x256: 384 MiB read + 128 MiB written per call (H100's L2 is 50 MB).
SHAPE = (2048, 3, 256, 256)
POISON = 0xA5
CHECK_CHUNK = 128  # images per reference call when checking the output


def grayscale_bytes(shape: tuple[int, ...]) -> int:
    """Bytes one rgb_to_grayscale call must move for uint8 [N, 3, H, W]: 3 read + 1 written per pixel."""
    *batch, channels, height, width = shape
    pixels = height * width
    for n in batch:
        pixels *= n
    return pixels * (channels + 1)


def time_calls(fn: Callable[[], object], device: torch.device, warmup: int, runs: int) -> list[float]:
    """Seconds per call of fn(), one figure per run. CUDA: an event pair around every call, all
    read after one synchronize at the end (no host sync between runs); CPU: perf_counter."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return times
    torch.cuda.synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) / 1e3 for start, end in events]  # elapsed_time is in ms


def check_output(op: Callable, images: torch.Tensor) -> dict:
    """Run `op` once into memory pre-filled with POISON and compare every image with the reference.

    The caching allocator hands a freed block back for the next request of its size, so the poison
    tensor's memory normally becomes the output; `poison_reused` says whether it did."""
    out_shape = (*images.shape[:-3], 1, *images.shape[-2:])
    poison = torch.full(out_shape, POISON, dtype=torch.uint8, device=images.device)
    address = poison.data_ptr()
    del poison
    out = op(images)
    reused = out.data_ptr() == address
    flat_in, flat_out = images.reshape(-1, *images.shape[-3:]), out.reshape(-1, *out.shape[-3:])
    mismatched = 0
    for start in range(0, len(flat_in), CHECK_CHUNK):
        expected = reference.rgb_to_grayscale(flat_in[start : start + CHECK_CHUNK])
        mismatched += int((flat_out[start : start + CHECK_CHUNK] != expected).sum())
    return {
        "correct": mismatched == 0,
        "mismatched_pixels": mismatched,
        "poison_reused": reused,
        "shape_ok": tuple(out.shape) == out_shape and out.dtype == torch.uint8,
    }


def measure(op: Callable, images: torch.Tensor, warmup: int = 10, runs: int = 100) -> dict:
    """Median time and achieved bandwidth (bytes/s) of op(images)."""
    times = time_calls(lambda: op(images), images.device, warmup, runs)
    median = statistics.median(times)
    moved = grayscale_bytes(tuple(images.shape))
    return {
        "bytes": moved,
        "runs": runs,
        "warmup": warmup,
        "median_s": median,
        "min_s": min(times),
        "max_s": max(times),
        "bandwidth_bps": moved / median,
    }


def grayscale(
    op: Callable,
    device: str | torch.device = "cuda",
    shape: tuple[int, ...] = SHAPE,
    warmup: int = 10,
    runs: int = 100,
    peak_bps: float | None = None,
    torchvision: bool = True,
    seed: int = 0,
) -> dict:
    """The extension's rgb_to_grayscale (`op`) on a random uint8 batch of `shape` on `device`:
    correctness (check_output), its bandwidth and, for context, torchvision's (float weights,
    truncating; several passes over float temporaries) on the same batch. With `peak_bps`, each
    bandwidth also as a fraction of it."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=generator)
    result = {
        "shape": list(shape),
        "device": str(device),
        "check": check_output(op, images),
        "extension": measure(op, images, warmup, runs),
    }
    if torchvision:
        from torchvision.transforms.v2.functional import rgb_to_grayscale as tv_gray

        result["torchvision"] = measure(tv_gray, images, warmup, runs)
    result["peak_bps"] = peak_bps
    for impl in ("extension", "torchvision"):
        if impl in result and peak_bps:
            result[impl]["fraction_of_peak"] = result[impl]["bandwidth_bps"] / peak_bps
    return result
