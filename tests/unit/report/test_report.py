"""The report: findings' sentences from tables with known numbers, and the notebook run for real."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import REPO
from helpers.browser import open_offline
from helpers.records import (
    CURRENT,
    DP_REASON,
    NCCL_REASON,
    OOM_REASON,
    comm_bench,
    ddp_pair,
    make_record,
    make_util,
    run_report,
    small_grid,
    strategy_grid,
    strategy_plan,
    write_records,
)

from dpstudy.analysis import collect, tablefiles
from dpstudy.report import figures as plots
from dpstudy.report import findings, inventory

STUDY = "report_test_study"


def tables_of(directory: Path, records: list[dict]) -> dict[str, pd.DataFrame]:
    return collect.summarise(collect.collect(write_records(directory, records), CURRENT))


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict[str, pd.DataFrame]:
    return tables_of(tmp_path_factory.mktemp("grid"), small_grid())


def repeated(mode: str, values: list[float], accs: list[float] | None = None, **keys) -> list[dict]:
    """One record per repeat: throughputs `values`, final accuracies `accs`."""
    accs = accs or [0.9] * len(values)
    return [
        make_record(mode=mode, samples_per_s=v, accs=(0.6, a), repeat=i, suffix=f"-r{i}", **keys)
        for i, (v, a) in enumerate(zip(values, accs))
    ]


@pytest.fixture(scope="module")
def repeats(tmp_path_factory) -> dict[str, pd.DataFrame]:
    """Three repeats per setting: DDP clearly faster at batch 64, within noise at batch 128."""
    return tables_of(
        tmp_path_factory.mktemp("repeats"),
        [
            *repeated("single", [1000.0, 1100.0, 950.0], [0.90, 0.91, 0.905]),
            *repeated("ddp", [1500.0, 1600.0, 1400.0], [0.895, 0.90, 0.91], gpus=2, backend="gloo"),
            *repeated("single", [1000.0, 1050.0, 1020.0], batch=128),
            *repeated("ddp", [900.0, 1200.0, 1000.0], gpus=2, backend="gloo", batch=128),
        ],
    )


# ---- findings ---------------------------------------------------------------------------------


def test_environment_names_versions_and_hardware(tmp_path):
    gpu = [make_record(mode="ddp", gpus=2, batch=128, backend="nccl", device="cuda")]
    text = inventory.environment(tables_of(tmp_path, small_grid() + gpu)["cells"], STUDY)
    for expected in (
        STUDY,
        "8 cells (5 ok, 2 skipped, 1 oom)",
        "PyTorch** 2.14.1",
        "Test CPU 9000",
        "GPUs: 8 x Fake GPU",
        "world sizes 1, 2",
        "cpu, cuda",
    ):
        assert expected in text
    # a PyTorch the host provided (make setup TORCH=system) is named with its folder
    assert (
        "PyTorch** 2.14.1 (the host's for 1 cell, from /opt/torch/.venv/lib/python3.12/site-packages; "
        "dpstudy's venv for 7 cells), CUDA"
    ) in text
    only_venv = inventory.environment(tables_of(tmp_path / "venv", small_grid())["cells"], STUDY)
    assert "PyTorch** 2.14.1 (dpstudy's venv), CUDA none" in only_venv


def test_the_header_names_the_allocator_and_says_when_cells_ran_with_different_ones(tmp_path):
    cells = tables_of(tmp_path, small_grid())["cells"]
    assert "- **Allocator** not recorded" in inventory.environment(cells, STUDY)  # records before it
    jemalloc = "jemalloc (/usr/lib/x86_64-linux-gnu/libjemalloc.so.2)"
    ran = cells["status"] == "ok"
    same = cells.assign(allocator=cells["allocator"].where(~ran, jemalloc))
    assert f"- **Allocator** {jemalloc} in every cell that ran\n" in inventory.environment(same, STUDY)
    mixed = same.assign(allocator=same["allocator"].where(same.index != same.index[ran][0], "glibc"))
    counts = mixed["allocator"].value_counts()
    assert counts[jemalloc] > 1 and counts["glibc"] == 1
    assert (
        f"- **Allocator** **mixed**, so their throughputs do not compare: {jemalloc}: {counts[jemalloc]} cells, "
        "glibc: 1 cell\n"
    ) in inventory.environment(mixed, STUDY)


def test_one_run_gives_numbers_and_no_claim(grid):
    text = findings.speedup(grid)
    assert (
        "- synthetic/lenet, DDP (gloo) on 2 devices at batch 64: 1.50x one device's throughput, 75 % efficiency "
        "(1 vs 1 runs: too few for an interval; noise n/a / n/a)."
    ) in text
    assert "batch 256: 1.70x one device's throughput, 85 % efficiency" in text
    assert "Of 2 multi-device settings: no interval to decide on" in text


def test_repeats_claim_only_beyond_their_interval(repeats):
    text = findings.speedup(repeats)
    # Welch's t on log throughput (tests/unit/analysis/test_stats.py checks the method), geometric means 1496 / 1013
    assert (
        "- synthetic/lenet, DDP (gloo) on 2 devices at batch 64: 1.48x [1.26-1.73] one device's throughput, "
        "74 % [63-87] efficiency (3 vs 3 runs; noise 7 % / 8 %): **faster than one device**."
    ) in text
    # 15 % noise against a 0 % effect: flagged, not claimed
    assert (
        "batch 128: 1.00x [0.71-1.42] one device's throughput, 50 % [35-71] efficiency (3 vs 3 runs; noise 15 % "
        "/ 2 %): **noisier than its effect**: the noise (15 %) is larger than the effect (0 %)"
    ) in text
    assert "Of 2 multi-device settings: 1 faster than one device, 1 noisier than its effect" in text


def test_slower_and_not_measured(tmp_path):
    slower = tables_of(
        tmp_path / "a",
        [*repeated("single", [1000.0, 1010.0, 990.0]), *repeated("ddp", [600.0, 610.0, 590.0], gpus=2, backend="gloo")],
    )
    assert "0.60x [0.58-0.62] one device's throughput, 30 % [29-31] efficiency" in findings.speedup(slower)
    assert "**slower than one device**" in findings.speedup(slower)
    alone = tables_of(
        tmp_path / "b", [make_record(mode="single"), make_record("skipped", mode="dp", gpus=2, reason=DP_REASON)]
    )
    text = findings.speedup(alone)
    assert text.startswith("*Not measured in this study:*") and DP_REASON in text


def test_intra_and_inter_node_scaling_at_equal_world_size(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            make_record(mode="single", samples_per_s=1000.0),
            make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1800.0),
            make_record(mode="ddp", gpus=1, nodes=2, backend="gloo", samples_per_s=1200.0),
        ],
    )
    text = findings.speedup(tables)
    assert "DDP (gloo) on 2 nodes x 1 device at batch 64: 1.20x one device's throughput, 60 % efficiency" in text
    assert (
        "Intra- vs inter-node scaling (same world size):\n- synthetic/lenet at batch 64: 2 devices on one node "
        "reached 90 % efficiency, spread over 2 nodes 60 % (0.67x the one-node throughput)."
    ) in text
    assert inventory.environment(tables["cells"], "s").endswith(
        "\n- **Jobs** 2 cells local; 1 cell as 1 SLURM job (id 7) on nodes n1, n2"
    )


def slurm_cells(jobs: list[tuple[str, str | None]], estimated: list[float | None], took: list[float]) -> pd.DataFrame:
    """cells.csv's job columns: one finished SLURM cell per (job id, pack), its estimate and its total_s."""
    return pd.DataFrame(
        {
            "scheduler": "slurm",
            "job_id": [job for job, _ in jobs],
            "pack": [pack for _, pack in jobs],
            "rank_nodes": ["n1", "n2"] * (len(jobs) // 2) + ["n1"] * (len(jobs) % 2),
            "status": "ok",
            "estimated_s": pd.Series(estimated, dtype=float),
            "total_s": took,
        }
    )


def test_the_header_counts_the_slurm_jobs_the_packs_and_how_far_their_estimates_were_off():
    packed = [("101", "pack-1n-0")] * 3 + [("102", "pack-1n-1")] * 3 + [("103", None)]
    # measured / estimated: 0.30, 0.45, 0.60 | 0.35, 0.50, 0.62 | 0.41 -> median 0.45 of 7
    cells = slurm_cells(packed, [100.0] * 6 + [200.0], [30.0, 45.0, 60.0, 35.0, 50.0, 62.0, 82.0])
    assert inventory.jobs(cells) == (
        "7 cells as 3 SLURM jobs: 6 cells in 2 jobs, 3 cells per job (packs of 3 cells), and 1 cell as a job of its "
        "own (ids 101, 102, 103) on nodes n1, n2; the cells took 0.45x their estimated time (median; 0.30-0.62x "
        "over 7 finished cells)"
    )
    # a cell that did not finish (stopped at its limit) says nothing of its estimate
    failed = cells.assign(status=["ok", "ok", "failed", "ok", "ok", "ok", "ok"])  # 0.30 0.35 0.41 | 0.45 0.50 0.62
    assert inventory.jobs(failed).endswith("took 0.43x their estimated time (median; 0.30-0.62x over 6 finished cells)")


def test_unequal_packs_give_cells_per_job_and_their_range_and_no_estimate_clause_without_estimates():
    packed = [("101", "pack-1n-0")] * 3 + [("102", "pack-1n-1")] * 4
    cells = slurm_cells(packed, [None] * 7, [30.0] * 7)
    assert (
        inventory.jobs(cells)
        == "7 cells as 2 SLURM jobs, 3.5 cells per job (packs of 3-4 cells; ids 101, 102) on nodes n1, n2"
    )
    # a study without packs: a job per cell, as before packing
    own = slurm_cells([("7", None), ("8", None), ("9", None)], [None] * 3, [30.0] * 3)
    assert inventory.jobs(own) == "3 cells as 3 SLURM jobs (ids 7, 8, 9) on nodes n1, n2"


def test_a_local_study_runs_as_before(tmp_path):
    cells = tables_of(tmp_path, small_grid())["cells"]
    assert cells["pack"].isna().all() and cells["estimated_s"].isna().all()
    assert inventory.jobs(cells) == f"{len(cells)} cells local"


def test_the_model_names_the_largest_loss(tmp_path):
    tables = tables_of(tmp_path, ddp_pair())
    text = findings.why_not_n(tables)  # see test_scaling: 10 ms of the all-reduce exposed
    assert (
        "- synthetic/lenet, DDP (gloo) on 2 devices at batch 64: measured 1.50x, step model 1.50x of an ideal 2x. "
        "Largest loss: **collectives (all-reduce, all-gather, reduce-scatter) the step did not hide** "
        "(10.0 ms of a 42.7 ms step whose ideal is 32.0 ms)."
    ) in text
    # 42.7 ms = 32.0 ideal + 0 per-device compute (one batch: t1 through the origin) - 0.827 host share
    # (what the step leaves) + 10.0 exposed + 1.49 extra data wait; no fits, so the collectives alone n/a
    assert (
        "| synthetic/lenet, DDP (gloo) on 2 devices at batch 64 | 1.50x | 1.50x | 42.7 (32.0) | n/a | 0 | "
        "-0.827 (noise unknown: one run) | 0 | n/a (10.0; n/a) | n/a | 1.49 | n/a | 0 |"
    ) in text
    assert "Exposed collectives from: probe" in text
    assert findings.why_not_n(tables_of(tmp_path / "none", [make_record(mode="single")])).startswith(
        "*Not measured in this study:*"
    )


def test_accuracy_gap_between_modes(grid, repeats):
    text = findings.accuracy(grid)
    assert text.startswith(
        "Final test accuracy differed by at most 0.8 points across modes at equal settings "
        "(largest gap: synthetic/lenet at batch 256, one device 88.0 % vs DDP (gloo) on 2 devices 87.2 %)."
    )
    assert (
        "- synthetic/lenet at batch 64: DDP (gloo) on 2 devices 89.5 %, one device 90.0 %: one run each: no claim."
        in text
    )
    text = findings.accuracy(repeats)
    # t-intervals on the mean: 90.2 % +- 4.30 x 0.76 / sqrt(3), 90.5 % +- 4.30 x 0.5 / sqrt(3)
    assert (
        "at batch 64: DDP (gloo) on 2 devices 90.2 % [88.3-92.1], one device 90.5 % [89.3-91.7]: within noise." in text
    )
    assert "; within noise)." in text.splitlines()[0]


def test_data_wait_by_loader(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            make_record(mode="single", loader="torch", workers=0, wait_frac=0.12),
            make_record(mode="ddp", gpus=2, backend="gloo", loader="device", wait_frac=0.01),
        ],
    )
    text = findings.data_wait(tables)
    assert (
        "Waiting for data took 12 % of the training time with loader torch/0 workers vs 1 % with loader device." in text
    )
    assert "By mode: DDP (gloo) on 2 devices 1 %, one device 12 %." in text


