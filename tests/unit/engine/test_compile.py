"""compile: true end to end (real processes, like test_train.py): compile time apart from the
steady window, DDP compiled over Gloo, and a cell that cannot compile."""

import pytest
from helpers.engine import train

from dpstudy.data import store as data
from dpstudy.record import fields as record

TRAIN, TEST, BATCH = 500, 128, 64  # 7 full batches and a last one of 52: a recompile


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    data.prepare("synthetic", root, {"train_size": TRAIN, "test_size": TEST})
    return root


def spec_for(data_root, **settings):
    return {
        "dataset": "synthetic",
        "model": "lenet",
        "mode": "single",
        "batch": BATCH,
        "epochs": 2,
        "data_root": str(data_root),
        "compile": True,
        **settings,
    }


def test_a_cell_that_cannot_compile_fails_with_the_compilers_message(data_root, tmp_path):
    # A real failure: Inductor finds no C++ compiler (it reads CXX), with an empty cache so that
    # no compiled graph of an earlier run stands in.
    env = {"CXX": "/nonexistent", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = train(spec_for(data_root, epochs=1), tmp_path / "cell", env=env)
    assert proc.returncode == 1, proc.stderr
    rec = record.read(tmp_path / "cell" / "record.json")
    assert rec["status"] == "failed" and rec["epochs"] == []
    reason = rec["reason"]
    assert reason.startswith("rank 0: CompileFailed: torch.compile failed:"), reason
    assert "No working C++ compiler" in reason and "/nonexistent" in reason, reason
    assert "\n" not in reason and "TORCHDYNAMO_VERBOSE" not in reason


@pytest.mark.slow
def test_compiled_single_cell_keeps_compile_time_out_of_the_throughput(data_root, tmp_path):
    # warmup_steps 2: the recompile for epoch 1's last, smaller batch falls inside the steady window
    proc = train(spec_for(data_root, warmup_steps=2), tmp_path)
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "record.json")
    assert rec["status"] == "ok" and rec["cell"] == "synthetic-lenet-single-g1-b64-none"
    first, last = rec["epochs"]
    assert first["samples"] == last["samples"] == TRAIN
    # epoch 1 compiled its first step (warm-up) and its last batch of 52 (steady, so left out of it);
    # epoch 2 compiled nothing and is steady throughout
    assert first["compile_s"] > 0 and last["compile_s"] == 0
    assert first["steady_samples"] == TRAIN - 2 * BATCH - (TRAIN % BATCH)
    assert last["steady_samples"] == TRAIN and last["steady_s"] == pytest.approx(last["wall_s"])
    # evaluation runs the compiled model eagerly (set_stance force_eager): it compiles nothing
    assert first["eval_compile_s"] == 0 and last["eval_compile_s"] == 0
    summary = rec["summary"]
    assert summary["compile_s"] == pytest.approx(sum(e["compile_s"] + e["eval_compile_s"] for e in rec["epochs"]))
    # The steady window and the compiling steps are disjoint parts of the epoch, whatever the load:
    # had the last batch's recompile stayed in the window, it would count twice and the two would
    # add up to more than the epoch (by the recompile's seconds, less the few warm-up steps).
    assert first["steady_s"] + first["compile_s"] <= first["wall_s"] * (1 + 1e-6)
    assert summary["samples_per_s"] == pytest.approx(
        (first["steady_samples"] + TRAIN) / (first["steady_s"] + last["steady_s"])
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_compiled_ddp_and_fsdp_over_gloo_match_uncompiled(data_root, tmp_path, mode):
    # per rank: 250 samples, 7 batches of 32 and a last one of 26 (a recompile, in the steady window)
    settings = {"mode": mode, "gpus": 2, "backend": "gloo", "epochs": 1, "warmup_steps": 2}
    records = {}
    for compiled in (False, True):
        out = tmp_path / str(compiled)
        proc = train(spec_for(data_root, **settings, compile=compiled), out, nproc=2)
        assert proc.returncode == 0, proc.stderr
        records[compiled] = record.read(out / "record.json")
    plain, compiled = records[False]["epochs"][0], records[True]["epochs"][0]
    assert records[True]["status"] == "ok" and compiled["compile_s"] > 0 and "compile_s" not in plain
    # evaluation runs eagerly in both modes (ddp its plain module, fsdp its compiled units under
    # set_stance force_eager): it compiles nothing
    assert compiled["eval_compile_s"] == 0
    # the probe times training's own compiled steps: it compiles nothing either (a recompile in a
    # timed loop would count as step time; FSDP's probe once compiled every block again)
    assert records[True]["probe"]["graphs_compiled"] == 0 and "graphs_compiled" not in records[False]["probe"]
    assert records[True]["summary"]["compile_s"] > 0 and "compile_s" not in records[False]["summary"]
    assert plain["steady_samples"] == TRAIN - 2 * BATCH
    assert compiled["steady_samples"] == plain["steady_samples"] - 2 * (TRAIN // 2 % (BATCH // 2))
    # Inductor fuses and reorders float arithmetic: the same seed's losses agree closely, not
    # bitwise (measured here: train loss 7e-9 apart relatively, test loss equal)
    for key in ("train_loss", "test_loss"):
        assert compiled[key] == pytest.approx(plain[key], rel=1e-5), key
