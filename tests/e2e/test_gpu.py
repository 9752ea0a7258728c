"""What only a GPU can check (marked `gpu`, skipped without CUDA; `make gpu-check` runs them):

- the extension's CUDA kernels (rgb_to_grayscale, conv2d forward/backward, max_pool2d
  forward/backward) against dpstudy.ext.reference and PyTorch on shapes drawn at random from a
  fresh seed every run (odd sizes, batch 1, non-contiguous inputs), the seed printed and recorded
  in the JUnit XML so that a failure can be replayed: DPSTUDY_GPU_SEED=<seed> pytest -m gpu tests/e2e/test_gpu.py;
- torch.library.opcheck on CUDA inputs and torch.autograd.gradcheck on CUDA float64;
- autocast bf16 and fp16: lenet and lenet_ext training steps under the project's Trainer, and
  what the extension's operators do under autocast (they are not cast: they run in float32);
- CUDA memory accounting: dpstudy.engine.monitor's peaks are torch.cuda's and reset with reset_peaks.
- an fsdp cell over NCCL (torchrun, resnet18) in fp32, bf16 and fp16, and a single cell: what
  their records say the allocator and the driver held (allocated, reserved, context, resident data).
"""

from __future__ import annotations

import math
import os
import random
import secrets

import pytest
import torch
import torch.nn.functional as F
from helpers import REPO

import dpstudy.ext
from dpstudy.data.task import Task
from dpstudy.ext import reference