def test_backends_compared_or_explained(grid, tmp_path):
    text = findings.backends(grid)
    assert "*Not measured in this study:*" in text and NCCL_REASON in text
    both = tables_of(
        tmp_path,
        [
            make_record(mode="ddp", gpus=2, backend=b, samples_per_s=sps, device="cuda")
            for b, sps in (("nccl", 1700.0), ("gloo", 1300.0))
        ],
    )
    text = findings.backends(both, comm=pd.DataFrame({"bytes": [1024], "gbps": [3.2]}))
    assert (
        "on 2 devices at batch 64: NCCL reached 1.31x the throughput of Gloo (1,700 vs 1,300 samples/s): "
        "one run each: no claim."
    ) in text
    assert "all-reduce microbenchmark below" in text


def test_memory_imbalance(grid, tmp_path):
    text = findings.memory(grid)
    assert "- DP: *Not measured in this study:* no DP cell finished (dp needs CUDA" in text
    assert (
        "DDP (gloo) on 2 devices: the fullest device peaked at 1.01x the memory of the emptiest (120 MB vs 119 MB"
        in text
    )
    dp = tables_of(tmp_path, [make_record(mode="dp", gpus=2, device="cuda", peak_mem=[300.0, 180.0])])
    assert (
        "DP on 2 devices: the fullest device peaked at 1.67x the memory of the emptiest (300 MB vs 180 MB"
        in findings.memory(dp)
    )


