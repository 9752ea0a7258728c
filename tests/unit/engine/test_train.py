"""The training entry point end to end: real processes, real torchrun, Gloo on CPU."""

import gzip
import json
import math
import os
import re
import time

import pytest
from helpers import left_in_tmpdir
from helpers.engine import PINNED, finish, start_launch, train

from dpstudy import models
from dpstudy.analysis.tables import rank_allocators
from dpstudy.data import store as data
from dpstudy.data.task import Task
from dpstudy.engine import trace_figures, tracing
from dpstudy.jobs.cell_command import TORCHRUN_LOGS
from dpstudy.record import fields as record
from dpstudy.util import allocator


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    data.prepare("synthetic", root, {"train_size": 4000, "test_size": 1000})
    return root


def torch_sees_gpus() -> bool:
    import torch

    return torch.cuda.is_available()


def spec_for(data_root, **settings):
    return {
        "dataset": "synthetic",
        "model": "lenet",
        "mode": "single",
        "batch": 64,
        "epochs": 2,
        "data_root": str(data_root),
        **settings,
    }


def test_single_cell_writes_a_complete_record(data_root, tmp_path):
    proc = train(spec_for(data_root), tmp_path, env=PINNED)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "record.json")
    assert rec["status"] == "ok" and rec["reason"] is None
    assert rec["cell"] == "synthetic-lenet-single-g1-b64-none"
    assert rec["spec"]["epochs"] == 2 and rec["spec"]["optimizer"] == "sgd"  # defaults filled in
    assert rec["env"]["world_size"] == 1 and rec["env"]["device"] == "cpu"
    assert len(rec["env"]["code_version"]["source_hash"]) == 12
    first, last = rec["epochs"]
    assert first["samples"] == last["samples"] == 4000
    assert last["train_loss"] < first["train_loss"]
    assert last["wall_s"] == pytest.approx(last["data_wait_s"] + last["compute_s"])
    assert last["samples_per_s"] == pytest.approx(4000 / last["wall_s"])
    assert len(last["peak_mem_mb"]) == 1 and last["peak_mem_mb"][0] > 50
    summary = rec["summary"]
    assert summary["median_epoch_s"] == last["wall_s"]  # epoch 1 is warm-up
    # The steady window: every step after the first warmup_steps (10 x 64 samples), in any epoch.
    assert rec["spec"]["warmup_steps"] == 10
    assert first["steady_samples"] == 4000 - 10 * 64 and 0 < first["steady_s"] < first["wall_s"]
    assert last["steady_samples"] == 4000 and last["steady_s"] == pytest.approx(last["wall_s"])
    assert summary["samples_per_s"] == pytest.approx((3360 + 4000) / (first["steady_s"] + last["steady_s"]))
    assert all(0 <= e["other_load"] <= os.cpu_count() for e in rec["epochs"])
    # pinned to the cores it was given (--cores 2: two threads), within what it may use
    allowed = sorted(os.sched_getaffinity(0))
    assert rec["env"]["ranks"][0]["cores"] == (allowed[:2] if len(allowed) >= 2 else [])
    assert 0 < summary["startup_s"] < summary["total_s"]
    assert summary["final_test_acc"] == last["test_acc"]
    assert summary["learned"] is True and summary["learned_reason"] is None
    assert proc.stdout.count("epoch ") == 2 and "test_acc" in proc.stdout
    assert not list(tmp_path.glob(".*tmp"))


def test_a_trace_that_cannot_be_written_leaves_the_record_and_says_why(data_root, tmp_path):
    # one device traces when asked; its trace file's folder cannot be made (a file holds its name)
    (tmp_path / tracing.FOLDER).write_text("in the way")
    proc = train(spec_for(data_root, epochs=1, trace_steps=2), tmp_path)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "record.json")
    assert rec["status"] == "ok" and rec["epochs"][0]["samples"] == 4000 and rec["summary"]["samples_per_s"] > 0
    trace = rec["trace"]
    assert trace["steps"] == 2 and trace["compute_s"] > 0 and trace["comm_s"] == 0 and trace["overlap"] is None
    (rank,) = trace["ranks"]
    assert rank["file"] is None and trace["reason"].startswith("rank 0: the trace was not written: "), trace["reason"]
    assert "Kineto" not in proc.stderr and "gpuGetDeviceCount" not in proc.stderr  # the profiler's noise, silenced


