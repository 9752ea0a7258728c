"""`make gpu-check` (dpstudy.gpucheck) on a machine without a GPU: its no-GPU exit, its summary
writer on recorded raw files (tests/data/gpucheck/, hand-made), its registry, and the measuring
functions of its items run on CPU at tiny sizes."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import REPO

from dpstudy.data.task import Task
from dpstudy.gpucheck import figures, gputests, measurements, registry, runner, study, summary, worker

RECORDED = REPO / "tests" / "data" / "gpucheck"


def _gpucheck(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dpstudy.gpucheck", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def recorded(tmp_path):
    """A copy of a recorded set of raw files: recorded("h100-one-missed") -> its folder."""

    def copy(name: str) -> Path:
        out = tmp_path / name
        shutil.copytree(RECORDED / name, out)
        return out

    return copy


# ---- (a) no GPU: one line, exit 77, nothing written ---------------------------------------------


def test_without_a_gpu_it_says_so_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "gc"
    # An empty CUDA_VISIBLE_DEVICES hides every GPU, so this holds on a GPU host too.
    proc = _gpucheck("--out", str(out), env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == runner.NO_GPU == 77
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu-check: no CUDA GPU visible (torch ") and lines[0].endswith(": nothing run")
    assert not out.exists()


def test_make_gpu_check_without_a_gpu_runs_nothing(tmp_path):
    # Through make (the venv is up to date, so setup is silent): the one line, then make's own
    # report of the status; make itself exits 2 whatever a recipe's status was.
    before = sorted(p.name for p in (REPO / "results").iterdir()) if (REPO / "results").exists() else []
    proc = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "gpu-check"],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("gpu-check: no CUDA GPU visible") and lines[-1].endswith("Error 77"), lines
    assert len(lines) == 2
    after = sorted(p.name for p in (REPO / "results").iterdir())
    # no results/gpu-check; another pytest-xdist worker may meanwhile build the tests' extension
    assert set(after) - set(before) <= {"ext-test", "ext-test.lock"} and set(before) <= set(after)
    assert ("gpu-check" in after) == ("gpu-check" in before)


def test_only_rejects_unknown_items_before_anything_runs(tmp_path):
    proc = _gpucheck("--out", str(tmp_path / "gc"), "--only", "tests,bogus")
    assert proc.returncode == 2 and "bogus" in proc.stderr
    assert "tests,study,loader,resnet,lm,grayscale,comm,forecast,scaling" in proc.stderr
    assert runner.parse_only("comm, tests") == ["tests", "comm"]  # the registry's order


# ---- (b) the summary writer on recorded inputs --------------------------------------------------


def _rows(text: str) -> dict[tuple[str, str], list[str]]:
    """{(item, figure): [measured, target, verdict]} from summary.md's table."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 5 and cells[0][:1].isdigit():
            rows[(cells[0].split(" ", 1)[1], cells[1])] = cells[2:]
    return rows