@pytest.fixture(scope="module")
def strategy_tables(tmp_path_factory) -> dict[str, pd.DataFrame]:
    records = strategy_grid()
    root = tmp_path_factory.mktemp("strategies")
    collected = collect.collect(write_records(root, records), CURRENT, strategy_plan(records))
    tables = collect.summarise(collected, comm_bench())
    tablefiles.write_tables(tables, root / "tables")  # the report reads them back from CSV
    return tablefiles.read_tables(root / "tables")


def test_which_strategy_names_the_fastest_that_fits_its_lead_and_the_models_reason(strategy_tables):
    text = findings.strategies(strategy_tables)
    assert (
        "**synthetic/lenet at global batch 64**: fastest that fits: **DDP (gloo) on 2 devices**, "
        "1,500 samples/s [1,430-1,580], 1.50x [1.38-1.63] one device; ahead of the next, "
        "FSDP grad_op (gloo) on 2 devices, by 1.01x [0.96-1.05] (**within noise**: a tie)." in text
    )
    assert "| 3 | FSDP full (gloo) on 2 devices | 1,200 [1,180-1,230] | 1.20x [1.09-1.32] | 50.0 (55.0) |" in text
    assert "| 4 | one device, compiled | 1,100 | 1.10x | 100 (110) | 1,100 (3) |" in text
    # DDP is its group's only DDP setting: nothing else calibrates it, so no held-out forecast
    assert "| 1 | DDP (gloo) on 2 devices | 1,500 [1,430-1,580] | 1.50x [1.38-1.63] | 70.0 (77.0) | n/a |" in text
    assert "- does not fit: FSDP full (gloo) on 2 devices: predicted 93.10 GiB &gt; 70 GiB per device" in text
    assert "- did not run: DDP (nccl) on 2 devices: skipped, nccl needs CUDA: no GPU is visible" in text
    assert (
        "The step model orders them as measured, up to ties within noise: FSDP grad_op (gloo) on 2 devices, "
        "FSDP full (gloo) on 2 devices, one device, compiled, one device." in text
    )
    assert "Largest loss against n x: DDP (gloo) on 2 devices: " in text and " ms per step" in text
    # batch 1024 ran out of memory in its only strategy: no ranking, nothing claimed
    assert "global batch 1024" not in text


