import pytest
import torch

from dpstudy.data.task import IMAGE, Task
from dpstudy.models import MODELS, build, cost
from dpstudy.util.errors import ConfigError

SHAPES = {"gray28": (1, 28), "rgb32": (3, 32), "stl96": (3, 96)}
PLAIN = [name for name, info in MODELS.items() if not info.needs_ext and info.task == IMAGE]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", PLAIN)
def test_forward_and_backward_on_every_dataset_shape(name, shape):
    channels, size = SHAPES[shape]
    torch.manual_seed(0)
    model = build(name, Task.image(channels, size, 10))
    x = torch.randn(2, channels, size, size)
    out = model(x)
    assert out.shape == (2, 10)
    out.logsumexp(1).sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_lenet_matches_the_source_on_cifar():
    # Source 000: on 32x32x3 the flattened features are 1024 wide.
    model = build("lenet", Task.image(3, 32, 10))
    assert model.classifier[0].in_features == 1024


def test_stats_count_parameters_and_flops():
    s = cost("lenet", Task.image(1, 28, 10))
    assert s["params"] == sum(p.numel() for p in build("lenet", Task.image(1, 28, 10)).parameters())
    # The first conv alone: 28*28 outputs x 6 channels x 9 MACs = 42336 MACs forward.
    assert s["train_flops_per_sample"] > 3 * 2 * 42336
    assert cost("vgg19", Task.image(3, 32, 10))["train_flops_per_sample"] > 100 * s["train_flops_per_sample"]


def test_unknown_model_is_an_error():
    with pytest.raises(ConfigError, match=r"model 'gpt9' is not one of \['gpt', 'lenet', "):
        build("gpt9", Task.image(1, 28, 10))


def test_resnet18s_width_scales_every_stage_and_is_checked_before_any_job():
    from dpstudy.models import check_args

    full, narrow = cost("resnet18", Task.image(3, 32, 10)), cost("resnet18", Task.image(3, 32, 10), {"width": 8})
    model = build("resnet18", Task.image(3, 32, 10), {"width": 8})
    assert [m.out_channels for m in model.modules() if isinstance(m, torch.nn.Conv2d)][:1] == [8]
    assert model.head[-1].in_features == 64  # the last stage: 8 times the first
    # convolutions' FLOPs go with the square of the width: 64 times fewer at 1/8 of it
    assert 50 < full["train_flops_per_sample"] / narrow["train_flops_per_sample"] < 70
    assert build("resnet18", Task.image(3, 32, 10)).head[-1].in_features == 512  # ResNet-18's own
    for bad in (0, 2.5, True, "8"):
        with pytest.raises(ConfigError, match=rf"model 'resnet18': model_args width {bad!r} is not a positive integer"):
            check_args("resnet18", {"width": bad})