def test_summary_has_every_figure_with_its_target_and_the_missed_one_fails(recorded):
    out = recorded("h100-one-missed")
    path, verdicts = summary.write(out)
    text = path.read_text()
    rows = _rows(text)
    # one GPU: the scaling item does not apply, and says why in its one row
    assert rows[("scaling", registry.BY_NAME["scaling"].title)] == [
        "not applicable: needs 3 or more GPUs (calibrates on 1-2); 1 visible",
        "throughput forecast on 3+ GPUs from 1-2 GPUs' cells, median absolute error: ≤ 10 %; "
        "the same, largest absolute error: ≤ 25 %; settings forecast and checked: ≥ 1",
        "not run",
    ]
    # lm, trace and zero are in no recorded set: they read "not run" here (test_gpucheck_lm.py,
    # test_gpucheck_trace.py and test_gpucheck_zero.py make their figures)
    for name in ("lm", "trace", "zero"):
        assert rows[(name, registry.BY_NAME[name].title)][2] == "not run", name
    for item in registry.ITEMS:
        if item.name in ("scaling", "lm", "trace", "zero"):
            continue
        for figure in item.figures:
            measured, target, verdict = rows[(item.name, figure.label)]
            assert measured and measured != "not measured", (item.name, figure.key)
            if figure.target:
                assert target == figure.target.describe(figure.fmt) and verdict in ("PASS", "FAIL")
            else:
                assert (target, verdict) == ("—", "no target")
    assert rows[("loader", "data wait in the device loader's epoch")] == ["6.8 %", "< 5 %", "FAIL"]
    assert [v.name for v in verdicts if v.verdict == "FAIL"] == ["loader"]
    assert summary.exit_status(verdicts) == 1
    # figures read as people write them
    assert rows[("resnet", "training images/s (device loader, steady epochs)")][:2] == [
        "43,700 img/s (9 steady epochs of 50,000 images in 10.3 s; data wait 1.2 %)",
        "≥ 40,000 img/s",
    ]
    assert rows[("grayscale", "extension bandwidth / peak memory bandwidth")][0].startswith("72 % of 3.35 TB/s")
    assert rows[("loader", "device loader (c) vs DataLoader (a), epoch time")][1:] == ["≥ 20x", "PASS"]
    assert rows[("resnet", "MFU (dense BF16 peak)")][0].startswith("15 % of 990 TFLOP/s")
    # the header and the rest
    for fact in (
        "NVIDIA H100 80GB HBM3",
        "570.124.06",
        "2.11.0+cu128",
        "torch/__init__.py",
        "12.8 / 91002 / 2.27.3",
        "**Result: FAIL**",
        "NCCL at world size 1 moves no data between devices",
        "`raw/loader.json`",
    ):
        assert fact in text, fact


def test_all_passing_inputs_give_exit_status_0(recorded):
    path, verdicts = summary.write(recorded("h100-all-pass"))
    # one GPU: scaling does not apply; lm, trace and zero are in no recorded set
    expected = {"lm": "not run", "scaling": "not run", "trace": "not run", "zero": "not run"}
    assert {v.name: v.verdict for v in verdicts if v.verdict != "PASS"} == expected
    assert summary.exit_status(verdicts) == 0
    assert "**Result: PASS**" in path.read_text()


def test_an_item_without_a_raw_file_reads_not_run(recorded):
    out = recorded("h100-all-pass")
    (out / "raw" / "resnet.json").unlink()
    path, verdicts = summary.write(out)
    # resnet's raw file removed; lm, scaling (one GPU), trace and zero have none in the recorded set
    assert [v.verdict for v in verdicts] == [*["PASS"] * 3, "not run", "not run", *["PASS"] * 3, *["not run"] * 3]
    assert summary.exit_status(verdicts) == 0
    (row,) = [r for (item, _), r in _rows(path.read_text()).items() if item == "resnet"]
    assert row[0] == "not run" and row[2] == "not run" and "≥ 40,000 img/s" in row[1]
    # The command rewrites the summary from the raw files alone, and needs no GPU to do so.
    proc = _gpucheck("--summary-only", "--out", str(out))
    assert proc.returncode == 0 and "| 4 resnet |" in proc.stdout


def test_an_item_that_failed_to_run_is_a_failure_with_its_error(recorded):
    out = recorded("h100-all-pass")
    raw = json.loads((out / "raw" / "comm.json").read_text())
    raw.update(status="error", error="RuntimeError: NCCL error: unhandled system error", figures={})
    (out / "raw" / "comm.json").write_text(json.dumps(raw))
    path, verdicts = summary.write(out)
    assert {v.name: v.verdict for v in verdicts}["comm"] == "FAIL" and summary.exit_status(verdicts) == 1
    assert summary.exit_status(verdicts, ["tests", "loader"]) == 0  # only the items run count
    assert "NCCL error: unhandled system error" in path.read_text()
    assert _gpucheck("--summary-only", "--out", str(out)).returncode == 1