def test_memory_split_and_its_prediction_are_phrased_from_their_tables(strategy_tables):
    text = findings.memory(strategy_tables)
    assert (
        "- FSDP full on 2 devices: the fullest device holds 0.50x one device's model state and peaks at 1.25x "
        "the emptiest device (medians of 3 cells; e.g. `synthetic-lenet-fsdp-g2-b64-gloo-shardfull-r1`: 20.0 MB "
        "of parameters, gradients and optimizer state vs 40.0 MB on one device)." in text
    )
    assert "- DDP on 2 devices: the fullest device holds 1.00x one device's model state" in text
    # the plan is 10 % above every measured peak
    assert (
        "the peak per device was off by a median of 10.0 % and at most 10.0 % over 22 devices, within the 15 % target"
        in text
    )
    assert "workspaces" not in text  # the tracker against itself (CPU records): nothing to say
    # CUDA cells planned without a GPU: the workspaces left out, said so; measured: how much they added
    every = lambda t: t.index == t.index  # noqa: E731
    cuda = changed(strategy_tables, "memory_accuracy", every, against="allocator")
    cuda = changed(cuda, "memory_split", lambda t: t["error_pct"].notna(), against="allocator")
    assert "The plan ran without a GPU: its allocator peak leaves out the libraries' workspaces" in findings.memory(
        cuda
    )
    checked = cuda["memory_split"]["against"] == "allocator"
    on_gpu = changed(cuda, "memory_split", lambda t: checked, predicted_workspace_mb=4.6)
    on_gpu = changed(on_gpu, "memory_split", lambda t: t.index == checked.idxmax(), predicted_workspace_mb=96.4)
    assert (
        "The plan's allocator peak includes the libraries' workspaces (cuBLAS's and cuDNN's), measured on the "
        "planning host's GPU: a median "
        f"+4.60 MB and at most +96.4 MB over {checked.sum()} devices." in findings.memory(on_gpu)
    )
    worse = changed(strategy_tables, "memory_accuracy", lambda t: t["mode"] == "all", max_abs_error_pct=31.0)
    worse = changed(worse, "memory_accuracy", lambda t: t["mode"] == "all", within_target=False)
    assert "and at most 31.0 % over 22 devices, **not** within the 15 % target" in findings.memory(worse)
    # a CPU study: the tracker against itself, said so, with the process's resident memory beside it
    cpu = changed(strategy_tables, "memory_accuracy", lambda t: t["mode"] == "all", rss_growth_mb=6.5)
    cpu = changed(cpu, "memory_accuracy", lambda t: t["mode"] == "all", activations_mb=17.25, against="tracker")
    text = findings.memory(cpu)
    assert "Against the tracker's own measurement of the step (no allocator peak exists on a CPU" in text
    assert (
        "Over the same step the process's resident memory grew by a median 6.50 MB, beside the 17.2 MB of "
        "activations the tracker counted" in text
    )