def test_a_run_at_lr_80_is_ok_but_did_not_learn(data_root, tmp_path):
    # The cell: it runs to the end (its throughput is a measurement) and says it learned nothing.
    proc = train(spec_for(data_root, lr=80.0, epochs=2), tmp_path)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "record.json")
    assert rec["status"] == "ok" and rec["summary"]["learned"] is False
    assert re.fullmatch(
        r"training loss became nan in epoch 1|training loss rose from .*|"
        r"final test accuracy \d+\.\d % is chance for 10 classes \(at most 12\.8 % on 1,000 test images\)",
        rec["summary"]["learned_reason"],
    ), rec["summary"]["learned_reason"]


def test_a_diverging_run_stops_after_the_epoch_its_loss_went_non_finite(data_root, tmp_path):
    # stop_on_divergence (default): the loss is nan after epoch 1, so epochs 2 and 3 are not run.
    proc = train(spec_for(data_root, lr=1e8, epochs=3), tmp_path)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "record.json")
    summary = rec["summary"]
    assert rec["status"] == "ok" and summary["learned"] is False
    assert summary["learned_reason"] == "training loss became nan in epoch 1"
    assert [e["epoch"] for e in rec["epochs"]] == [1] and summary["samples_per_s"] > 0
    assert summary["stopped_early"] == (
        "training loss became nan in epoch 1: the remaining 2 of 3 epochs were not run (stop_on_divergence)"
    )
    assert "[dpstudy] training loss became nan in epoch 1" in proc.stdout


def test_same_seed_gives_identical_losses(synthetic_root, tmp_path):
    losses = []
    for run in ("a", "b"):
        assert train(spec_for(synthetic_root, epochs=1), tmp_path / run).returncode == 0
        e = record.read(tmp_path / run / "record.json")["epochs"][0]
        losses.append((e["train_loss"], e["test_loss"]))
    assert losses[0] == losses[1]
    assert train(spec_for(synthetic_root, epochs=1, seed=1), tmp_path / "c").returncode == 0
    assert record.read(tmp_path / "c" / "record.json")["epochs"][0]["train_loss"] != losses[0][0]


# lr 0.02: the default 0.05 moves LeNet's test accuracy here by 2 points from one epoch to the
# next, more than the 1 point of parity the comparison is about.
PARITY = {"epochs": 5, "lr": 0.02}
# DeepSpeed's ZeRO stages beside DDP at the same global batch and seed, a reduce bucket of 100,000
# elements (DeepSpeed's default, 500 million, would be every stage's memory peak) and ZeRO-3
# partitioning every parameter (by default LeNet's, all under 100,000 elements, stay whole); and
# bf16 through DeepSpeed's config for the two ZeRO optimizers (stages 1-2 share one), one epoch each
ZERO_BASE = {"mode": "deepspeed", "gpus": 2, "backend": "gloo", "reduce_bucket_size": 100_000}
ZERO = {
    "zero1": {**ZERO_BASE, "shard": "zero1"},
    "zero2": {**ZERO_BASE, "shard": "zero2"},
    "zero3": {**ZERO_BASE, "shard": "zero3", "stage3_param_persistence_threshold": 0},
    "zero1_bf16": {**ZERO_BASE, "shard": "zero1", "precision": "bf16", "epochs": 1},
    "zero3_bf16": {
        **ZERO_BASE,
        "shard": "zero3",
        "stage3_param_persistence_threshold": 0,
        "precision": "bf16",
        "epochs": 1,
    },
}


class ParityRuns(dict):
    """{mode: record}; of the launched jobs, `launched`: {mode: (started, its record written)} and
    `left`: {mode: what the job left in its TMPDIR (helpers.left_in_tmpdir), and torchrun's logs if
    its cell's folder kept them}."""

    def __init__(self, records: dict, launched: dict, left: dict, folder):
        super().__init__(records)
        self.launched, self.left, self.folder = launched, left, folder  # folder / mode: a cell's