def test_summary_is_a_pure_function_of_the_raw_files(recorded):
    out = recorded("h100-one-missed")
    raws = summary.read_raw(out)
    assert summary.render(raws, ["raw/x.json"]) == summary.render(json.loads(json.dumps(raws)), ["raw/x.json"])


# ---- (c) the registry ---------------------------------------------------------------------------


def test_the_items_are_exactly_the_eleven_in_order():
    assert registry.NAMES == (
        "tests", "study", "loader", "resnet", "lm", "grayscale", "comm", "forecast", "scaling", "trace", "zero"
    )  # fmt: skip
    assert [
        f.target.describe(f.fmt) for i in registry.ITEMS for f in i.figures if f.target and f.target.op != "true"
    ] == [
        "≥ 1",
        "= 0",
        "≤ 2 %",
        "≤ 2 %",
        "≥ 20x",
        "< 5 %",
        "≥ 40,000 img/s",
        "≥ 40 %",
        "≤ 10 %",
        "≤ 10 %",
        "≥ 50 %",
        "≤ 5 %",
        "≤ 10 %",
        "= 0",
        "≤ 2 %",
        "≤ 10 %",
        "≤ 25 %",
        "≥ 1",
        "≤ 15 %",
        "≤ 15 %",
        "≤ 15 %",
    ]
    for item in registry.ITEMS:  # every function exists (imported, not run)
        module, function = item.function.split(":")
        assert callable(getattr(__import__(module, fromlist=[function]), function))


def test_targets_and_formats():
    at_least = figures.Target(">=", 20)
    assert at_least.met(20) and not at_least.met(19.9) and not at_least.met(None) and not at_least.met(float("nan"))
    assert figures.Target("true").met(True) and not figures.Target("true").met(1)
    fmt = figures.FORMATS
    assert (
        fmt["img_per_s"](41234.5) == "41,200 img/s" and fmt["share"](0.031) == "3.1 %" and fmt["share"](0.624) == "62 %"
    )
    assert fmt["bytes_per_s"](2.41e12) == "2.41 TB/s" and fmt["bytes_per_s"](6.1e11) == "610 GB/s"
    assert (
        fmt["duration"](468.2) == "7 min 48 s"
        and fmt["ratio"](27.43) == "27.4x"
        and fmt["flop"](3.329e9) == "3.33 GFLOP"
    )
    assert fmt["tokens_per_s"](412_345.6) == "412,000 tokens/s" and fmt["mb"](9_512.3) == "9,510 MB"


# ---- (d) the items' measuring functions, on CPU at tiny sizes -----------------------------------


def test_resnet_throughput_on_cpu_counts_flops_like_models_stats():
    from dpstudy import models
    from dpstudy.microbench import throughput

    m = throughput.measure("cpu", size=16, images=192, batch=64, precision="bf16", min_steady_s=0)
    assert m["images_per_s"] > 0 and m["steady_epochs"] == 1 and m["steady_samples"] == 192
    assert m["flops_per_image"] == models.cost("resnet18", Task.image(3, 16, 10))["train_flops_per_sample"]
    assert m["achieved_tflops"] == pytest.approx(m["images_per_s"] * m["flops_per_image"] / 1e12)
    assert m["mfu"] is None and m["loss_finite"] and 0 <= m["data_wait_share"] < 1
    result = measurements.resnet_result(m)
    assert result["details"]["mfu"].startswith("unknown (device not in the table")
    assert summary.evaluate(registry.BY_NAME["resnet"], {"status": "ok", **result}).rows[1].verdict == "no target"


