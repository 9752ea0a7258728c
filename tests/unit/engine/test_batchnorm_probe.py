"""No forward outside the measured steps touches the model (issue 23 §4): a model whose BatchNorm
sees 1x1 feature maps fails on any training-mode forward of a single sample ("Expected more than 1
value per channel when training"), as torchvision's mobilenet_v3_small does at 32x32. Every mode
trains it, probes it and measures its memory with full batches only."""

import textwrap

import pytest
from helpers.engine import train

from dpstudy.data import store as data
from dpstudy.record import fields as record

FACTORY = textwrap.dedent(
    """
    from torch import nn


    def pooled_bn(num_classes, in_channels, image_size):
        # After the pooling every feature map is 1x1: BatchNorm in training mode needs two samples.
        return nn.Sequential(
            nn.Conv2d(in_channels, 8, 3, padding=1),
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(8, 8, 1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8, num_classes),
        )
    """
)
MODES = {
    "single": ({}, None),
    "ddp": ({"mode": "ddp", "gpus": 2, "backend": "gloo"}, 2),
    "fsdp": ({"mode": "fsdp", "gpus": 2, "backend": "gloo"}, 2),
}


@pytest.fixture(scope="module")
def pooled_bn_cell(tmp_path_factory):
    root = tmp_path_factory.mktemp("pooled_bn")
    (root / "code").mkdir()
    (root / "code" / "bn_models.py").write_text(FACTORY)
    data.prepare("synthetic", root / "data", {"train_size": 256, "test_size": 64})

    def spec(**settings) -> dict:
        return {
            "dataset": "synthetic",
            "model": "bn_models:pooled_bn",
            "code_path": str(root / "code"),
            "mode": "single",
            "batch": 32,
            "epochs": 1,
            "warmup_steps": 2,
            "data_root": str(root / "data"),
            **settings,
        }

    return root, spec


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_batchnorm_model_at_1x1_feature_maps_trains_and_probes_in_every_mode(pooled_bn_cell, mode):
    root, spec = pooled_bn_cell
    settings, nproc = MODES[mode]
    proc = train(spec(**settings), root / mode, nproc=nproc, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = record.read(root / mode / "record.json")
    assert rec["status"] == "ok", rec["reason"]
    assert rec["epochs"][0]["samples"] == 256
    if nproc:  # the multi-rank probe ran on full batches; fsdp's replica has the data's 10 classes
        assert rec["probe"]["steps"] >= 2 and rec["probe"]["sync_step_s"] > 0 and rec["probe"]["nosync_step_s"] > 0
        assert rec["probe"]["grad_bytes"] == 4 * (3 * 3 * 1 * 8 + 8 + 8 * 8 + 8 + 8 + 8 + 8 * 10 + 10)
        # FSDP's units (measured by FSDP, planned by DDP for a forecast): the two convolutions,
        # the linear layer, and the root with the BatchNorm; DDP sends the 0.9 KB as one bucket
        assert rec["probe"]["units"] == 4
        # the step with and without its communication took turns in 4 rounds
        assert rec["probe"]["rounds"] == 4 and rec["probe"]["exposed_spread_s"] >= 0
        assert rec["probe"].get("buckets") == (1 if mode == "ddp" else None)
    assert all(v > 0 for v in rec["memory"]["peak_mb"])