@pytest.fixture(scope="module")
def parity_runs(data_root, tmp_path_factory):
    """{mode: record} of the same cell on one device and on two ranks with DDP and FSDP (full, and
    grad_op for one epoch), all at global batch 64 over Gloo. DDP and FSDP run as the workflow's
    jobs do, through the launcher, started at the same moment (two jobs of one study on one
    machine, each with its own torchrun --standalone): DDP with the allocator auto picks, FSDP with
    tuned glibc. The two jobs' start and end, in epoch seconds: ParityRuns.launched."""
    out = tmp_path_factory.mktemp("parity")
    allocators = {"ddp": "auto", "fsdp": "glibc"}
    temp = {name: out / f"{name}-tmp" for name in allocators}  # each job's TMPDIR: what is left there
    for folder in temp.values():
        folder.mkdir()
    launched = {
        name: start_launch(
            spec_for(data_root, **PARITY, mode=name, gpus=2, backend="gloo"),
            out / name,
            allocator=how,
            env={"TMPDIR": str(temp[name]), **PINNED},  # as a study pins them: the ranks' cores are checked
        )
        for name, how in allocators.items()
    }
    records, spans = {}, {}
    alone = {
        "single": ({}, None),
        "fsdp_grad_op": ({"mode": "fsdp", "gpus": 2, "backend": "gloo", "shard": "grad_op", "epochs": 1}, 2),
        **{name: (settings, 2) for name, settings in ZERO.items()},
    }
    for name, (settings, nproc) in alone.items():
        proc = train(spec_for(data_root, **{**PARITY, **settings}), out / name, nproc=nproc, env=PINNED)
        assert proc.returncode == 0, proc.stderr
        records[name] = record.read(out / name / "record.json")
    for name, started in launched.items():
        proc = finish(started)
        chosen = allocator.resolve(allocators[name]).describe()
        assert proc.returncode == 0 and f"allocator: {chosen}" in proc.log, proc.log
        assert f"torchrun --log-dir={out / name / TORCHRUN_LOGS} --standalone --nproc-per-node=2 " in proc.log, proc.log
        records[name] = record.read(out / name / "record.json")
        spans[name] = (proc.started, (out / name / "record.json").stat().st_mtime)
    left = {name: left_in_tmpdir(temp[name]) for name in temp}
    for name in temp:  # and torchrun's logs in the cell's folder, once the job ended
        left[name] += [TORCHRUN_LOGS] if (out / name / TORCHRUN_LOGS).exists() else []
    return ParityRuns(records, launched=spans, left=left, folder=out)


@pytest.mark.slow
def test_the_launcher_gives_every_rank_the_studys_allocator(parity_runs):
    chosen = allocator.resolve("auto")  # jemalloc where libjemalloc2 is installed (make test installs it)
    ddp, fsdp = parity_runs["ddp"]["env"]["ranks"], parity_runs["fsdp"]["env"]["ranks"]
    assert len(ddp) == len(fsdp) == 2
    for rank in ddp:
        assert rank["allocator"]["name"] == chosen.name and rank["allocator"]["library"] == chosen.library
        assert {**rank["allocator"]["variables"], **chosen.variables} == rank["allocator"]["variables"]
    for rank in fsdp:
        assert rank["allocator"] == {"name": "glibc", "library": None, "variables": allocator.GLIBC_KEEP}
    # and the cells table says so, per cell
    assert rank_allocators(parity_runs["ddp"]["env"]) == (
        f"{chosen.name} ({chosen.library})" if chosen.library else "glibc"
    )
    assert rank_allocators(parity_runs["fsdp"]["env"]) == "glibc"


@pytest.mark.slow
def test_every_multi_device_cell_traces_its_steps_on_every_rank_and_keeps_the_traces(parity_runs):
    assert parity_runs["single"]["trace"] is None  # one device: none unless trace_steps asks
    expected = {
        "ddp": {"all_reduce"},
        "fsdp": {"all_gather", "all_reduce"},
        "fsdp_grad_op": {"all_gather", "all_reduce"},
        # ZeRO-1, 2: the gradients all-reduced, the parameters all-gathered after the step; ZeRO-3's
        # reduce-scatter Gloo runs as an all-reduce
        **dict.fromkeys(ZERO, {"all_gather", "all_reduce"}),
    }
    for name, collectives in expected.items():
        rec = parity_runs[name]
        trace, probe = rec["trace"], rec["probe"]
        assert trace["steps"] == tracing.DEFAULT_STEPS and trace["reason"] is None and len(trace["ranks"]) == 2
        pace = trace["ranks"][trace["pace_rank"]]
        assert pace["compute_s"] == max(r["compute_s"] for r in trace["ranks"]) and trace["step_s"] == pace["step_s"]
        for rank in trace["ranks"]:
            parts = sum(rank[k] for k in trace_figures.PARTS)
            assert parts == pytest.approx(rank["step_s"]) and min(rank[k] for k in trace_figures.PARTS) >= 0
            assert rank["activity"] == "cpu" and rank["compute_s"] > 0 and rank["comm_s"] > 0
            # Gloo runs FSDP's reduce-scatter as an all-reduce; every call's bytes known
            assert set(rank["collectives"]) == collectives, rank["collectives"]
            assert all(c["bytes"] > 0 and c["calls"] >= 1 for c in rank["collectives"].values())
            with gzip.open(parity_runs.folder / name / rank["file"], "rt") as f:  # the kept trace, reduced anew
                assert trace_figures.reduce(json.load(f)["traceEvents"])["step_s"] == pytest.approx(rank["step_s"])
        # the same steps as the probe's synced ones, timed another way: the same length within noise
        assert 0.5 < trace["step_s"] / probe["sync_step_s"] < 2, (trace["step_s"], probe["sync_step_s"])