def test_grayscale_bandwidth_counts_bytes_and_checks_the_output():
    from dpstudy.ext import reference
    from dpstudy.microbench import bandwidth

    assert bandwidth.grayscale_bytes((2, 3, 4, 5)) == 2 * 4 * 5 * (3 + 1)
    assert bandwidth.grayscale_bytes((3, 7, 9)) == 7 * 9 * 4
    r = bandwidth.grayscale(reference.rgb_to_grayscale, "cpu", shape=(4, 3, 16, 8), warmup=1, runs=5, peak_bps=1e9)
    ext = r["extension"]
    assert r["check"]["correct"] and r["check"]["shape_ok"] and ext["bytes"] == 4 * 16 * 8 * 4 and ext["runs"] == 5
    assert ext["bandwidth_bps"] == pytest.approx(ext["bytes"] / ext["median_s"])
    assert ext["fraction_of_peak"] == pytest.approx(ext["bandwidth_bps"] / 1e9)
    assert r["torchvision"]["bandwidth_bps"] > 0
    # An op that leaves part of its output unwritten is caught.
    lazy = lambda images: torch.cat([reference.rgb_to_grayscale(images[:1]), torch.zeros_like(images[1:, :1])])  # noqa: E731
    check = bandwidth.check_output(lazy, torch.full((3, 3, 2, 2), 200, dtype=torch.uint8))
    assert not check["correct"] and check["mismatched_pixels"] == 8
    figures = measurements.grayscale_result(r, "test peak")["figures"]
    assert figures["correct"] is True and figures["fraction_of_peak"] == ext["fraction_of_peak"]


def test_peak_table_finds_devices_by_their_torch_names():
    from dpstudy.util import peaks

    expect = {
        "NVIDIA H100 80GB HBM3": (989.5, 3.35),
        "NVIDIA H100 PCIe": (756.5, 2.0),
        "NVIDIA H100 NVL": (835.5, 3.9),
        "NVIDIA H200": (989.5, 4.8),
        "NVIDIA H200 NVL": (835.5, 4.8),
        "NVIDIA GH200 480GB": (989.5, 4.0),
        "NVIDIA A100-SXM4-40GB": (312, 1.555),
        "NVIDIA A100-SXM4-80GB": (312, 2.039),
        "NVIDIA A100 80GB PCIe": (312, 1.935),
        "NVIDIA A10": (125, 0.6),
        "NVIDIA L4": (121, 0.3),
        "NVIDIA L40S": (362, 0.864),
        "NVIDIA L40": (181, 0.864),
        "NVIDIA B200": (2250, 8.0),
    }
    for name, (tflops, tbps) in expect.items():
        peak = peaks.lookup(name)
        assert peak is not None and (peak.bf16_tflops, peak.mem_tbps) == (tflops, tbps), name
    for unknown in ("NVIDIA A10G", "NVIDIA GeForce RTX 4090", "Tesla T4", "cpu"):
        assert peaks.lookup(unknown) is None, unknown


def test_loader_benchmark_on_cpu_gives_the_item_its_figures():
    from dpstudy.microbench import loader

    results = loader.run("cpu", keys=("a", "c"), repeats=1, train_size=512)
    assert list(results) == ["a", "c"] and all(r["samples"] == 512 for r in results.values())
    figures = measurements.loader_result(results)["figures"]
    assert figures["speedup"] == pytest.approx(results["a"]["wall_s"] / results["c"]["wall_s"])
    assert figures["data_wait_share"] == pytest.approx(results["c"]["data_wait_s"] / results["c"]["wall_s"])
    assert "c_vs_bound" not in figures and loader.table(results)[2].startswith("| (a) | torch, 0 workers, affine |")
    bound = {**results, "d": {**results["c"], "wall_s": results["a"]["wall_s"] / 11.08}}
    result = measurements.loader_result(bound)
    assert result["figures"]["c_vs_bound"] == pytest.approx(results["c"]["wall_s"] * 11.08 / results["a"]["wall_s"])
    assert result["details"]["speedup"].endswith("; the bare step (d) bounds it at 11.1x")