def test_utilisation_when_sampled_or_not(grid, tmp_path):
    assert findings.utilisation(grid).startswith("*Not measured in this study:* GPU utilisation")
    tables = tables_of(
        tmp_path, [make_record(mode="ddp", gpus=2, backend="nccl", device="cuda", util=make_util(2, [60.0, 58.0]))]
    )
    assert "GPU 0 60 %, GPU 1 58 % busy on average" in findings.utilisation(tables)


def changed(tables: dict[str, pd.DataFrame], name: str, where, **values) -> dict[str, pd.DataFrame]:
    """`tables` with the columns `values` of table `name` set to other numbers where `where(table)`."""
    table = tables[name].copy()
    rows = where(table)
    for column, value in values.items():
        table.loc[rows, column] = value
    return {**tables, name: table}


def test_findings_phrase_the_numbers_of_the_tables(repeats, tmp_path):
    """Every number a finding states is a column: change the column and the sentence follows."""
    every = lambda t: t.index == t.index  # noqa: E731
    text = findings.speedup(changed(repeats, "summary", every, faster=3, noisier=0, multi_settings=5))
    assert "Of 5 multi-device settings: 3 faster than one device, judged by" in text
    noisy = lambda t: t["verdict"] == "noisier"  # noqa: E731
    text = findings.speedup(changed(repeats, "settings", noisy, noise_max_cv=0.5, effect=0.25))
    assert "the noise (50 %) is larger than the effect (25 %)" in text
    text = findings.noise(
        changed(
            repeats,
            "summary",
            every,
            noise_floor_median_cv=0.33,
            noise_floor_max_cv=0.44,
            other_load_max=0.4,
            busy_cells=2,
            finished_cells=9,
            busy_other_load_max=1.5,
        )
    )
    assert text.startswith(
        "Noise of one device: the single-device throughput varies by a median CV of 33.0 % between repeats "
        "(largest 44.0 %). This machine's floor: not measured (`bench.floor`, two or more repeats), too few "
        "for a CV. **2 runs of 9 shared the machine** with other processes (more than 0.25 "
        "cores on average while training, up to 1.50)"
    )
    floor = dict(floor_runs=3, floor_compute_cv=0.009, floor_memory_cv=0.014, floor_dispatch_cv=0.011, floor_cv=0.014)
    text = findings.noise(changed(repeats, "summary", every, floor_verdict="above the floor", **floor))
    assert (
        "This machine's floor is 1.4 %: the CV of a reference workload run beside each of the 3 repeat rounds "
        "(matmuls 0.9 %, memory copies 1.4 %, tiny operators 1.1 %; tables/floor.csv). The largest single-device "
        "CV is **more than 2x the floor**: the cells add noise of their own."
    ) in text
    older = {**floor, "floor_dispatch_cv": float("nan")}  # floor runs made before the dispatch part
    text = findings.noise(changed(repeats, "summary", every, floor_verdict="above the floor", **older))
    assert "(matmuls 0.9 %, memory copies 1.4 %; tables/floor.csv)" in text
    text = findings.noise(changed(repeats, "summary", every, floor_verdict="at the floor", **floor))
    assert "The largest single-device CV is within 2x of it: the cells vary about as much as the machine" in text
    high = {**floor, "floor_cv": 0.05}
    text = findings.noise(changed(repeats, "summary", every, floor_verdict="high floor", **high))
    assert (
        "This machine's floor is 5.0 %" in text
        and "The largest single-device CV is **on a high floor** (3.0 % or more): this machine varies" in text
    )
    text = findings.noise(changed(repeats, "summary", every, floor_verdict="below the floor", **high))
    assert "The largest single-device CV is **below it**: the reference workload varied more than the cells" in text
    first = lambda t: t.index == t.index[0]  # noqa: E731
    text = findings.accuracy(changed(repeats, "comparisons", first, value=0.123))
    assert text.startswith("Final test accuracy differed by at most 12.3 points")
    text = findings.data_wait(changed(repeats, "data_wait", lambda t: t["by"] == "loader", share=0.345))
    assert text.startswith("Waiting for data took 34 % of the training time with loader device")
    text = findings.memory(changed(repeats, "memory", every, imbalance=1.5))
    assert "the fullest device peaked at 1.50x the memory of the emptiest" in text
    model = tables_of(
        tmp_path,
        [
            make_record(mode="single", samples_per_s=1000.0),
            make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1500.0),
        ],
    )
    text = findings.why_not_n(changed(model, "scaling_settings", every, largest_s=0.5))
    assert "**waiting for data** (500 ms of a" in text


