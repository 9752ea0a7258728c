"""shard hybrid (HSDP) and shard full on Gloo ranks against one device: the same global batches
and seed give the same losses step by step; hybrid shards over a replicate x shard mesh; and
checkpointing and bf16 run under it, and checkpointing under DDP (ranks_steps.py, on ranks
torchrun starts)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from helpers import left_in_tmpdir

from dpstudy.jobs import cell_command
from dpstudy.study.spec import complete

HERE = Path(__file__).parent


def load_ranks_steps():
    """ranks_steps.py, the script the ranks run, imported from beside this file."""
    found = importlib.util.spec_from_file_location("ranks_steps", HERE / "ranks_steps.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def spec_of(**settings) -> dict:
    # the model a spec names is ranks_steps' own; lenet only makes the spec valid
    return complete({"dataset": "synthetic", "model": "lenet", "mode": "single", "lr": 0.1, **settings})


def on_ranks(nproc: int, runs: dict, out: Path) -> dict:
    """{name: ranks_steps.run's result} of `runs` ({name: (spec, model)}) on `nproc` ranks."""
    cmd = [*cell_command.torchrun(Path(f"{out}.torchrun")), "--standalone", f"--nproc-per-node={nproc}"]
    cmd += [str(HERE / "ranks_steps.py"), json.dumps(runs), str(out)]
    tmp = Path(f"{out}.tmp")
    tmp.mkdir()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert left_in_tmpdir(tmp) == []  # torchrun's logs went to --log-dir, not a torchelastic_* folder
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("hsdp")
    fsdp = {"mode": "fsdp", "backend": "gloo"}
    hybrid = {**fsdp, "gpus": 4, "shard": "hybrid", "replicate": 2}
    results = {
        "single": load_ranks_steps().run(spec_of(), "mlp", env={}),
        **on_ranks(
            2,
            {
                "full": (spec_of(**fsdp, gpus=2), "mlp"),
                # DDP too checkpoints before it wraps (modes.base.Mode.prepare)
                "ddp_full": (spec_of(mode="ddp", backend="gloo", gpus=2, activation_checkpointing="full"), "mlp"),
            },
            out / "full.json",
        ),
        **on_ranks(
            4,
            {
                "hybrid": (spec_of(**hybrid), "mlp"),
                "hybrid_selective": (spec_of(**hybrid, activation_checkpointing="selective"), "mlp"),
                "hybrid_bf16_full": (
                    spec_of(**hybrid, precision="bf16", activation_checkpointing="full"),
                    "resnet",
                ),
            },
            out / "hybrid.json",
        ),
    }
    return results


def test_hybrid_and_full_sharding_take_the_steps_one_device_takes(runs):
    single = runs["single"]["losses"]
    assert len(single) == 3 and single[0] != single[-1]  # the steps learn: the parameters moved
    for name in ("full", "ddp_full", "hybrid", "hybrid_selective"):
        deltas = [abs(a - b) / abs(b) for a, b in zip(runs[name]["losses"], single, strict=True)]
        assert max(deltas) < 1e-4, (name, runs[name]["losses"], single)


def test_hybrid_shards_inside_each_replica_and_replicates_across(runs):
    # 4 ranks, replicate 2: a (2, 2) mesh, each parameter replicated on dim 0 and sharded on dim 1,
    # so that a rank holds half of it (full over 2 ranks: half too; over 4 it would be a quarter)
    hybrid, full = runs["hybrid"], runs["full"]
    assert hybrid["mesh"] == [2, 2] and hybrid["placements"] == "(Replicate(), Shard(dim=0))"
    assert hybrid["local_share"] == pytest.approx(0.5) and full["local_share"] == pytest.approx(0.5)
    assert full["mesh"] == [2]


def test_hybrid_composes_with_bf16_and_full_checkpointing(runs):
    # FSDP's bf16 policy, BatchNorm as fp32 units of their own inside the checkpointed blocks
    losses = runs["hybrid_bf16_full"]["losses"]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