EXT_TEST_DIR = REPO / "results" / "ext-test"  # the build test_ext.py and test_bench.py use: one nvcc run
CUDA = torch.cuda.is_available()
SEED = int(os.environ.get("DPSTUDY_GPU_SEED") or secrets.randbelow(2**31))
REPLAY = (
    f"shapes drawn from seed {SEED}; replay with DPSTUDY_GPU_SEED={SEED} python -m pytest -m gpu tests/e2e/test_gpu.py"
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")]
_rng = random.Random(SEED)


@pytest.fixture(scope="session")
def ops():
    # CUDA kernels for the visible GPUs (cpu_only=False when one is visible), reused when up to date.
    dpstudy.ext.build(EXT_TEST_DIR, cpu_only=not CUDA)
    module = dpstudy.ext.load(EXT_TEST_DIR)
    from dpstudy.ext.loader import check_kernels

    check_kernels(range(torch.cuda.device_count()))  # kernels for this GPU, or the reason they are missing
    return module


@pytest.fixture(scope="module", autouse=True)
def seed(record_testsuite_property):
    record_testsuite_property("dpstudy_gpu_seed", SEED)
    print(REPLAY)
    return SEED


def _message(text: str) -> str:
    return f"{text}\n{REPLAY}"


def _layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values in a non-contiguous arrangement (or x itself for "contiguous")."""
    if layout == "channels_last":
        order = (0, 2, 3, 1) if x.dim() == 4 else (1, 2, 0)
        back = (0, 3, 1, 2) if x.dim() == 4 else (2, 0, 1)
        return x.permute(order).contiguous().permute(back)
    if layout == "strided":  # every other column of a tensor twice as wide
        wide = torch.repeat_interleave(x, 2, dim=-1)
        return wide[..., ::2]
    if layout == "transposed":
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x


def _random(shape, dtype=torch.float32, generator=None) -> torch.Tensor:
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=dtype, device="cuda", generator=generator)
    return torch.randn(shape, dtype=dtype, device="cuda", generator=generator)


def _generator() -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(SEED)


# ---- shapes never seen before: drawn at collection from this run's seed -----------------------


def _gray_cases() -> list:
    cases = []
    for layout in ("contiguous", "channels_last", "strided", "transposed"):
        for batch in (None, 1, _rng.randint(2, 7)):
            height, width = 2 * _rng.randint(0, 90) + 1, _rng.randint(1, 181)  # odd heights
            cases.append(
                pytest.param(
                    (batch, height, width, layout), id=f"{batch or ''}{'x' if batch else ''}3x{height}x{width}-{layout}"
                )
            )
    return cases


def _conv_cases(count: int = 8) -> list:
    cases = []
    for i in range(count):
        n = 1 if i % 3 == 0 else _rng.randint(2, 5)
        c, o = _rng.randint(1, 8), _rng.randint(1, 9)
        kh, kw = _rng.randint(1, 5), _rng.randint(1, 5)
        sh, sw = _rng.randint(1, 3), _rng.randint(1, 3)
        ph, pw = _rng.randint(0, min(2, kh - 1)), _rng.randint(0, min(2, kw - 1))
        h, w = _rng.randint(max(1, kh - 2 * ph), 33), _rng.randint(max(1, kw - 2 * pw), 33)
        bias = _rng.random() < 0.7
        layout = ("contiguous", "channels_last", "strided")[i % 3]
        case = (n, c, h, w, o, kh, kw, (sh, sw), (ph, pw), bias, layout)
        cases.append(
            pytest.param(
                case, id=f"{n}x{c}x{h}x{w}-o{o}-k{kh}x{kw}-s{sh}x{sw}-p{ph}x{pw}{'-bias' if bias else ''}-{layout}"
            )
        )
    return cases


def _pool_cases(count: int = 8) -> list:
    cases = []
    for i in range(count):
        n = 1 if i % 3 == 0 else _rng.randint(2, 5)
        c = _rng.randint(1, 6)
        kh, kw = _rng.randint(1, 4), _rng.randint(1, 4)
        sh, sw = _rng.randint(1, kh + 1), _rng.randint(1, kw + 1)  # overlapping windows (stride < kernel) too
        h, w = _rng.randint(kh, 41), _rng.randint(kw, 41)
        layout = ("contiguous", "channels_last", "strided")[i % 3]
        case = (n, c, h, w, (kh, kw), (sh, sw), layout)
        cases.append(pytest.param(case, id=f"{n}x{c}x{h}x{w}-k{kh}x{kw}-s{sh}x{sw}-{layout}"))
    return cases


GRAY_CASES, CONV_CASES, POOL_CASES = _gray_cases(), _conv_cases(), _pool_cases()


# ---- rgb_to_grayscale --------------------------------------------------------------------------


@pytest.mark.parametrize("case", GRAY_CASES)
def test_grayscale_kernel_matches_reference(ops, case):
    batch, height, width, layout = case
    shape = (3, height, width) if batch is None else (batch, 3, height, width)
    images = _layout(_random(shape, torch.uint8, _generator()), layout)
    out = ops.rgb_to_grayscale(images)
    expected = reference.rgb_to_grayscale(images)
    assert out.is_cuda and out.dtype == torch.uint8 and out.shape == expected.shape, _message(str(out.shape))
    assert torch.equal(out, expected), _message(f"{int((out != expected).sum())} pixels differ")
    assert torch.equal(out.cpu(), ops.rgb_to_grayscale(images.cpu())), _message("CUDA and CPU kernels differ")


def test_grayscale_kernel_rounds_every_rgb_triple_exactly(ops):
    v = torch.arange(1 << 24, dtype=torch.int32, device="cuda")
    images = torch.stack([v >> 16, (v >> 8) & 255, v & 255]).to(torch.uint8).view(3, 4096, 4096)
    assert torch.equal(ops.rgb_to_grayscale(images), reference.rgb_to_grayscale(images))


# ---- conv2d ------------------------------------------------------------------------------------


def _conv_inputs(case, dtype=torch.float32):
    n, c, h, w, o, kh, kw, stride, padding, bias, layout = case
    g = _generator()
    x = _layout(_random((n, c, h, w), dtype, g), layout).requires_grad_()
    weight = _random((o, c, kh, kw), dtype, g).requires_grad_()
    b = _random((o,), dtype, g).requires_grad_() if bias else None
    return x, weight, b, stride, padding


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_kernels_match_pytorch_forward_and_backward(ops, case):
    x, weight, bias, stride, padding = _conv_inputs(case)
    leaves = [t for t in (x, weight, bias) if t is not None]
    # The reference in float64: PyTorch's own float32 conv may use TF32 on this GPU (cuDNN's default).
    exact = [t.detach().double().requires_grad_() for t in leaves]
    ours = ops.conv2d(x, weight, bias, stride, padding)
    ref = F.conv2d(exact[0], exact[1], exact[2] if bias is not None else None, stride, padding)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-4, atol=1e-4, msg=_message)
    grad = torch.randn(ours.shape, device="cuda", generator=_generator())
    for name, got, want in zip(
        ("input", "weight", "bias"),
        torch.autograd.grad(ours, leaves, grad),
        torch.autograd.grad(ref, exact, grad.double()),
    ):
        torch.testing.assert_close(
            got, want.float(), rtol=1e-4, atol=1e-4, msg=lambda m, name=name: _message(f"grad of {name}: {m}")
        )


# ---- max_pool2d --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool2d_kernels_match_pytorch_forward_and_backward(ops, case):
    n, c, h, w, kernel, stride, layout = case
    x = _layout(_random((n, c, h, w), generator=_generator()), layout).requires_grad_()
    ours = ops.max_pool2d(x, kernel, stride)
    theirs, indices = F.max_pool2d(x, kernel, stride, return_indices=True)
    assert torch.equal(ours, theirs), _message("max_pool2d values differ")
    _, our_indices = torch.ops.dpstudy.max_pool2d(x, list(kernel), list(stride))
    assert torch.equal(our_indices, indices), _message("max_pool2d indices differ")
    grad = torch.randn(ours.shape, device="cuda", generator=_generator())
    # The CUDA backward adds with atomics, so overlapping windows may sum in another order.
    torch.testing.assert_close(
        torch.autograd.grad(ours, x, grad)[0], torch.autograd.grad(theirs, x, grad)[0], msg=_message
    )


# ---- opcheck and gradcheck on CUDA -------------------------------------------------------------


def _opcheck_cases() -> dict:
    """Operator and CUDA arguments per case, built lazily (the operators exist after the build)."""
    g = lambda: _generator()  # noqa: E731

    def conv2d(dtype):
        x, weight, bias, stride, padding = _conv_inputs(CONV_CASES[1].values[0], dtype)
        return "conv2d", (x, weight, bias, list(stride), list(padding))

    def conv2d_backward():
        x, weight, _, stride, padding = _conv_inputs(CONV_CASES[2].values[0])
        out = F.conv2d(x.detach(), weight.detach(), None, stride, padding)
        return "conv2d_backward", (
            torch.randn(out.shape, device="cuda", generator=g()),
            x.detach(),
            weight.detach(),
            list(stride),
            list(padding),
        )

    def max_pool2d():
        n, c, h, w, kernel, stride, _ = POOL_CASES[1].values[0]
        return "max_pool2d", (_random((n, c, h, w), generator=g()).requires_grad_(), list(kernel), list(stride))

    def max_pool2d_backward():
        n, c, h, w, kernel, stride, _ = POOL_CASES[2].values[0]
        out, indices = torch.ops.dpstudy.max_pool2d(_random((n, c, h, w), generator=g()), list(kernel), list(stride))
        return "max_pool2d_backward", (torch.randn(out.shape, device="cuda", generator=g()), indices, [h, w])

    batch, height, width, _ = GRAY_CASES[2].values[0]
    return {
        "rgb_to_grayscale": lambda: ("rgb_to_grayscale", (_random((batch, 3, height, width), torch.uint8, g()),)),
        "conv2d_float32": lambda: conv2d(torch.float32),
        "conv2d_float64": lambda: conv2d(torch.float64),
        "conv2d_backward": conv2d_backward,
        "max_pool2d": max_pool2d,
        "max_pool2d_backward": max_pool2d_backward,
    }


@pytest.mark.parametrize("case", list(_opcheck_cases()))
def test_opcheck_on_cuda(ops, case):
    from torch.library import opcheck

    op, args = _opcheck_cases()[case]()
    opcheck(getattr(torch.ops.dpstudy, op).default, args)


def _small_conv_case():
    c, o, kh, kw = _rng.randint(1, 2), _rng.randint(1, 3), _rng.randint(1, 3), _rng.randint(1, 3)
    ph, pw = _rng.randint(0, kh - 1), _rng.randint(0, kw - 1)
    return (
        _rng.randint(1, 2),
        c,
        _rng.randint(kh, 6),
        _rng.randint(kw, 6),
        o,
        kh,
        kw,
        (_rng.randint(1, 2), _rng.randint(1, 2)),
        (ph, pw),
        _rng.random() < 0.5,
        "contiguous",
    )


def _small_pool_case():
    kernel = _rng.randint(2, 3)
    return (
        _rng.randint(1, 2),
        _rng.randint(1, 2),
        _rng.randint(kernel, 7),
        _rng.randint(kernel, 7),
        (kernel, kernel),
        (_rng.randint(1, kernel), _rng.randint(1, kernel)),
    )


GRADCHECK_CONV = [_small_conv_case() for _ in range(2)]
GRADCHECK_POOL = [_small_pool_case() for _ in range(2)]


# Small: gradcheck perturbs every element. nondet_tol: the CUDA backwards add with atomics.
@pytest.mark.parametrize("case", GRADCHECK_CONV, ids=lambda c: "x".join(map(str, c[:4])))
def test_conv2d_gradcheck_on_cuda_float64(ops, case):
    x, weight, bias, stride, padding = _conv_inputs(case, torch.float64)
    inputs = (x, weight, bias) if bias is not None else (x, weight)
    assert torch.autograd.gradcheck(
        lambda *t: ops.conv2d(*t, stride=stride, padding=padding), inputs, nondet_tol=1e-10
    ), REPLAY


@pytest.mark.parametrize("case", GRADCHECK_POOL, ids=lambda c: "x".join(map(str, c[:4])))
def test_max_pool2d_gradcheck_on_cuda_float64(ops, case):
    n, c, h, w, kernel, stride = case
    x = _random((n, c, h, w), torch.float64, _generator()).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ops.max_pool2d(t, kernel, stride), (x,), nondet_tol=1e-10), REPLAY


# ---- autocast ----------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("model", ["lenet", "lenet_ext"])
def test_trainer_steps_under_autocast_on_cuda(ops, model, precision):
    """A few Trainer steps on one batch as a cell runs them (autocast, GradScaler for fp16): the
    loss stays finite and falls."""
    from dpstudy import models
    from dpstudy.data import synthetic
    from dpstudy.engine.modes import MODES
    from dpstudy.engine.train import Trainer
    from dpstudy.study.spec import complete

    torch.manual_seed(SEED)
    spec = complete(
        {
            "dataset": "synthetic",
            "model": model,
            "mode": "single",
            "precision": precision,
            "optimizer": "adam",
            "lr": 0.003,
            "device": "cuda",
        }
    )
    net = models.build(model, Task.image(1, 28, 10)).cuda()
    trainer = Trainer(
        spec,
        MODES["single"](torch.device("cuda", torch.cuda.current_device())),
        None,
        None,
        net,
        log=lambda line: None,
    )
    assert trainer.scaler.is_enabled() == (precision == "fp16")
    images, labels = synthetic.samples(synthetic.prototypes(1, 28, 0), 128, 28, torch.Generator().manual_seed(SEED))
    x, y = ((images.float() / 255 - 0.5) / 0.25).cuda(), labels.cuda()
    losses = []
    for _ in range(30):
        loss_sum, _ = trainer.step(x, y)
        losses.append(loss_sum.item() / len(y))
    assert all(math.isfinite(v) for v in losses), _message(f"losses {losses}")
    assert losses[-1] < 0.8 * losses[0], _message(f"losses {losses[0]:.3f} -> {losses[-1]:.3f}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_extension_ops_are_not_cast_by_autocast(ops, dtype):
    """Autocast has no rule for the dpstudy operators: they fall through and run in the dtype
    they are given (float32 inside lenet_ext, whose input is float32), while PyTorch's own ops
    around them are cast as usual. A half-precision tensor given to them is a clear error."""
    g = _generator()
    x, weight, bias = _random((2, 3, 9, 9), generator=g), _random((4, 3, 3, 3), generator=g), _random((4,), generator=g)
    with torch.autocast("cuda", dtype=dtype):
        conv = ops.conv2d(x, weight, bias, padding=1)
        pooled = ops.max_pool2d(conv, 2)
        linear = F.linear(pooled.flatten(1), _random((10, pooled[0].numel()), generator=g))
    assert conv.dtype == pooled.dtype == torch.float32
    assert linear.dtype == dtype
    with pytest.raises(RuntimeError, match="must be float32 or float64"):
        ops.conv2d(x.to(dtype), weight.to(dtype))


# ---- CUDA memory accounting --------------------------------------------------------------------


@pytest.mark.parametrize("device", range(torch.cuda.device_count()) if CUDA else [0])
def test_peak_memory_is_cuda_max_allocated_and_resets(device):
    from dpstudy.engine.monitor import peak_memory_mb, reset_peaks

    mib = 2**20
    torch.cuda.synchronize(device)
    reset_peaks([device])
    base = torch.cuda.memory_allocated(device)
    assert peak_memory_mb([device]) == [torch.cuda.max_memory_allocated(device) / mib]
    block = torch.empty(64 * mib, dtype=torch.uint8, device=device)  # a known 64 MiB allocation
    peak = peak_memory_mb([device])[0]
    assert peak == torch.cuda.max_memory_allocated(device) / mib
    assert peak >= (base + 64 * mib) / mib
    del block
    reset_peaks([device])
    after = peak_memory_mb([device])[0]
    assert after == torch.cuda.memory_allocated(device) / mib
    assert after <= peak - 64


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_fsdp_cell_over_nccl_trains_on_cuda(tmp_path, precision):
    """An fsdp cell as the workflow runs it (torchrun, NCCL, a device mesh of every visible GPU up
    to 2), resnet18 with BatchNorm: the MixedPrecisionPolicy path for bf16 and fp16 (GradScaler)."""
    import json
    import subprocess
    import sys

    from dpstudy.data import store
    from dpstudy.record import fields as record

    gpus = min(2, torch.cuda.device_count())
    store.prepare("synthetic", tmp_path / "data", {"train_size": 2048, "test_size": 257})
    spec = {
        "dataset": "synthetic",
        "model": "resnet18",
        "mode": "fsdp",
        "gpus": gpus,
        "backend": "nccl",
        "batch": 128,
        "epochs": 2,
        "lr": 0.02,
        "precision": precision,
        "device": "cuda",
        "data_root": str(tmp_path / "data"),
    }
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]
    argv = [*torchrun, "-m", "dpstudy.engine", "--spec", json.dumps(spec), "--out", str(tmp_path / "cell")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, _message(proc.stderr[-3000:])
    rec = record.read(tmp_path / "cell/record.json")
    assert rec["status"] == "ok", _message(rec["reason"])
    assert rec["env"]["device"] == "cuda" and rec["env"]["world_size"] == gpus
    first, last = rec["epochs"]
    assert math.isfinite(last["train_loss"]) and last["train_loss"] < first["train_loss"], _message(
        f"train loss {first['train_loss']:.3f} -> {last['train_loss']:.3f}"
    )
    assert last["test_acc"] * 257 == pytest.approx(round(last["test_acc"] * 257), abs=1e-6)  # each image once
    # the allocator's and the driver's view of the measured step, every rank (record.fields.ALLOCATOR_PARTS)
    _assert_allocator_view(rec, gpus, resident=(2048 + 257) * (28 * 28 + 8) / 2**20)  # every rank: both splits


def _assert_allocator_view(rec: dict, devices: int, resident: float) -> None:
    memory, last = rec["memory"], rec["epochs"][-1]
    total = torch.cuda.get_device_properties(0).total_memory / 2**20
    for d in range(devices):
        view = {k: memory[k][d] for k in ("peak_mb", "allocated_mb", "reserved_mb", "context_mb", "total_mb")}
        # the tracker counts tensors; the allocator holds them, rounded up, and what predates the step
        assert view["allocated_mb"] >= 0.99 * (view["peak_mb"] + memory["resident_mb"][d]), _message(str(view))
        assert view["reserved_mb"] >= view["allocated_mb"], _message(str(view))
        assert view["total_mb"] == pytest.approx(total), _message(str(view))
        # a CUDA context with cuBLAS's handles: hundreds of MB, never gigabytes, never nothing
        assert view["context_mb"] is not None and 50 < view["context_mb"] < 4096, _message(str(view))
        assert memory["resident_mb"][d] == pytest.approx(resident, abs=1e-9)
        assert last["peak_reserved_mb"][d] >= last["peak_mem_mb"][d] > 0


def test_single_cell_records_what_the_allocator_held(tmp_path):
    """A single CUDA cell with the `device` loader: its record has the allocator's peaks, the CUDA
    context, the device's total and the resident dataset's exact bytes (uint8 images, int64 labels)."""
    import json
    import subprocess
    import sys

    from dpstudy.data import store
    from dpstudy.record import fields as record

    store.prepare("synthetic", tmp_path / "data", {"train_size": 1024, "test_size": 256})
    spec = {
        "dataset": "synthetic",
        "model": "resnet18",
        "mode": "single",
        "batch": 256,
        "epochs": 1,
        "loader": "device",
        "device": "cuda",
        "data_root": str(tmp_path / "data"),
    }
    argv = [sys.executable, "-m", "dpstudy.engine", "--spec", json.dumps(spec), "--out", str(tmp_path / "cell")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, _message(proc.stderr[-3000:])
    rec = record.read(tmp_path / "cell/record.json")
    assert rec["status"] == "ok", _message(rec["reason"])
    _assert_allocator_view(rec, 1, resident=(1024 + 256) * (28 * 28 + 8) / 2**20)