def test_nodes_and_backends_phrase_their_comparisons(tmp_path):
    nodes = tables_of(
        tmp_path / "nodes",
        [
            make_record(mode="single", samples_per_s=1000.0),
            make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1800.0),
            make_record(mode="ddp", gpus=1, nodes=2, backend="gloo", samples_per_s=1200.0),
        ],
    )
    pair = nodes["comparisons"].query("kind == 'nodes'")
    assert pair["value"].item() == pytest.approx(1200 / 1800)
    assert "(0.42x the one-node throughput)" in findings.speedup(
        changed(nodes, "comparisons", lambda t: t["kind"] == "nodes", value=0.42)
    )
    both = tables_of(
        tmp_path / "both",
        [
            make_record(mode="ddp", gpus=2, backend=b, samples_per_s=sps, device="cuda")
            for b, sps in (("nccl", 1700.0), ("gloo", 1300.0))
        ],
    )
    pair = both["comparisons"].query("kind == 'backend'")
    assert pair["value"].item() == pytest.approx(1700 / 1300) and pair["claim"].item() == 0
    backend = lambda t: t["kind"] == "backend"  # noqa: E731
    text = findings.backends(changed(both, "comparisons", backend, value=2.5, claim=-1, repeats=3))
    assert "NCCL reached 2.50x the throughput of Gloo (1,700 vs 1,300 samples/s): Gloo faster beyond noise." in text


def test_accuracy_ties_name_two_settings(tmp_path):
    """All modes equally accurate: the largest gap is 0 between two settings, not one setting and itself."""
    tables = tables_of(tmp_path, [make_record(mode="single"), make_record(mode="ddp", gpus=2, backend="gloo")])
    assert findings.accuracy(tables).startswith(
        "Final test accuracy differed by at most 0.0 points across modes at equal settings (largest gap: "
        "synthetic/lenet at batch 64, DDP (gloo) on 2 devices 90.0 % vs one device 90.0 %)."
    )


def test_utilisation_phrases_the_means(tmp_path):
    tables = tables_of(
        tmp_path, [make_record(mode="ddp", gpus=2, backend="nccl", device="cuda", util=make_util(2, [60.0, 58.0]))]
    )
    text = findings.utilisation(changed(tables, "util_means", lambda t: t["device"] == 1, gpu_util=71.0))
    assert "GPU 0 60 %, GPU 1 71 % busy on average" in text


def test_stale_and_unfinished_cells(grid):
    text = inventory.stale(grid["cells"], "results/tables/stale.txt")
    assert "1 cell was made with older training code" in text and "synthetic-lenet-single-g1-b256-none" in text
    assert "snakemake --cores 1 --resources gpu=2 --forcerun $(cat results/tables/stale.txt)" in text
    fresh = grid["cells"].assign(stale=False)
    assert inventory.stale(fresh, "x") == "Every cell was made with the current training code."
    assert inventory.not_run(grid["cells"]).splitlines() == [
        f"- 1 cell oom: {OOM_REASON} (`synthetic-lenet-ddp-g2-b1024-gloo`)",
        f"- 1 cell skipped: {DP_REASON} (`synthetic-lenet-dp-g2-b64-none`)",
        f"- 1 cell skipped: {NCCL_REASON} (`synthetic-lenet-ddp-g2-b64-nccl`)",
    ]