def test_junit_counts_and_the_tests_verdict(tmp_path):
    xml = tmp_path / "tests.xml"
    xml.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1" '
        'skipped="2" tests="7"><properties><property name="dpstudy_gpu_seed" value="123"/></properties>'
        '<testcase classname="tests.test_gpu" name="test_a"/>'
        '<testcase classname="tests.test_gpu" name="test_b"><failure message="AssertionError: 3 pixels differ">'
        'x</failure></testcase><testcase classname="tests.test_ext" name="test_c"><error message="fixture">e</error>'
        "</testcase></testsuite></testsuites>"
    )
    counts = gputests.junit_counts(xml)
    assert (counts["ran"], counts["failed"], counts["passed"], counts["skipped"]) == (5, 2, 3, 2)
    assert [f["test"] for f in counts["failing"]] == ["tests.test_gpu::test_b", "tests.test_ext::test_c"]
    result = gputests.tests_result(counts, 1, 12.0, "raw/tests.xml")
    assert any("DPSTUDY_GPU_SEED=123" in note for note in result["notes"])
    tests = registry.BY_NAME["tests"]
    assert summary.evaluate(tests, {"status": "ok", **result}).verdict == "FAIL"
    all_skipped = {**counts, "tests": 4, "skipped": 4, "ran": 0, "failed": 0, "passed": 0, "failing": []}
    verdict = summary.evaluate(tests, {"status": "ok", **gputests.tests_result(all_skipped, 0, 3.0, "x")})
    assert verdict.verdict == "FAIL" and "CUDA was not usable inside pytest" in verdict.rows[0].measured


def _cells(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["cell", "mode", "gpus", "nodes", "backend", "status", "reason", "env_device"])


def test_study_checks_read_the_tables():
    ok = [(f"c-{m}-{b}-r{r}", m, 1, 1, b, "ok", None, "cuda") for m, b in study.CORE for r in range(3)]
    util = pd.DataFrame({"cell": [c[0] for c in ok], "device": 0, "t": 0.5, "gpu_util": 40.0})
    too_big = {"c-dp-g2": 2, "c-ddp-g2": 2}
    result = study.check_tables(_cells(ok), util, 1, too_big, ["c-dp-g2", "c-ddp-g2"])
    assert result["figures"] == {"core_cells_ok": True, "too_big_skipped": True, "util_filled": True}
    assert result["details"]["core_cells_ok"].startswith("12 of 12 ok on cuda (single 3, dp 3, ddp nccl 3, ddp gloo 3)")
    # a skipped record naming GPUs counts too; a failed core cell, a lost cell, missing samples do not
    skipped = ("c-dp-g2", "dp", 2, 1, "none", "skipped", "the cell needs 2 GPUs but 1 are visible", "cuda")
    failed = ok[:-1] + [(ok[-1][0], "ddp", 1, 1, "gloo", "failed", "Gloo timeout", "cuda"), skipped]
    result = study.check_tables(_cells(failed), util.iloc[1:], 1, too_big, [])
    assert result["figures"] == {"core_cells_ok": False, "too_big_skipped": False, "util_filled": False}
    assert any("Gloo timeout" in n for n in result["notes"]) and any("c-ddp-g2" in n for n in result["notes"])
    no_dp = [c for c in ok if c[1] != "dp"]
    assert study.check_tables(_cells(no_dp), util, 2, {}, [])["figures"]["core_cells_ok"] is False
    assert (
        "every cell fits the 2 visible GPUs"
        in study.check_tables(_cells(ok), util, 2, {}, [])["details"]["too_big_skipped"]
    )