@pytest.mark.slow
def test_ddp_over_gloo_matches_single_device(parity_runs):
    a, b = parity_runs["single"], parity_runs["ddp"]
    assert b["status"] == "ok" and b["env"]["world_size"] == 2 and b["env"]["threads_per_process"] == 1
    assert b["epochs"][-1]["samples"] == 4000  # both ranks' samples, all-reduced
    assert len(b["epochs"][-1]["peak_mem_mb"]) == 2
    cores = [r["cores"] for r in b["env"]["ranks"]]  # one core each, not shared
    allowed = sorted(os.sched_getaffinity(0))
    assert cores == [[allowed[r]] if r < len(allowed) else [] for r in range(2)]  # a rank beyond the cores pins none
    assert abs(a["summary"]["final_test_acc"] - b["summary"]["final_test_acc"]) < 0.04
    assert b["summary"]["final_test_acc"] > 0.85


@pytest.mark.slow
def test_fsdp_over_gloo_trains_what_ddp_trains(parity_runs):
    single, ddp, fsdp = parity_runs["single"], parity_runs["ddp"], parity_runs["fsdp"]
    assert fsdp["status"] == "ok" and fsdp["cell"] == "synthetic-lenet-fsdp-g2-b64-gloo"
    assert fsdp["spec"]["shard"] == "full" and ddp["spec"]["shard"] == "none"
    assert fsdp["env"]["world_size"] == 2 and len(fsdp["epochs"][-1]["peak_mem_mb"]) == 2
    assert fsdp["epochs"][-1]["samples"] == 4000
    # The same ranks, data and gradient mean as DDP: the same losses, up to the reductions' rounding.
    for ours, theirs in zip(fsdp["epochs"], ddp["epochs"]):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-3)
        assert ours["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-3)
    # the parity: test accuracy within 1 point of DDP's and of one device's
    acc = fsdp["summary"]["final_test_acc"]
    assert abs(acc - ddp["summary"]["final_test_acc"]) <= 0.01
    assert abs(acc - single["summary"]["final_test_acc"]) <= 0.01
    # grad_op keeps the gathered parameters from forward to backward: when, not what, is computed
    # the probe of the step model: LeNet's five layers are the units, the root holds nothing
    probe, params = fsdp["probe"], models.cost("lenet", Task.image(1, 28, 10))["params"]
    assert probe["units"] == 5 and probe["gather_bytes"] == probe["grad_bytes"] == 4 * params
    assert all(probe[k] > 0 for k in ("sync_step_s", "nosync_step_s", "allgather_s", "reduce_scatter_s"))
    grad_op = parity_runs["fsdp_grad_op"]
    assert grad_op["status"] == "ok" and grad_op["cell"] == "synthetic-lenet-fsdp-g2-b64-gloo"
    assert grad_op["epochs"][0]["train_loss"] == pytest.approx(fsdp["epochs"][0]["train_loss"], rel=1e-6)


@pytest.mark.slow
def test_zero_stages_train_what_ddp_trains_on_two_gloo_ranks(parity_runs):
    """DeepSpeed's ZeRO-1, 2 and 3 (deepspeed.initialize with the cell's SGD, no gradient clipping)
    against DDP at the same global batch and seed: the same losses (the same gradient mean), test
    accuracy within half a point (the issue's bar), each stage's collectives counted by its probe."""
    ddp, params = parity_runs["ddp"], models.cost("lenet", Task.image(1, 28, 10))["params"]
    for name in ("zero1", "zero2", "zero3"):
        rec = parity_runs[name]
        assert rec["status"] == "ok", rec["reason"]
        assert rec["cell"] == "synthetic-lenet-deepspeed-g2-b64-gloo" and rec["spec"]["shard"] == name
        assert rec["env"]["world_size"] == 2 and rec["epochs"][-1]["samples"] == 4000
        for ours, theirs in zip(rec["epochs"], ddp["epochs"], strict=True):
            assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-4), name
            assert ours["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-4), name
        assert abs(rec["summary"]["final_test_acc"] - ddp["summary"]["final_test_acc"]) <= 0.005, name
        probe = rec["probe"]
        assert all(probe[k] > 0 for k in ("sync_step_s", "nosync_step_s", "allgather_s")), (name, probe)
        # every gradient reduced once, in fp32, in buckets of 100,000 elements (LeNet's 106,154: 2),
        # and the parameters gathered once a step: after it (ZeRO-1, 2), in forward (ZeRO-3, whose
        # parameters stay gathered to backward)
        assert probe["grad_bytes"] == 4 * params and probe["buckets"] == math.ceil(params / 100_000), (name, probe)
        # the gathered flat buffer: every parameter, padded to the ranks' alignment
        assert probe["gather_bytes"] == pytest.approx(4 * params, rel=1e-3), (name, probe)
        assert probe["gathers"] == 1, (name, probe)
        assert ("reduce_scatter_s" in probe) == (name == "zero3") and ("allreduce_s" in probe) != (name == "zero3")

    # ZeRO-3 holds half the parameters, half of SGD's momentum and, beside it, the fp32 master copy
    # of its half, which DeepSpeed keeps in fp32 training too: parameters and optimizer state 0.75x
    # DDP's on 2 ranks (with Adam's two moments 0.67x, over n ranks (2 + moments) / (n (1 + moments)));
    # ZeRO-1 and 2 keep every parameter
    def state(rec, rank):
        return rec["memory"]["params_mb"][rank] + rec["memory"]["optimizer_mb"][rank]

    for rank in range(2):
        ddp_params = ddp["memory"]["params_mb"][rank]
        assert parity_runs["zero3"]["memory"]["params_mb"][rank] == pytest.approx(ddp_params / 2, rel=0.05)
        assert state(parity_runs["zero3"], rank) == pytest.approx(0.75 * state(ddp, rank), rel=0.05), rank
        for name in ("zero1", "zero2"):
            assert parity_runs[name]["memory"]["params_mb"][rank] == pytest.approx(ddp_params, rel=1e-3), name


@pytest.mark.slow
def test_zero_stages_train_in_bf16_through_deepspeeds_config(parity_runs):
    """bf16 on DeepSpeed's CPU accelerator: the module cast (ZeRO-1's whole parameters half the
    bytes), the fp32 master and momentum kept, the step's peak well below fp32's; it learns in one
    epoch."""
    for name, fp32 in (("zero1_bf16", "zero1"), ("zero3_bf16", "zero3")):
        rec, wide = parity_runs[name], parity_runs[fp32]
        assert rec["status"] == "ok" and rec["spec"]["precision"] == "bf16", rec["reason"]
        # below chance level (ln 10 = 2.30) in its one epoch: it learned something
        assert rec["epochs"][0]["train_loss"] < 2.25 and rec["summary"]["final_test_acc"] > 0.5, rec["epochs"]
        for rank in range(2):
            assert rec["memory"]["optimizer_mb"][rank] == pytest.approx(wide["memory"]["optimizer_mb"][rank], rel=0.05)
            assert rec["memory"]["peak_mb"][rank] < 0.75 * wide["memory"]["peak_mb"][rank], name
    for rank in range(2):
        half = parity_runs["zero1"]["memory"]["params_mb"][rank] / 2
        assert parity_runs["zero1_bf16"]["memory"]["params_mb"][rank] == pytest.approx(half, rel=0.01)


# (settings, the launch: None for python, N for torchrun with N processes, the reason)
UNRUNNABLE = [
    ({"mode": "dp", "gpus": 2}, None, "mode dp needs CUDA"),
    ({"mode": "ddp", "gpus": 2, "backend": "nccl"}, None, "backend nccl needs CUDA"),
    ({"device": "cuda"}, None, "no CUDA device is visible"),
    ({"mode": "ddp", "gpus": 2, "backend": "gloo"}, None, "world size 1 does not match nodes x gpus 2"),
    ({"mode": "ddp", "gpus": 1, "backend": "gloo"}, 2, "world size 2 does not match nodes x gpus 1"),
    ({"mode": "fsdp", "gpus": 2, "backend": "nccl"}, None, "backend nccl needs CUDA"),
    ({"mode": "fsdp", "gpus": 2, "backend": "gloo"}, None, "world size 1 does not match nodes x gpus 2"),
    (
        {"mode": "ddp", "gpus": 1, "nodes": 2, "backend": "gloo"},
        1,
        "nodes 2 needs a launch on 2 nodes (srun torchrun --nnodes=2",
    ),
]


def launch_env(nproc: int | None) -> dict[str, str]:
    """What torchrun --standalone --nproc-per-node=N gives rank 0 (python alone: nothing)."""
    if nproc is None:
        return {}
    return {
        "WORLD_SIZE": str(nproc),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_WORLD_SIZE": "1",
    }


@pytest.mark.skipif(torch_sees_gpus(), reason="on a GPU host dp and nccl cells run")
@pytest.mark.parametrize("settings, nproc, reason", UNRUNNABLE)
def test_the_engine_skips_what_the_hardware_cannot_run(data_root, settings, nproc, reason):
    from dpstudy.engine.modes import Skip, mode_for
    from dpstudy.study.spec import complete

    with pytest.raises(Skip) as skip:
        mode_for(complete(spec_for(data_root, **settings)), env=launch_env(nproc))
    assert reason in str(skip.value)


@pytest.mark.parametrize("settings, nproc, reason", [UNRUNNABLE[0], UNRUNNABLE[4]], ids=["python", "torchrun"])
def test_a_cell_the_hardware_cannot_run_is_a_skipped_record(data_root, tmp_path, settings, nproc, reason):
    # The engine decides (above); launched as a job launches it, the cell ends as a record.
    proc = train(spec_for(data_root, **settings), tmp_path, nproc=nproc)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "record.json")
    assert rec["status"] == "skipped" and reason in rec["reason"]
    assert rec["epochs"] == [] and rec["summary"]["final_test_acc"] is None


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_oom_on_one_rank_stops_every_rank(synthetic_root, tmp_path, mode):
    spec = spec_for(synthetic_root, mode=mode, gpus=2, backend="gloo", epochs=2)
    proc = train(spec, tmp_path, nproc=2, env={"DPSTUDY_INJECT_FAULT": "oom:1:2:3"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "record.json")
    assert rec["status"] == "oom" and rec["reason"].startswith("rank 1: OutOfMemoryError")
    assert len(rec["epochs"]) == 1  # the epoch finished before the fault is kept
    assert proc.seconds < 60  # no rank waited for a collective timeout


def test_unexpected_error_is_a_failed_record_and_nonzero_exit(synthetic_root, tmp_path):
    spec = spec_for(synthetic_root, mode="ddp", gpus=2, backend="gloo", epochs=1)
    proc = train(spec, tmp_path, nproc=2, env={"DPSTUDY_INJECT_FAULT": "error:0:1:2"}, timeout=120)
    assert proc.returncode != 0
    rec = record.read(tmp_path / "record.json")
    assert rec["status"] == "failed" and "rank 0: RuntimeError: injected error" in rec["reason"]


def test_a_record_written_before_the_rank_measured_its_env_has_the_jobs_facts(tmp_path):
    # The engine's fallback env is the launcher's (dpstudy.record.envinfo builds both), not a blank one.
    from dpstudy.engine.outcome import Outcome
    from dpstudy.record.envinfo import fallback_environment
    from dpstudy.study.spec import complete

    spec = complete({"dataset": "synthetic", "model": "lenet", "mode": "ddp", "gpus": 2, "backend": "gloo"})
    Outcome(tmp_path, "c", spec, time.time()).write("failed", "rank 0: RuntimeError: x")
    env = record.read(tmp_path / "record.json")["env"]
    assert set(env) == set(fallback_environment(2, 1)) and (env["world_size"], env["nodes"]) == (2, 1)


def test_bad_spec_is_rejected_before_anything_runs(tmp_path):
    proc = train({"dataset": "synthetic", "model": "lenet", "mode": "single", "colour": 1}, tmp_path)
    assert proc.returncode == 2 and "unknown key 'colour'" in proc.stderr
    assert not (tmp_path / "record.json").exists()


def test_missing_downloadable_dataset_names_the_preparation_step(tmp_path):
    proc = train(
        {"dataset": "mnist", "model": "lenet", "mode": "single", "data_root": str(tmp_path / "d")}, tmp_path / "out"
    )
    assert proc.returncode != 0
    rec = record.read(tmp_path / "out/record.json")
    assert rec["status"] == "failed" and "'mnist' is not prepared" in rec["reason"] and "prepare_data" in rec["reason"]


@pytest.mark.slow
def test_lenet_learns_synthetic_to_90_percent_with_defaults(tmp_path):
    # The bar: default settings, default dataset size, 3 epochs at batch 64.
    proc = train(
        {"dataset": "synthetic", "model": "lenet", "mode": "single", "batch": 64, "data_root": str(tmp_path / "data")},
        tmp_path / "out",
    )
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "out/record.json")
    assert rec["spec"]["epochs"] == 3 and rec["summary"]["final_test_acc"] >= 0.90