def test_many_cells_skipped_for_one_reason_are_one_line(tmp_path):
    cells = tables_of(
        tmp_path,
        [
            make_record("skipped", mode="dp", gpus=2, batch=b, reason=DP_REASON)
            for b in (8, 16, 32, 64, 128, 256, 512, 1024)
        ],
    )["cells"]
    assert inventory.not_run(cells) == (
        f"- 8 cells skipped: {DP_REASON} (`synthetic-lenet-dp-g2-b1024-none`, "
        "`synthetic-lenet-dp-g2-b128-none`, `synthetic-lenet-dp-g2-b16-none`, "
        "`synthetic-lenet-dp-g2-b256-none`, `synthetic-lenet-dp-g2-b32-none`, "
        "`synthetic-lenet-dp-g2-b512-none` and 2 more)"
    )


def test_cell_listing_rounds_for_people(grid):
    listing = inventory.cell_listing(grid["cells"])
    assert all(f"`{cell}`" in listing for cell in grid["cells"].query("status == 'ok'")["cell"])
    assert "| `synthetic-lenet-ddp-g2-b256-gloo` | 3,400 | 1.70x | 85 % | 87.2 % | 1.76 s | 7.53 s |  |" in listing


def test_every_finding_when_no_cell_finished(tmp_path):
    """Read back from CSV, as the notebook does: every question says why it has no answer."""
    tables = tables_of(tmp_path, [r for r in small_grid() if r["status"] != "ok"])
    tablefiles.write_tables(tables, tmp_path / "tables")
    tables = tablefiles.read_tables(tmp_path / "tables")
    answers = [
        findings.speedup(tables),
        findings.why_not_n(tables),
        findings.accuracy(tables),
        findings.data_wait(tables),
        findings.backends(tables),
        findings.utilisation(tables),
        findings.strategies(tables),
        findings.kernels(None),
        findings.comm(None),
    ]
    assert all(a.startswith("*Not measured in this study:*") for a in answers)
    assert f"no multi-device cell finished ({DP_REASON}; {NCCL_REASON}; {OOM_REASON})" in answers[0]
    # DP and DDP's imbalance, the split across devices and the prediction against it
    assert findings.memory(tables).count("*Not measured in this study:*") == 4


# ---- the notebook, executed by papermill and converted to HTML --------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory, python3_kernel) -> Path:
    root = tmp_path_factory.mktemp("study")
    tables = tables_of(root, small_grid())
    tablefiles.write_tables(tables, root / "tables")
    (root / "figures").mkdir()
    for name in ("throughput.png", "scaling.png"):  # test_plots draws them all; two keep this quick
        plots.FIGURES[name](tables).savefig(root / "figures" / name)
    (root / "bench").mkdir()
    (root / "bench" / "comm.csv").write_text(
        "collective,backend,device,world_size,bytes,size,dtype,iters,median_s,algbw_gbps,busbw_gbps,reason\n"
        "all_gather,gloo,cpu,2,1048576,1 MiB,float32,10,0.00273,0.384,0.192,\n"
        "all_gather,nccl,cuda,2,1048576,1 MiB,float32,,,,,no CUDA device\n"
        "all_reduce,gloo,cpu,2,1048576,1 MiB,float32,10,0.00168,0.625,0.625,\n"
        "all_reduce,nccl,cuda,2,1048576,1 MiB,float32,,,,,no CUDA device\n"
    )
    (root / "study.yaml").write_text(f"study: {STUDY}\n")
    run_report(root, STUDY)
    return root / "report"


def test_report_html_answers_from_the_data(report):
    html = (report / "report.html").read_text()
    assert STUDY in html
    assert "DDP (gloo) on 2 devices at batch 256: 1.70x one device's throughput, 85 % efficiency" in html
    assert html.count("data:image/png;base64,") >= 2
    assert "Figure <code>memory.png</code> was not rendered" in html
    for reason in (DP_REASON, NCCL_REASON, "OutOfMemoryError"):
        assert reason in html
    assert "--forcerun $(cat tables/stale.txt)" in html
    assert "gloo on cpu, 2 ranks: bus GB/s" in html and "1.68 ms" in html  # the optional comm table, pivoted
    assert "2.73 ms" not in html  # ... of all_reduce only: the all_gather row is comm.csv's and comm.png's
    assert "1 combination not run: no CUDA device (nccl on cuda)" in html
    assert "kernels.csv" in html  # ... and the honest note for the missing kernel results
    assert "findings.speedup" not in html  # code inputs are hidden


def test_the_html_renders_offline_in_chromium_with_every_figure(report):
    page = open_offline(report / "report.html")
    assert page["blocked"] == []  # no script or style from the network
    assert len(page["images"]) == 2 and all(done and width > 100 for done, width in page["images"])
    assert "Why not n times: the model" in page["text"] and "Every cell" in page["text"]