def test_study_reports_the_machines_floor_and_the_single_device_noise_on_cuda():
    summary = pd.DataFrame(
        [
            {
                "floor_runs": 3,
                "floor_compute_cv": 0.004,
                "floor_memory_cv": 0.011,
                "floor_dispatch_cv": 0.008,
                "floor_cv": 0.011,
                "floor_verdict": "at the floor",
                "noise_floor_settings": 2,
                "noise_floor_median_cv": 0.012,
                "noise_floor_max_cv": 0.019,
            }
        ]
    )
    floor = pd.DataFrame({"device": ["cuda"] * 3, "compute_gflops": [5e4] * 3, "memory_gbps": [2e3] * 3})
    result = study.noise_figures(summary, floor)
    assert result["figures"] == {"floor_cv": 0.011, "single_cv": 0.019}
    assert (
        result["details"]["floor_cv"]
        == "3 runs on cuda: matmuls 0.40%, copies 1.10%, dispatch 0.80%; verdict on the cells: at the floor"
    )
    older = study.noise_figures(summary.drop(columns="floor_dispatch_cv"), floor)  # runs before dispatch
    assert older["details"]["floor_cv"].startswith("3 runs on cuda: matmuls 0.40%, copies 1.10%; verdict")
    assert result["details"]["single_cv"] == "largest of 2 single-device settings (median 1.20%)"
    item = registry.BY_NAME["study"]
    targets = {f.key: f.target for f in item.figures}
    assert targets["floor_cv"].met(0.011) and not targets["single_cv"].met(0.021)
    # one round, or no tables: no figure, and the target is missed rather than met by default
    one = study.noise_figures(summary.assign(floor_runs=1, floor_cv=float("nan")), floor.iloc[:1])
    assert one["figures"]["floor_cv"] is None and not targets["floor_cv"].met(None)
    assert study.noise_figures(None, None)["figures"] == {"floor_cv": None, "single_cv": None}


def test_study_knows_which_cells_need_more_gpus_and_what_snakemake_left_out():
    too_big = study.too_big_cells(1)
    assert len(too_big) == 18 and set(too_big.values()) == {2}
    assert study.too_big_cells(2) == {}
    line = (
        "2 cells need more GPUs than --resources gpu allows and are left out: "
        "synthetic-lenet-dp-g2-b64-none-r0, synthetic-lenet-ddp-g2-b64-nccl-r0\n"
    )
    assert study.left_out_cells(["Building DAG\n", line]) == [
        "synthetic-lenet-dp-g2-b64-none-r0",
        "synthetic-lenet-ddp-g2-b64-nccl-r0",
    ]
    assert study.snakemake_command(1, 16)[1:] == [
        "-m",
        "snakemake",
        "--cores",
        "16",
        "--resources",
        "gpu=1",
        "--config",
        "device=cuda",
    ]


def test_comm_figures_on_one_gpu_and_on_two():
    from dpstudy.microbench import comm

    def rows(backend, world, collective="all_reduce", slower=1):
        sizes = [4096, 1 << 20, 256 << 20]
        median = [2e-5 * slower, 1e-4 * slower, 5e-2 * slower]
        df = pd.DataFrame(
            {
                "collective": collective,
                "backend": backend,
                "device": "cuda",
                "world_size": world,
                "bytes": sizes,
                "size": [comm.size_label(n) for n in sizes],
                "median_s": median,
                "reason": None,
            }
        )
        df["busbw_gbps"] = df.bytes / df.median_s / 1e9 * 2 * (world - 1) / world
        return df

    assert measurements.comm_plan(1) == [("nccl", 1), ("gloo", 2)]
    assert measurements.comm_plan(4) == [("nccl", 2), ("gloo", 2)]
    # all_gather and reduce_scatter rows (3x slower) sit beside them in comm.csv: the figures are all_reduce's
    others = [rows(b, w, c, slower=3) for b, w in (("nccl", 1), ("gloo", 2)) for c in ("all_gather", "reduce_scatter")]
    one = measurements.comm_result(pd.concat([*others, rows("nccl", 1), rows("gloo", 2)]), 1, {})
    assert one["figures"]["ran"] and one["figures"]["nccl_latency_us"] == pytest.approx(20)
    assert "nccl_busbw_gbps" not in one["figures"] and "world size 1" in one["details"]["nccl_busbw_gbps"]
    assert one["figures"]["gloo_busbw_gbps"] == pytest.approx((256 << 20) / 5e-2 / 1e9)
    assert measurements.ONE_GPU_NCCL in one["notes"]
    two = measurements.comm_result(rows("gloo", 2), 2, {"nccl": "RuntimeError: NCCL error"})
    assert two["figures"]["ran"] is False and "NCCL error" in two["details"]["nccl_latency_us"] and not two["notes"]


