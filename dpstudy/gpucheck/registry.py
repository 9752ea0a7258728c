"""The eleven checks of `make gpu-check`, in order: the single source of their names, titles, the
function that runs each, and every figure each reports with its target (dpstudy.gpucheck.figures:
how figures read and are judged).

An item's function (in dpstudy.gpucheck.gputests, study, measurements, lm, forecast or scaling)
takes the output folder and returns a dict whose "figures" hold the values named here by key
("details" may say more about one); the summary compares each with its target. No torch here: the
summary is written on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpstudy.gpucheck.figures import Figure, Target

# A raw record's status where the host cannot run the item (too few GPUs): it neither passes nor
# fails, and says why (dpstudy.gpucheck.worker writes it, summary reads it)
NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class Item:
    name: str
    title: str
    function: str  # "module:function", imported only where the item runs
    figures: tuple[Figure, ...]
    timeout_s: int  # the runner stops the item after this long (a hang must not block the rest)

    def run(self, out) -> dict:
        import importlib

        module, function = self.function.split(":")
        return getattr(importlib.import_module(module), function)(out)


ITEMS: tuple[Item, ...] = (
    Item(
        "tests",
        "gpu-marked tests: CUDA kernels vs reference, opcheck, gradcheck, autocast, memory accounting",
        "dpstudy.gpucheck.gputests:run_tests",
        (
            Figure("ran", "gpu tests run (not skipped)", "count", Target(">=", 1)),
            Figure("failed", "gpu tests failed or in error", "count", Target("==", 0)),
            Figure("passed", "gpu tests passed", "count"),
            Figure("skipped", "gpu tests skipped", "count"),
            Figure("duration_s", "pytest wall time", "duration"),
        ),
        timeout_s=1800,
    ),
    Item(
        "study",
        "default study with device: cuda, end to end to the HTML report",
        "dpstudy.gpucheck.study:run_study",
        (
            Figure("snakemake_ok", "Snakemake finished without error", "bool", Target("true", text="yes")),
            Figure(
                "core_cells_ok",
                "single g1, dp g1, ddp g1 nccl, ddp g1 gloo cells",
                "bool",
                Target("true", text="all ok, on CUDA"),
            ),
            Figure(
                "too_big_skipped",
                "cells needing more GPUs than visible",
                "bool",
                Target("true", text="skipped, reason names GPUs"),
            ),
            Figure(
                "util_filled",
                "NVML utilisation of the ok cells",
                "bool",
                Target("true", text="samples for every ok cell"),
            ),
            Figure("report_html", "results/report/report.html", "bool", Target("true", text="written")),
            Figure(
                "floor_cv",
                "the machine's floor: CV of the reference workload over the rounds",
                "share",
                Target("<=", 0.02),
            ),
            Figure("single_cv", "largest single-device CV over repeats (CUDA cells)", "share", Target("<=", 0.02)),
            Figure("wall_s", "study wall time", "duration"),
        ),
        timeout_s=2400,
    ),
    Item(
        "loader",
        "device loader vs source 002's DataLoader (workers 0, affine), LeNet on 28x28",
        "dpstudy.gpucheck.measurements:run_loader",
        (
            Figure("speedup", "device loader (c) vs DataLoader (a), epoch time", "ratio", Target(">=", 20)),
            Figure("data_wait_share", "data wait in the device loader's epoch", "share", Target("<", 0.05)),
            Figure("a_samples_per_s", "(a) DataLoader, 0 workers, affine", "samples_per_s"),
            Figure("c_samples_per_s", "(c) device loader, affine", "samples_per_s"),
            Figure("c_vs_bound", "(c) epoch / bare-step bound (d)", "ratio"),
        ),
        timeout_s=900,
    ),
    Item(
        "resnet",
        "ResNet-18 (source 003's small-image variant), CIFAR-sized, batch 512, bf16 + channels_last",
        "dpstudy.gpucheck.measurements:run_resnet",
        (
            Figure(
                "images_per_s", "training images/s (device loader, steady epochs)", "img_per_s", Target(">=", 40_000)
            ),
            Figure("mfu", "MFU (dense BF16 peak)", "share"),
            Figure("achieved_tflops", "achieved FLOP/s (FLOPs per image x images/s)", "tflops"),
            Figure("flops_per_image", "FLOPs per image, forward + backward", "flop"),
            Figure("loss_finite", "training loss finite", "bool", Target("true", text="yes")),
        ),
        timeout_s=900,
    ),
    Item(
        "lm",
        "GPT-2 small (124M parameters, GPT-2's vocabulary), 1,024-token windows, batch 16, bf16, compiled: "
        "tokens/s and MFU; the memory plan vs the allocator, checkpointing none and full",
        "dpstudy.gpucheck.lm:run_lm",
        (
            Figure("mfu", "MFU (dense BF16 peak): the Trainer's compiled step", "share", Target(">=", 0.40)),
            Figure("tokens_per_s", "training tokens/s (steady epochs)", "tokens_per_s"),
            Figure("achieved_tflops", "achieved FLOP/s (FLOPs per token x tokens/s)", "tflops"),
            Figure("flops_per_token", "FLOPs per token, forward + backward (meta-device count)", "flop"),
            Figure("step_ms", "time per training step", "ms"),
            Figure("loss_share", "of it the eager loss outside the compiled model, timed alone", "share"),
            Figure("mfu_without_loss", "MFU of the step less that loss (an estimate)", "share"),
            Figure("compile_s", "steps that compiled (torch.compile, first step)", "duration"),
            Figure("loss_finite", "training loss finite", "bool", Target("true", text="yes")),
            Figure(
                "memory_none_error",
                "memory plan vs max_memory_allocated of one eager step, checkpointing none, absolute error",
                "share",
                Target("<=", 0.10),
            ),
            Figure("memory_full_error", "the same, checkpointing full", "share", Target("<=", 0.10)),
            Figure("checkpointing_saving_mb", "checkpointing full's saving (allocated, none - full)", "mb"),
        ),
        timeout_s=900,
    ),
    Item(
        "grayscale",
        "the extension's CUDA rgb_to_grayscale: achieved bandwidth vs the device's peak",
        "dpstudy.gpucheck.measurements:run_grayscale",
        (
            Figure("fraction_of_peak", "extension bandwidth / peak memory bandwidth", "share", Target(">=", 0.5)),
            Figure(
                "correct",
                "output equals dpstudy.ext.reference (poisoned output memory)",
                "bool",
                Target("true", text="yes"),
            ),
            Figure("bandwidth_bps", "extension achieved bandwidth", "bytes_per_s"),
            Figure("median_ms", "extension median time per call", "ms"),
            Figure("torchvision_bps", "torchvision rgb_to_grayscale (float), same batch", "bytes_per_s"),
        ),
        timeout_s=1500,
    ),
    Item(
        "comm",
        "NCCL and Gloo all-reduce on CUDA tensors",
        "dpstudy.gpucheck.measurements:run_comm",
        (
            Figure("ran", "both backends ran without error", "bool", Target("true", text="yes")),
            Figure("nccl_busbw_gbps", "NCCL bus bandwidth, largest size", "gb_per_s"),
            Figure("nccl_latency_us", "NCCL latency, smallest size", "us"),
            Figure("gloo_busbw_gbps", "Gloo bus bandwidth, largest size", "gb_per_s"),
            Figure("gloo_latency_us", "Gloo latency, smallest size", "us"),
        ),
        timeout_s=900,
    ),
    Item(
        "forecast",
        "forecasts on one GPU: throughput at batches not calibrated on, memory against the allocator",
        "dpstudy.gpucheck.forecast:run_forecast",
        (
            Figure(
                "batch_median_error",
                "throughput forecast from the smallest and largest batch, median absolute error at the others",
                "share",
                Target("<=", 0.05),
            ),
            Figure("batch_max_error", "the same, largest absolute error", "share"),
            Figure(
                "memory_forecast_max_error",
                "memory forecast (plan + the allocator's excess on the model's other batches) vs "
                "max_memory_allocated, largest absolute error",
                "share",
                Target("<=", 0.10),
            ),
            Figure("memory_forecast_median_error", "the same, median absolute error", "share"),
            Figure("memory_max_error", "the plan alone (no cell read), largest absolute error", "share"),
            Figure("memory_median_error", "the plan alone, median absolute error", "share"),
            Figure("oom_cells", "cells the plan let through that ran out of memory", "count", Target("==", 0)),
            Figure(
                "edge_ok",
                "the edge cell (resnet18 at the largest batch predicted to need <= 90 % of the GPU)",
                "bool",
                Target("true", text="ran, no out-of-memory"),
            ),
            Figure("edge_share", "the edge cell's max_memory_allocated / the GPU's memory", "share"),
            Figure("reserved_over_allocated", "max_memory_reserved / max_memory_allocated, median", "ratio"),
            Figure("context_mb", "CUDA context and library buffers (NVML used - reserved), median", "mb"),
            Figure("single_cv", "largest single-device CV over repeats (CUDA cells)", "share", Target("<=", 0.02)),
            Figure("floor_cv", "the machine's floor: CV of the reference workload over the rounds", "share"),
            Figure("wall_s", "study wall time", "duration"),
        ),
        timeout_s=1200,
    ),
    Item(
        "scaling",
        "forecasts beyond two GPUs (DDP and FSDP) calibrated on one and two, against cells that ran",
        "dpstudy.gpucheck.scaling:run_scaling",
        (
            Figure(
                "scaling_median_error",
                "throughput forecast on 3+ GPUs from 1-2 GPUs' cells, median absolute error",
                "share",
                Target("<=", 0.10),
            ),
            Figure("scaling_max_error", "the same, largest absolute error", "share", Target("<=", 0.25)),
            Figure("scaling_inside", "measured throughputs inside their forecasts' 95 % intervals", "share"),
            Figure("scaling_checked", "settings forecast and checked", "count", Target(">=", 1)),
            Figure("wall_s", "study wall time", "duration"),
        ),
        timeout_s=1800,
    ),
    Item(
        "trace",
        "a trace of a two-rank Gloo DDP cell sharing one GPU, reduced from its CUDA kernels",
        "dpstudy.gpucheck.trace:run_trace",
        (
            Figure("from_kernels", "compute read from CUDA kernels", "bool", Target("true", text="yes")),
            Figure(
                "parts_add_up",
                "data wait + compute + exposed comm + idle = the step",
                "bool",
                Target("true", text="yes"),
            ),
            Figure("files_kept", "both ranks' traces kept", "bool", Target("true", text="yes")),
            Figure("step_ms", "the traced step (median), the pace-setting rank's", "ms"),
            Figure("compute_ms", "of it, CUDA kernels", "ms"),
            Figure("exposed_comm_ms", "of it, Gloo's all-reduce on the critical path", "ms"),
            Figure("overlap", "the all-reduce's share hidden by kernels", "share"),
            Figure("all_reduce_calls", "all-reduces per step", "count"),
            Figure("all_reduce_mb", "all-reduced MB per step (the tensors the rank handed Gloo)", "mb"),
        ),
        timeout_s=600,
    ),
    Item(
        "zero",
        "DeepSpeed ZeRO-2 and ZeRO-3 beside FSDP full: the lm item's GPT-2 small on one GPU over NCCL, eager, "
        "bf16: tokens/s, MFU, the memory plan vs the allocator",
        "dpstudy.gpucheck.zero:run_zero",
        (
            *(
                figure
                for name, label in (("fsdp", "FSDP full"), ("zero2", "ZeRO-2"), ("zero3", "ZeRO-3"))
                for figure in (
                    Figure(f"{name}_tokens_per_s", f"{label}: training tokens/s (steady epochs)", "tokens_per_s"),
                    Figure(f"{name}_mfu", f"{label}: MFU (dense BF16 peak)", "share"),
                    Figure(f"{name}_allocated_mb", f"{label}: max_memory_allocated of one step", "mb"),
                    Figure(
                        f"{name}_memory_error",
                        f"{label}: memory plan vs max_memory_allocated, absolute error",
                        "share",
                        Target("<=", 0.15),
                    ),
                )
            ),
            Figure("zero2_vs_fsdp", "ZeRO-2's tokens/s over FSDP full's", "ratio"),
            Figure("zero3_vs_fsdp", "ZeRO-3's tokens/s over FSDP full's", "ratio"),
        ),
        timeout_s=900,
    ),
)

NAMES: tuple[str, ...] = tuple(item.name for item in ITEMS)
BY_NAME: dict[str, Item] = {item.name: item for item in ITEMS}