@pytest.mark.parametrize(
    "settings",
    [
        {"precision": "bf16", "channels_last": True},
        {"precision": "fp16"},
        {
            "optimizer": "adam",
            "lr": 0.001,
            "loader": "torch",
            "workers": 1,
            "augment": "crop_flip",
            "batch_scope": "per_device",
        },
    ],
)
def test_other_settings_train(data_root, tmp_path, settings):
    proc = train(spec_for(data_root, epochs=1, **settings), tmp_path)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "record.json")
    assert rec["status"] == "ok" and rec["spec"] == {**rec["spec"], **settings}
    assert rec["epochs"][0]["train_loss"] < 2.3  # below chance level: it learned something


@pytest.mark.slow
def test_concurrent_ddp_jobs_do_not_share_a_rendezvous(parity_runs):
    # torchrun --standalone binds its rendezvous store to a port the kernel picks (port 0), so
    # two jobs started at the same moment on one machine cannot collide: the parity runs' DDP and
    # FSDP jobs ran at once (each started before the other wrote its record) and both finished.
    (ddp_started, ddp_ended), (fsdp_started, fsdp_ended) = parity_runs.launched["ddp"], parity_runs.launched["fsdp"]
    assert max(ddp_started, fsdp_started) < min(ddp_ended, fsdp_ended)
    for name in ("ddp", "fsdp"):
        assert parity_runs[name]["status"] == "ok" and parity_runs[name]["env"]["world_size"] == 2
    # and neither left anything in its TMPDIR but Inductor's cache (kept across jobs on purpose):
    # torchrun kept its log folders in the cell's folder, removed at the end (its default, a
    # torchelastic_* folder in TMPDIR, stayed behind after every job)
    assert parity_runs.left == {"ddp": [], "fsdp": []}