def test_worker_records_an_item_that_raises(tmp_path, monkeypatch):
    class Broken(registry.Item):
        def run(self, out):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setitem(worker.BY_NAME, "comm", Broken("comm", "comm", "x:y", registry.BY_NAME["comm"].figures, 10))
    assert worker.run("comm", tmp_path) == 1
    raw = json.loads((tmp_path / "raw" / "comm.json").read_text())
    assert raw["status"] == "error" and "illegal memory access" in raw["error"] and raw["env"]["python"]
    verdict = summary.evaluate(registry.BY_NAME["comm"], raw)
    assert verdict.verdict == "FAIL" and "illegal memory access" in verdict.rows[0].measured


def test_forecast_item_checks_inner_batches_and_memory_against_the_allocator():
    from dpstudy.gpucheck import forecast

    # on CUDA a step of hypot(3 ms launching, 10 µs per sample on the device): the overlapped step
    # time through batches 128 and 1024 gives 256 and 512 exactly; 512 measured 5 % slower
    step = {b: math.hypot(0.003, 1e-5 * b) for b in (128, 256, 512, 1024)}
    step[512] *= 1.05
    settings = pd.DataFrame(
        [
            {
                "dataset": "d",
                "model": "m",
                "mode": "single",
                "devices": 1,
                "env_device": "cuda",
                "global_batch": b,
                "samples_per_s": b / s,
                "noise_cv": 0.01 * (i + 1),
            }
            for i, (b, s) in enumerate(step.items())
        ]
    )
    cells = pd.DataFrame(
        {
            "cell": ["a", "b", "c", "x"],
            "status": ["ok", "ok", "oom", "ok"],
            "dataset": "d",
            "model": "m",
            "batch": [64, 128, 256, 64],
        }
    )
    split = pd.DataFrame(
        {
            "cell": ["a", "b", "x"],
            "against": ["allocator", "allocator", "tracker"],
            "error_pct": [-4.0, 8.0, 50.0],  # the tracker's row is not the allocator check
            "allocated_mb": [100.0, 200.0, 1.0],
            "reserved_mb": [120.0, 220.0, None],
            "context_mb": [500.0, None, None],
            "resident_mb": [30.0, 30.0, None],
            "predicted_allocated_mb": [96.0, 216.0, None],
            "predicted_peak_mb": [60.0, 170.0, 1.5],
            "peak_mb": [64.0, 160.0, 1.0],
        }
    )
    result = forecast.evaluate({"settings": settings, "cells": cells, "memory_split": split})
    figures = result["figures"]
    assert figures["batch_median_error"] == pytest.approx(0.025)  # 0 at 256, 5 % at 512
    assert figures["batch_max_error"] == pytest.approx(0.05)
    assert figures["memory_median_error"] == pytest.approx(0.06) and figures["memory_max_error"] == pytest.approx(0.08)
    assert figures["reserved_over_allocated"] == pytest.approx((1.2 + 1.1) / 2)
    # the forecast: the plan plus the other batch's excess (a: 96 + (200 - 216) = 80 vs 100;
    # b: 216 + (100 - 96) = 220 vs 200)
    assert figures["memory_forecast_median_error"] == pytest.approx(0.15)
    assert figures["memory_forecast_max_error"] == pytest.approx(0.20)
    assert figures["context_mb"] == 500 and figures["oom_cells"] == 1 and figures["single_cv"] == pytest.approx(0.04)
    assert any("m batch 512: forecast" in note and "+5.0%" in note for note in result["notes"])
    assert result["details"]["single_cv"].startswith("largest of 4 settings, m batch 1024")
    # the same times from a CPU, where host and work do not overlap: the straight line misses 256
    on_cpu = forecast.evaluate({"settings": settings.assign(env_device="cpu"), "cells": cells, "memory_split": split})
    line_at_256 = step[128] + (step[1024] - step[128]) * 128 / 896
    assert on_cpu["figures"]["batch_max_error"] == pytest.approx(abs(step[256] / line_at_256 - 1), rel=1e-6)
    assert "floor_cv" not in result["figures"]  # no floor ran
    floor = pd.DataFrame({"device": ["cuda", "cuda"]})
    summary = pd.DataFrame(
        [
            {
                "floor_runs": 2,
                "floor_cv": 0.018,
                "floor_compute_cv": 0.001,
                "floor_memory_cv": 0.0002,
                "floor_dispatch_cv": 0.018,
                "floor_verdict": "above the floor",
                "noise_floor_max_cv": 0.07,
                "noise_floor_settings": 4,
                "noise_floor_median_cv": 0.02,
            }
        ]
    )
    tables = {"settings": settings, "cells": cells, "memory_split": split, "summary": summary, "floor": floor}
    with_floor = forecast.evaluate(tables)
    assert with_floor["figures"]["floor_cv"] == pytest.approx(0.018)
    assert "dispatch 1.80%" in with_floor["details"]["floor_cv"]
    assert with_floor["figures"]["single_cv"] == pytest.approx(0.04)  # the study's own settings, not the summary's
    # an item that measured nothing says why instead of passing
    empty = forecast.evaluate({"settings": settings.iloc[:2], "cells": cells, "memory_split": split.iloc[2:]})
    assert "batch_median_error" not in empty["figures"] and "memory_max_error" not in empty["figures"]
    assert "no CUDA cell" in empty["details"]["memory_median_error"]


