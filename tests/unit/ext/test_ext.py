"""dpstudy's C++/CUDA operators against PyTorch: values, gradients, opcheck, torch.compile,
bad inputs, the lenet_ext model, and the build."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import REPO
from torch.library import opcheck

import dpstudy.ext
from dpstudy.ext import builder, reference

EXT_TEST_DIR = REPO / "results" / "ext-test"
CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")])]


@pytest.fixture(autouse=True)
def no_tf32():
    # cuDNN's F.conv2d may use TF32 on Ampere and later (PyTorch's default), which is not the
    # float32 the extension computes: the comparisons below want both in full float32.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        matmul = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = matmul


@pytest.fixture(scope="session")
def ops(ext_test_dir):
    # The session's one build (tests/conftest.py), CPU-only unless a GPU can run the CUDA kernels.
    assert ext_test_dir == EXT_TEST_DIR
    return dpstudy.ext.load(ext_test_dir)


# --- rgb_to_grayscale ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_grayscale_rounding_rule_on_every_rgb_triple(ops, device):
    # On CUDA a plane of 4096 x 4096 takes the 16-pixel vector kernel.
    v = torch.arange(1 << 24, dtype=torch.int32)
    images = torch.stack([v >> 16, (v >> 8) & 255, v & 255]).to(torch.uint8).view(3, 4096, 4096).to(device)
    assert torch.equal(ops.rgb_to_grayscale(images), reference.rgb_to_grayscale(images))


@pytest.mark.parametrize(
    "rgb, gray",
    [
        ((255, 255, 255), 255),
        ((1, 0, 0), 0),
        ((2, 0, 0), 1),
        ((0, 0, 250), 29),  # 28.5 exactly: half rounds up
        ((10, 20, 30), 18),
    ],
)  # 2.99 + 11.74 + 3.42 = 18.15
def test_grayscale_values_by_hand(ops, rgb, gray):
    image = torch.tensor(rgb, dtype=torch.uint8).view(3, 1, 1)
    assert ops.rgb_to_grayscale(image).item() == gray


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 3, 1, 1), (4, 3, 17, 9), (2, 3, 128, 130)])
def test_grayscale_matches_reference(ops, device, shape):
    images = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    out = ops.rgb_to_grayscale(images)
    assert out.shape == (*shape[:-3], 1, *shape[-2:]) and out.dtype == torch.uint8
    assert torch.equal(out, reference.rgb_to_grayscale(images))


def test_grayscale_accepts_non_contiguous_input(ops):
    images = torch.randint(0, 256, (2, 3, 8, 10), dtype=torch.uint8)
    for view in (images.contiguous(memory_format=torch.channels_last), images[..., ::2]):
        assert torch.equal(ops.rgb_to_grayscale(view), reference.rgb_to_grayscale(view))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0, 1, 16])
def test_grayscale_at_any_alignment(ops, device, offset):
    # Planes of 32 x 32 pixels allow 16-byte vectors; an input starting 1 byte into its storage
    # does not, and must take the per-pixel kernel with the same result.
    storage = torch.randint(0, 256, (offset + 2 * 3 * 32 * 32,), dtype=torch.uint8, device=device)
    images = storage[offset:].view(2, 3, 32, 32)
    assert torch.equal(ops.rgb_to_grayscale(images), reference.rgb_to_grayscale(images))


# --- conv2d -------------------------------------------------------------------------------------

# (N, C, H, W, O, kH, kW, stride, padding, bias): batch 1, 1/3/7 channels, non-square, pad 0-2, stride 1-3
CONV_CASES = [
    (1, 1, 5, 5, 1, 3, 3, 1, 0, True),
    (2, 3, 9, 7, 4, 3, 3, 1, 1, True),
    (3, 7, 10, 13, 5, 3, 2, (2, 1), (2, 0), False),
    (1, 3, 11, 6, 2, 5, 3, 3, 2, True),
    (2, 1, 4, 4, 3, 1, 1, 2, 0, False),
]


def _conv_args(case, dtype=torch.float32, device="cpu", requires_grad=False):
    n, c, h, w, o, kh, kw, stride, padding, bias = case
    # seeded: the same inputs whatever ran before in this worker (a sum of 42 float32 products
    # differs from PyTorch's in its last bits, beyond assert_close's tolerance for a few draws)
    generator = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))

    def make(*s):
        return torch.randn(s, dtype=dtype, generator=generator).to(device).requires_grad_(requires_grad)

    return make(n, c, h, w), make(o, c, kh, kw), make(o) if bias else None, stride, padding


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_forward_and_backward_match_pytorch(ops, case, device):
    x, w, b, stride, padding = _conv_args(case, device=device, requires_grad=True)
    ours = ops.conv2d(x, w, b, stride, padding)
    theirs = F.conv2d(x, w, b, stride, padding)
    torch.testing.assert_close(ours, theirs)
    grad = torch.randn_like(ours)
    leaves = [t for t in (x, w, b) if t is not None]
    for g_ours, g_theirs in zip(torch.autograd.grad(ours, leaves, grad), torch.autograd.grad(theirs, leaves, grad)):
        torch.testing.assert_close(g_ours, g_theirs)


# Small: gradcheck perturbs every element of every input.
@pytest.mark.parametrize("case", [(1, 2, 5, 4, 2, 3, 2, (2, 1), (1, 0), True), (2, 1, 4, 5, 2, 2, 3, 3, 2, False)])
def test_conv2d_gradcheck_float64(ops, case):
    x, w, b, stride, padding = _conv_args(case, torch.float64, requires_grad=True)
    inputs = (x, w, b) if b is not None else (x, w)
    assert torch.autograd.gradcheck(lambda *t: ops.conv2d(*t, stride=stride, padding=padding), inputs)


def test_conv2d_accepts_non_contiguous_input(ops):
    x, w, b, stride, padding = _conv_args(CONV_CASES[1])
    x = x.contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(
        ops.conv2d(x, w.transpose(2, 3).transpose(2, 3), b, stride, padding), F.conv2d(x, w, b, stride, padding)
    )


# --- max_pool2d ---------------------------------------------------------------------------------

# (shape, kernel, stride): non-square, batch 1, overlapping windows (stride < kernel), leftovers
POOL_CASES = [
    ((1, 1, 4, 4), 2, None),
    ((2, 3, 7, 9), 2, None),
    ((2, 7, 9, 8), 3, 2),
    ((1, 3, 6, 11), (2, 3), (1, 2)),
    ((3, 2, 5, 5), 1, 3),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, kernel, stride", POOL_CASES)
def test_max_pool2d_matches_pytorch(ops, device, shape, kernel, stride):
    x = torch.randn(shape, device=device, requires_grad=True)
    ours = ops.max_pool2d(x, kernel, stride)
    theirs, indices = F.max_pool2d(x, kernel, stride, return_indices=True)
    torch.testing.assert_close(ours, theirs)
    _, our_indices = torch.ops.dpstudy.max_pool2d(x, list(F._pair(kernel)), list(F._pair(stride or kernel)))
    assert torch.equal(our_indices, indices)
    grad = torch.randn_like(ours)
    torch.testing.assert_close(torch.autograd.grad(ours, x, grad), torch.autograd.grad(theirs, x, grad))


@pytest.mark.parametrize("shape, kernel, stride", [((1, 2, 5, 4), 2, None), ((2, 1, 5, 7), 3, 2)])
def test_max_pool2d_gradcheck_float64(ops, shape, kernel, stride):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.max_pool2d(t, kernel, stride), (x,))


# --- opcheck and torch.compile ------------------------------------------------------------------


def _opcheck_cases() -> dict:
    """Operator and arguments for each case; built lazily, the operators exist only after the build."""

    def conv(case, dtype):
        return _conv_args(case, dtype, requires_grad=True)

    def pair(v):
        return list(F._pair(v))

    def conv2d(case, dtype):
        x, w, b, stride, padding = conv(case, dtype)
        return "conv2d", (x, w, b, pair(stride), pair(padding))

    def conv2d_backward():
        x, w, _, stride, padding = _conv_args(CONV_CASES[2])
        grad = torch.randn_like(F.conv2d(x, w, None, stride, padding))
        return "conv2d_backward", (grad, x, w, pair(stride), pair(padding))

    def max_pool2d_backward():
        out, indices = torch.ops.dpstudy.max_pool2d(torch.randn(2, 3, 7, 9), [3, 2], [2, 2])
        return "max_pool2d_backward", (torch.randn_like(out), indices, [7, 9])

    return {
        "rgb_to_grayscale": lambda: ("rgb_to_grayscale", (torch.randint(0, 256, (2, 3, 5, 6), dtype=torch.uint8),)),
        "conv2d_float32": lambda: conv2d(CONV_CASES[2], torch.float32),
        "conv2d_float64": lambda: conv2d(CONV_CASES[1], torch.float64),
        "conv2d_backward": conv2d_backward,
        "max_pool2d": lambda: ("max_pool2d", (torch.randn(2, 3, 7, 9, requires_grad=True), [3, 2], [2, 2])),
        "max_pool2d_backward": max_pool2d_backward,
    }


@pytest.mark.parametrize("case", _opcheck_cases())
def test_opcheck(ops, case):
    op, args = _opcheck_cases()[case]()
    opcheck(getattr(torch.ops.dpstudy, op).default, args)


def test_torch_compile_traces_forward_and_backward(ops):
    def f(x, w, b):
        return ops.max_pool2d(F.relu(ops.conv2d(x, w, b, padding=1)), 2).sum()

    x, w, b, _, _ = _conv_args(CONV_CASES[1], requires_grad=True)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    eager_grads = torch.autograd.grad(f(x, w, b), (x, w, b))
    torch.testing.assert_close(torch.autograd.grad(compiled(x, w, b), (x, w, b)), eager_grads)


# --- bad inputs: clear errors that name the argument --------------------------------------------


def _u8(*shape):
    return torch.zeros(shape, dtype=torch.uint8)


BAD_CALLS = {
    "images dtype": (lambda o: o.rgb_to_grayscale(torch.zeros(3, 4, 4)), "'images' must be uint8"),
    "images channels": (lambda o: o.rgb_to_grayscale(_u8(2, 4, 4, 4)), "'images' must have 3 channels"),
    "images dims": (lambda o: o.rgb_to_grayscale(_u8(3, 4)), "'images' must be \\[3, H, W\\]"),
    "input dtype": (
        lambda o: o.conv2d(torch.zeros(1, 3, 5, 5, dtype=torch.int32), torch.zeros(2, 3, 3, 3)),
        "'input' must be float32 or float64",
    ),
    "input dims": (lambda o: o.conv2d(torch.zeros(3, 5, 5), torch.zeros(2, 3, 3, 3)), "'input' must be a 4-D"),
    "weight channels": (
        lambda o: o.conv2d(torch.zeros(1, 3, 5, 5), torch.zeros(2, 4, 3, 3)),
        "'weight' expects 4 input channels but 'input' has 3",
    ),
    "weight dtype": (
        lambda o: o.conv2d(torch.zeros(1, 3, 5, 5), torch.zeros(2, 3, 3, 3, dtype=torch.float64)),
        "'weight' has dtype Double but 'input' has Float",
    ),
    "weight device": (
        lambda o: o.conv2d(torch.zeros(1, 3, 5, 5), torch.zeros(2, 3, 3, 3, device="meta")),
        "'weight' is on meta but 'input' is on cpu",
    ),
    "weight size": (lambda o: o.conv2d(torch.zeros(1, 3, 2, 2), torch.zeros(2, 3, 3, 3)), "'weight' kernel 3x3"),
    "bias size": (
        lambda o: o.conv2d(torch.zeros(1, 3, 5, 5), torch.zeros(2, 3, 3, 3), torch.zeros(3)),
        "'bias' has 3 values",
    ),
    "stride": (lambda o: o.conv2d(torch.zeros(1, 3, 5, 5), torch.zeros(2, 3, 3, 3), stride=0), "'stride' must be >= 1"),
    "padding": (
        lambda o: o.conv2d(torch.zeros(1, 3, 5, 5), torch.zeros(2, 3, 3, 3), padding=-1),
        "'padding' must be >= 0",
    ),
    "pool dims": (lambda o: o.max_pool2d(torch.zeros(3, 4, 4), 2), "'input' must be a 4-D"),
    "pool kernel": (lambda o: o.max_pool2d(torch.zeros(1, 1, 4, 4), 5), "'kernel_size' \\[5, 5\\] is larger"),
    "pool indices": (
        lambda o: torch.ops.dpstudy.max_pool2d_backward(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), [4, 4]),
        "'indices' must be int64",
    ),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_input_is_an_error_naming_the_argument(ops, name):
    call, match = BAD_CALLS[name]
    with pytest.raises(RuntimeError, match=match):
        call(ops)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_tensors_on_different_devices_are_an_error(ops):
    with pytest.raises(RuntimeError, match="'weight' is on cpu but 'input' is on cuda"):
        ops.conv2d(torch.zeros(1, 3, 5, 5, device="cuda"), torch.zeros(2, 3, 3, 3))


# --- the lenet_ext model ------------------------------------------------------------------------


def test_lenet_ext_trains_like_lenet(ops):
    from dpstudy.models.lenet import LeNet
    from dpstudy.models.lenet_ext import LeNetExt

    torch.manual_seed(0)
    ext = LeNetExt(3, 32)
    plain = LeNet(3, 32)
    assert ext.state_dict().keys() == plain.state_dict().keys()
    plain.load_state_dict(ext.state_dict())
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))  # one batch: the loss must fall
    losses = []
    for model in (ext, plain):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        run = []
        for _ in range(20):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), rtol=1e-4, atol=1e-5)
    assert losses[0][-1] < losses[0][0]


def test_under_autocast_the_float_ops_run_in_float32(ops):
    # bf16 autocast: conv2d's internal matmul must not come back in bf16 (max_pool2d refuses it),
    # the ops compute what they compute in float32, float64 stays float64, gradients flow back.
    torch.manual_seed(0)
    x = torch.randn(4, 3, 12, 12, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ops.conv2d(x, w, None, 1, 1)
        pooled = ops.max_pool2d(y.relu(), 2)
        logits = F.linear(pooled.flatten(1), torch.randn(2, 5 * 6 * 6))  # PyTorch's own op: bf16
        double = ops.conv2d(x.detach().double(), w.detach().double(), None, 1, 1)
    assert (y.dtype, pooled.dtype, logits.dtype, double.dtype) == (
        torch.float32,
        torch.float32,
        torch.bfloat16,
        torch.float64,
    )
    torch.testing.assert_close(pooled, ops.max_pool2d(ops.conv2d(x, w, None, 1, 1).relu(), 2))
    logits.float().sum().backward()
    assert x.grad.dtype == w.grad.dtype == torch.float32 and x.grad.abs().sum() > 0


def test_lenet_ext_trains_under_autocast(ops):
    from dpstudy.models.lenet_ext import LeNetExt

    torch.manual_seed(0)
    model = LeNetExt(1, 28)
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(30):  # one batch, remembered: the loss must fall well below chance (2.3)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(math.isfinite, losses)) and losses[-1] < 0.5 * losses[0]


# --- the build ----------------------------------------------------------------------------------


def test_build_json_describes_the_build(ops):
    info = json.loads((EXT_TEST_DIR / "build.json").read_text())
    assert Path(info["so"]) == EXT_TEST_DIR / "dpstudy_ext.so" and Path(info["so"]).exists()
    assert info["ops"] == list(builder.OPS)
    assert info["sources_sha256"] == builder.sources_sha256()
    assert info["torch"] == torch.__version__
    assert info["with_cuda"] == CUDA and (info["note"] is None) == CUDA
    # An up-to-date build is reused, not recompiled.
    assert dpstudy.ext.build(EXT_TEST_DIR, cpu_only=not CUDA) == info


def test_cpu_only_env_and_cuda_arch_argument(monkeypatch):
    monkeypatch.setenv("DPSTUDY_EXT_CPU_ONLY", "1")
    plan = builder.cuda_plan(None, None)
    assert not plan["with_cuda"] and "DPSTUDY_EXT_CPU_ONLY" in plan["note"]
    monkeypatch.delenv("DPSTUDY_EXT_CPU_ONLY")
    if torch.version.cuda and builder.cuda_home():
        plan = builder.cuda_plan(None, "8.6;9.0")
        assert plan["with_cuda"] and plan["cuda_arch"] == ["8.6", "9.0"] and plan["cuda_arch_source"] == "argument"


@pytest.mark.slow
def test_lenet_ext_trains_under_ddp_through_the_entry_point(ops, tmp_path, synthetic_root):
    """lenet_ext in a real torchrun job over Gloo, loading the built extension in every rank."""
    from helpers.engine import train

    from dpstudy.record import fields as record

    spec = {
        "dataset": "synthetic",
        "model": "lenet_ext",
        "mode": "ddp",
        "gpus": 2,
        "backend": "gloo",
        "epochs": 2,
        "data_root": str(synthetic_root),
    }
    proc = train(spec, tmp_path / "out", nproc=2, env={"DPSTUDY_EXT_DIR": str(EXT_TEST_DIR)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = record.read(tmp_path / "out/record.json")
    assert rec["status"] == "ok" and rec["env"]["world_size"] == 2
    assert rec["epochs"][1]["train_loss"] < rec["epochs"][0]["train_loss"]
