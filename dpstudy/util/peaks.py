"""What a GPU can do at best: dense FLOP/s at each precision and memory bandwidth, by device name.

MFU (model FLOPs utilisation) divides achieved FLOP/s by the dense peak at the cell's precision
(`tflops`: bf16 and fp16 the tensor cores' `bf16_tflops`, fp32 the CUDA cores' `fp32_tflops`, as
PyTorch runs fp32 matrix products without TF32 unless told); a bandwidth benchmark
divides achieved bytes/s by the peak memory bandwidth, which `memory_bandwidth` reads from the
device itself where torch or NVML tell the memory clock and bus width, else from this table.

Figures are NVIDIA's datasheet figures. Datasheets quote tensor-core FLOP/s "with sparsity"
(2:4 structured sparsity); dense training runs at half of that, which is what the table holds.
An entry without a figure for a precision gives no MFU at it, never another device's figure.
TB/s are 10^12 bytes per second, as the datasheets count them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpstudy.util import nvml

# Sources (NVIDIA product pages and datasheets):
H100 = "NVIDIA H100 datasheet, https://www.nvidia.com/en-us/data-center/h100/ (SXM 1,979 / PCIe 1,513 / NVL 1,671 TFLOPS BF16 with sparsity; FP32 67 / 51 / 60 TFLOPS)"
H200 = "NVIDIA H200 datasheet, https://www.nvidia.com/en-us/data-center/h200/ (SXM 1,979 / NVL 1,671 TFLOPS BF16 with sparsity; FP32 67 / 60 TFLOPS; 4.8 TB/s)"
GH200 = "NVIDIA GH200 datasheet, https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ (1,979 TFLOPS BF16 with sparsity; FP32 67 TFLOPS; 4 TB/s HBM3, 4.9 TB/s HBM3e)"
A100 = "NVIDIA A100 datasheet, https://www.nvidia.com/en-us/data-center/a100/ (312 TFLOPS BF16 dense; FP32 19.5 TFLOPS; 1,555 GB/s 40GB, 1,935 GB/s 80GB PCIe, 2,039 GB/s 80GB SXM)"
A10 = "NVIDIA A10 datasheet, https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (125 TFLOPS BF16 dense; FP32 31.2 TFLOPS; 600 GB/s)"
L4 = "NVIDIA L4 datasheet, https://www.nvidia.com/en-us/data-center/l4/ (242 TFLOPS BF16 with sparsity; FP32 30.3 TFLOPS; 300 GB/s)"
L40 = "NVIDIA L40 datasheet, https://www.nvidia.com/en-us/data-center/l40/ (181 TFLOPS BF16 dense; FP32 90.5 TFLOPS; 864 GB/s)"
L40S = "NVIDIA L40S datasheet, https://www.nvidia.com/en-us/data-center/l40s/ (733 TFLOPS BF16 with sparsity; FP32 91.6 TFLOPS; 864 GB/s)"
B200 = "NVIDIA HGX B200 datasheet, https://www.nvidia.com/en-us/data-center/hgx/ (4.5 PFLOPS FP16/BF16 with sparsity per GPU, 8 TB/s)"
GB200 = "NVIDIA GB200 NVL72 datasheet, https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (5 PFLOPS FP16/BF16 with sparsity per GPU, 8 TB/s)"


@dataclass(frozen=True)
class Peak:
    pattern: str  # regular expression searched in torch.cuda.get_device_name() (case-insensitive)
    label: str  # the product this row describes
    bf16_tflops: float  # dense BF16 tensor-core TFLOP/s
    mem_tbps: float  # memory bandwidth, TB/s
    source: str
    fp32_tflops: float | None = None  # dense FP32 (CUDA cores, no TF32); None: not in the cited datasheet

    def tflops(self, precision: str) -> float | None:
        """The dense peak at a cell's precision (fp32, bf16, fp16), or None where the source gives none."""
        return self.fp32_tflops if precision == "fp32" else self.bf16_tflops


# First match wins: the specific names come before the families that contain them.
# torch names them e.g. "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
# "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB", "NVIDIA GH200 480GB".
TABLE: tuple[Peak, ...] = (
    Peak(r"GH200.*(144|HBM3e)", "GH200 144GB HBM3e", 989.5, 4.9, GH200, 67.0),
    Peak(r"GH200", "GH200 96GB HBM3", 989.5, 4.0, GH200, 67.0),
    Peak(r"H200 NVL", "H200 NVL", 835.5, 4.8, H200, 60.0),
    Peak(r"H200", "H200 SXM", 989.5, 4.8, H200, 67.0),
    Peak(r"H100 NVL", "H100 NVL", 835.5, 3.9, H100, 60.0),
    Peak(r"H100 PCIe", "H100 PCIe", 756.5, 2.0, H100, 51.0),
    Peak(r"H100", "H100 SXM", 989.5, 3.35, H100, 67.0),
    Peak(r"A100.*80\s*GB.*PCIe", "A100 80GB PCIe", 312.0, 1.935, A100, 19.5),
    Peak(r"A100.*80\s*GB", "A100 80GB SXM", 312.0, 2.039, A100, 19.5),
    Peak(r"A100", "A100 40GB", 312.0, 1.555, A100, 19.5),
    Peak(r"\bA10\b", "A10", 125.0, 0.6, A10, 31.2),
    Peak(r"L40S", "L40S", 362.0, 0.864, L40S, 91.6),
    Peak(r"\bL40\b", "L40", 181.0, 0.864, L40, 90.5),
    Peak(r"\bL4\b", "L4", 121.0, 0.3, L4, 30.3),
    Peak(r"GB200", "GB200", 2500.0, 8.0, GB200),
    Peak(r"B200", "B200", 2250.0, 8.0, B200),
)


def lookup(device_name: str) -> Peak | None:
    """The table's row for a device name, or None when the device is not in the table."""
    for peak in TABLE:
        if re.search(peak.pattern, device_name, re.IGNORECASE):
            return peak
    return None


def memory_bandwidth(index: int = 0) -> tuple[float | None, str]:
    """(peak memory bandwidth of CUDA device `index` in bytes/s, where the figure comes from).

    Double data rate: 2 x memory clock x bus width / 8. torch >= 2.8 reports the clock (kHz) and
    bus width (bits) in get_device_properties; older torch does not, so NVML is asked next, then
    the table; None when none of them knows the device."""
    import torch

    props = torch.cuda.get_device_properties(index)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return (
            2 * clock_khz * 1e3 * bus_bits / 8,
            f"device properties: 2 x {clock_khz / 1e3:.0f} MHz x {bus_bits}-bit bus",
        )
    from_nvml = _nvml_memory(props.uuid)
    if from_nvml:
        clock_mhz, bus_bits = from_nvml
        return 2 * clock_mhz * 1e6 * bus_bits / 8, f"NVML: 2 x {clock_mhz} MHz x {bus_bits}-bit bus"
    peak = lookup(props.name)
    if peak:
        return peak.mem_tbps * 1e12, f"{peak.label} datasheet (dpstudy.util.peaks)"
    return None, f"unknown: {props.name} is not in dpstudy.util.peaks and reports no memory clock"


def _nvml_memory(uuid) -> tuple[int, int] | None:
    """(max memory clock MHz, bus width bits) from NVML, or None."""

    def read(n):
        handle = n.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        return n.nvmlDeviceGetMaxClockInfo(handle, n.NVML_CLOCK_MEM), n.nvmlDeviceGetMemoryBusWidth(handle)

    clock, bus = nvml.query(read, (None, None))
    return (int(clock), int(bus)) if clock and bus else None