# ResNet-18's structure (dpstudy.models.resnet) at 1/8 of its widths and one block a stage: a stem
# with BatchNorm, blocks whose BatchNorm layers (the shortcut's too) sit inside FSDP's block units.
NARROW_RESNET = """
from torch import nn
from dpstudy.models.resnet import Residual


def narrow_resnet(num_classes, in_channels, image_size):
    stem = nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    stages = nn.Sequential(Residual(8, 8, 1), Residual(8, 16, 2), Residual(16, 32, 2))
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))
    return nn.Sequential(stem, stages, head)
"""


@pytest.mark.slow
def test_fsdp_in_bf16_with_batchnorm_and_uneven_test_shards(tmp_path):
    # bf16 through FSDP's policy with BatchNorm kept in fp32, each BatchNorm a unit of its own inside
    # the blocks' units; 129 test images over two ranks at 32 per rank: 3 batches on rank 0, 2 on
    # rank 1, whose forwards must still all-gather. (ResNet-18 itself took 38 CPU-s here, mostly its
    # probe's steps; this one a few.)
    root = tmp_path / "data"
    data.prepare("synthetic", root, {"train_size": 256, "test_size": 129})
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "narrow.py").write_text(NARROW_RESNET)
    settings = {"model": "narrow:narrow_resnet", "code_path": str(tmp_path / "code")}
    settings |= {"mode": "fsdp", "gpus": 2, "backend": "gloo", "precision": "bf16"}
    proc = train(spec_for(root, epochs=1, **settings), tmp_path / "cell", nproc=2, timeout=240)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "cell/record.json")
    assert rec["status"] == "ok", rec["reason"]
    # the units that hold parameters: the stem's convolution, the three blocks and the head's Linear,
    # and the nine BatchNorm layers (the stem's, two a block, and the two shortcuts'); the root none
    assert rec["probe"]["units"] == 5 + 9
    epoch = rec["epochs"][0]
    assert math.isfinite(epoch["train_loss"]) and math.isfinite(epoch["test_loss"])
    correct = epoch["test_acc"] * 129  # every test image counted once, none of the extra forwards
    assert correct == pytest.approx(round(correct), abs=1e-6)