def test_the_edge_cell_is_the_largest_batch_predicted_to_need_at_most_90_percent_of_the_gpu():
    from dpstudy.gpucheck import forecast
    from dpstudy.study.budget import need_of

    def predict(spec):  # a step of 100 MB + 2 MB per sample, as the fake step would give
        assert spec["model"] == "resnet18" and spec["loader"] == "torch" and spec["device"] == "cuda"
        return {"peak_mb": [100.0 + 2.0 * spec["batch"]]}

    edge = forecast.edge_sweep(16_000.0, predict)
    batch = edge["sweep"]["grid"]["batch"][0]
    assert batch % forecast.EDGE_STEP == 0 and edge["sweep"]["set"] == {"repeats": 1, "epochs": 2}
    assert edge["dataset"] == {"train_size": 2 * batch, "test_size": 1024}

    def need(b):  # the step, both splits of 1x28x28 uint8 with int64 labels and the epoch's indices
        return need_of(100 + 2 * b + ((2 * b + 1024) * 792 + 2 * b * 8) / 2**20, on_cuda=True)

    assert edge["need_mb"] == pytest.approx(need(batch))
    assert need(batch) <= 0.9 * 16_000 < need(batch + forecast.EDGE_STEP)
    # its figures: ran or not, and the share of the device its allocator held
    cells = pd.DataFrame(
        {
            "cell": ["e", "other"],
            "dataset": ["synthetic", "synthetic_rgb"],
            "batch": [batch, batch],
            "status": ["ok", "oom"],
        }
    )
    split = pd.DataFrame({"cell": ["e", "other"], "allocated_mb": [12_000.0, 15_000.0]})
    made = forecast.edge_figures(cells, split, edge, 16_000.0)
    assert made["figures"] == {"edge_ok": True, "edge_share": pytest.approx(0.75)}
    assert made["details"]["edge_ok"].startswith(f"resnet18 batch {batch}: ok; predicted need")
    ran_out = forecast.edge_figures(cells.assign(status=["oom", "ok"]), split, edge, 16_000.0)
    assert ran_out["figures"]["edge_ok"] is False