def test_report_notebook_is_executed_with_parameters(report):
    notebook = json.loads((report / "report.ipynb").read_text())
    injected = [c for c in notebook["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and f'study = "{STUDY}"' in "".join(injected[0]["source"])
    assert sorted(p.name for p in report.iterdir()) == ["report.html", "report.ipynb"]


def test_template_is_stripped_and_parameterised():
    notebook = json.loads((REPO / "notebooks" / "report.ipynb").read_text())
    assert all(
        not c.get("outputs") and not c.get("execution_count") for c in notebook["cells"] if c["cell_type"] == "code"
    )
    tagged = [c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1
    source = "".join(tagged[0]["source"])
    assert all(f"{name} =" in source for name in ("study", "config_path", "tables_dir", "figures_dir", "bench_dir"))


# ---- a study's real size: every varied key named, long lists summarised -------------------------


@pytest.fixture(scope="module")
def many_lrs(tmp_path_factory) -> dict[str, pd.DataFrame]:
    """15 learning rates x (one device, DDP on 2), 2 repeats each: settings that differ only in lr."""
    records = []
    for i in range(15):
        lr = round(0.001 * (i + 1), 3)
        records += repeated("single", [1000.0, 1010.0], lr=lr)
        records += repeated("ddp", [1000.0 + 100 * i, 1020.0 + 100 * i], gpus=2, backend="gloo", lr=lr)
    return tables_of(
        tmp_path_factory.mktemp("many"), [dict(r, cell=f"{r['cell']}-lr{r['spec']['lr']}") for r in records]
    )


def test_sentences_name_every_key_the_study_varies(many_lrs):
    text = findings.speedup(many_lrs)
    # lr varies, so it is named; 15 settings are more than a list: the best and worst six
    # sqrt(2400 x 2420) / sqrt(1000 x 1010)
    assert "synthetic/lenet, DDP (gloo) on 2 devices at batch 64, lr 0.015: 2.40x [2.33-2.47]" in text
    assert "synthetic/lenet, DDP (gloo) on 2 devices at batch 64, lr 0.001: 1.00x" in text
    bullets = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(bullets) == 12 and len(set(bullets)) == 12
    assert "The other 3 settings: in the overview above and in `results/tables/settings.csv`." in text
    model = findings.accuracy(many_lrs)
    assert "at batch 64, lr 0.001:" in model and "... 3 more groups" in model


def test_cell_listing_is_capped_with_a_pointer_to_the_csv(many_lrs):
    listing = inventory.cell_listing(many_lrs["cells"])
    assert listing.count("\n| `synthetic-lenet") == 40
    assert "... and 20 more finished cells: `results/tables/cells.csv` has every cell." in listing


def test_records_collect_could_not_read_are_listed_with_how_to_rerun_them(tmp_path):
    listing = tmp_path / "unreadable.txt"
    listing.write_text("")
    assert inventory.unreadable(str(listing)) == "" and inventory.unreadable(str(tmp_path / "none.txt")) == ""
    lines = [
        "results/cells/a/record.json: not a valid record: Expecting value: line 1 column 1 (char 0); "
        "rerun exactly that cell with `snakemake --cores 1 --forcerun results/cells/a/record.json`",
        "results/cells/b/record.json: not a valid record: 'done' is not one of ['ok']; rerun ...",
    ]
    listing.write_text("\n".join(lines) + "\n")
    shown = inventory.unreadable(str(listing))
    assert shown.startswith("**2 records could not be read** and are left out of every table and figure")
    assert shown.count("\n- ") == 2 and "results/cells/a/record.json" in shown and "--forcerun" in shown
    listing.write_text(lines[0] + "\n")
    assert inventory.unreadable(str(listing)).startswith("**1 record could not be read** and is left out")


def test_the_traced_step_stands_beside_the_step_models_breakdown(tmp_path):
    tables = tables_of(tmp_path, ddp_pair())
    cells = tables["cells"].copy()
    ddp = cells["mode"] == "ddp"
    traced = {"trace_step_s": 0.0512, "trace_compute_s": 0.030, "trace_exposed_comm_s": 0.012}
    traced.update(
        trace_data_wait_s=0.002, trace_idle_s=0.0072, trace_overlap=0.4, trace_files="cells/x/trace/rank0.json.gz"
    )
    for column, value in traced.items():
        cells.loc[ddp, column] = value
    text = findings.traces({**tables, "cells": cells})
    # the model (see test_the_model_names_the_largest_loss): 42.7 ms = 30.5 compute (one device's 31.4 ms, its
    # host share -0.827 ms) + 10.0 exposed (the probe's, on a CPU) + 2.13 data; the traced step ran 20 % longer
    assert "| 30.5 + 10.0 + 2.13 = 42.7 | +20 % |" in text
    assert "| 51.2 | 30.0 | 12.0 (10.0) | 2.00 | 7.20 | 40 % |" in text