@pytest.mark.slow
def test_memory_split_is_recorded_and_predicted_before_training(parity_runs):
    """Every rank's tracked step against the memory plan's prediction of the same cell
    (dpstudy.workflow.memory_plan: FSDP's on fake tensors, ZeRO's from the plain model's fake step):
    the issues' target is 15 %; FSDP holds 1/n of the parameters."""
    from dpstudy.workflow import memory_plan

    params_mb = models.cost("lenet", Task.image(1, 28, 10))["params"] * 4 / 2**20
    for name, rec in parity_runs.items():
        measured, world = rec["memory"], rec["env"]["world_size"]
        # CPU cells: the tracker's parts and, every rank, how much its resident memory grew over the step
        assert set(measured) == {*record.MEMORY_PARTS, *record.HOST_PARTS}
        assert all(len(v) == world for v in measured.values())
        assert all(0 <= growth < 1024 for growth in measured["rss_growth_mb"]), measured["rss_growth_mb"]
        for rank in range(world):
            parts = sum(measured[p][rank] for p in record.MEMORY_PARTS if p != "peak_mb")
            assert measured["peak_mb"][rank] == pytest.approx(parts)
        predicted = memory_plan.predict(rec["spec"])
        assert len(predicted["peak_mb"]) == world
        for rank in range(world):
            error = abs(predicted["peak_mb"][rank] - measured["peak_mb"][rank]) / measured["peak_mb"][rank]
            assert error <= 0.15, (name, rank, predicted["peak_mb"][rank], measured["peak_mb"][rank])
        # SGD's momentum: one copy of the parameters, of this rank's shard only under FSDP; ZeRO's
        # shard of it and its fp32 master copy of the same shard (bf16 too: both stay fp32)
        assert rec["spec"]["optimizer"] == "sgd" and rec["spec"]["momentum"] > 0
        shares = {"single": 1, "ddp": 1, "fsdp": 1 / 2, "fsdp_grad_op": 1 / 2} | dict.fromkeys(ZERO, 1 / 2 + 1 / 2)
        for rank in range(world):
            assert measured["optimizer_mb"][rank] == pytest.approx(params_mb * shares[name], rel=0.05), name
    single, fsdp = parity_runs["single"]["memory"], parity_runs["fsdp"]["memory"]
    assert fsdp["activations_mb"][0] < single["activations_mb"][0]  # half the batch per rank


@pytest.mark.slow
def test_every_epoch_of_every_mode_gauges_the_machine_outside_its_timed_steps(parity_runs):
    # The in-cell gauge (dpstudy.engine.reference.InCell): after each epoch, every rank's rates
    # averaged; a 256x256 matmul on one core runs at tens of GFLOP/s, a dispatched add at ~1 us,
    # and a CPU copies GB/s: each cell's fastest epoch. Every epoch within 10x of that: a gauge's
    # 50 ms turn on a machine another test worker loads can lose most of its time (0.63 GB/s seen
    # in one epoch), which is what the gauge is there to show, not a fault of its units.
    for name, rec in parity_runs.items():
        for epoch in rec["epochs"]:
            assert 1 < epoch["machine_gflops"] < 1000, (name, epoch)
            assert 0.01 < epoch["machine_mops"] < 100, (name, epoch)
            assert 0.1 < epoch["machine_gbps"] < 500, (name, epoch)  # 32 MiB copies, past the L3
        assert max(epoch["machine_gbps"] for epoch in rec["epochs"]) > 1, name
    # outside the steady window: the single cell's throughput is its training steps' alone
    single = parity_runs["single"]["epochs"][-1]
    assert single["steady_s"] <= single["wall_s"]
