"""The report: findings' sentences from tables with known numbers, and the notebook run for real."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from jupyter_client.kernelspec import KernelSpecManager

from dpstudy import collect, findings, plots
from records import (CURRENT, DP_REASON, NCCL_REASON, OOM_REASON, make_record, make_util, small_grid,
                     write_records)

REPO = Path(__file__).resolve().parent.parent
STUDY = "report_test_study"


def tables_of(directory: Path, records: list[dict]) -> dict[str, pd.DataFrame]:
    return collect.collect(write_records(directory, records), CURRENT)


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict[str, pd.DataFrame]:
    return tables_of(tmp_path_factory.mktemp("grid"), small_grid())


# ---- findings ---------------------------------------------------------------------------------

def test_environment_names_versions_and_hardware(tmp_path):
    gpu = [make_record(mode="ddp", gpus=2, batch=128, backend="nccl", device="cuda")]
    text = findings.environment(tables_of(tmp_path, small_grid() + gpu)["cells"], STUDY)
    for expected in (STUDY, "8 cells (5 ok, 2 skipped, 1 oom)", "PyTorch** 2.14.1", "Test CPU 9000",
                     "GPUs: 8 x Fake GPU", "world sizes 1, 2", "cpu, cuda"):
        assert expected in text


def test_speedup_sentences(grid):
    text = findings.speedup(grid["cells"], grid["epochs"])
    assert "DDP (gloo) on 2 devices was 1.50x faster than one device at batch 64, 75 % efficiency." in text
    assert "DDP (gloo) on 2 devices was 1.70x faster than one device at batch 256, 85 % efficiency." in text
    assert "2 of 2 multi-device settings beat one device" in text
    # wait share: (0.05 * 4 s + 0.05 * 1.76 s) / 5.76 s on two devices; 2 % on one device
    assert "Waiting for data took 5 % of the training time on several devices vs 2 % on one device." in text
    assert "3.0 s per multi-device cell vs 3.0 s on one device" in text


def test_speedup_slower_and_not_measured(tmp_path):
    slower = tables_of(tmp_path / "a", [make_record(mode="single", samples_per_s=1000.0),
                                        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=600.0)])
    assert ("was slower than one device at batch 64: 0.60x its throughput, 30 % efficiency."
            in findings.speedup(slower["cells"], slower["epochs"]))
    superlinear = tables_of(tmp_path / "c", [make_record(mode="single", samples_per_s=1000.0),
                                             make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=2500.0)])
    assert "2.50x faster than one device at batch 64, 125 % efficiency. Above ideal" in findings.speedup(
        superlinear["cells"], superlinear["epochs"])
    alone = tables_of(tmp_path / "b", [make_record(mode="single"),
                                       make_record("skipped", mode="dp", gpus=2, reason=DP_REASON)])
    text = findings.speedup(alone["cells"], alone["epochs"])
    assert text.startswith("*Not measured in this study:*") and DP_REASON in text


def test_intra_and_inter_node_scaling_at_equal_world_size(tmp_path):
    tables = tables_of(tmp_path, [
        make_record(mode="single", samples_per_s=1000.0),
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1800.0),
        make_record(mode="ddp", gpus=1, nodes=2, backend="gloo", samples_per_s=1200.0),
    ])
    text = findings.speedup(tables["cells"], tables["epochs"])
    assert "DDP (gloo) on 2 nodes x 1 devices was 1.20x faster than one device at batch 64, 60 % efficiency." in text
    assert ("Intra- vs inter-node scaling (same world size):\n- synthetic/lenet at batch 64: 2 devices on one node "
            "reached 90 % efficiency, spread over 2 nodes 60 % (0.67x the one-node throughput).") in text
    assert "**Jobs** 2 cells local; 1 cell as SLURM jobs (ids 7) on nodes n1, n2" in findings.environment(tables["cells"], "s")


def test_accuracy_gap_between_modes(grid):
    text = findings.accuracy(grid["cells"])
    assert "differed by at most 0.8 points across modes" in text
    assert "at batch 256: one device 88.0 % vs DDP (gloo) on 2 devices 87.2 %" in text


def test_data_wait_by_loader(tmp_path):
    tables = tables_of(tmp_path, [
        make_record(mode="single", loader="torch", workers=0, wait_frac=0.12),
        make_record(mode="ddp", gpus=2, backend="gloo", loader="device", wait_frac=0.01),
    ])
    text = findings.data_wait(tables["epochs"], tables["cells"])
    assert "Waiting for data took 12 % of the training time with loader torch/0 workers vs 1 % with loader device." in text
    assert "By mode: DDP (gloo) on 2 devices 1 %, one device 12 %." in text


def test_backends_compared_or_explained(grid, tmp_path):
    text = findings.backends(grid["cells"])
    assert "*Not measured in this study:*" in text and NCCL_REASON in text
    both = tables_of(tmp_path, [make_record(mode="ddp", gpus=2, backend=b, samples_per_s=sps, device="cuda")
                                for b, sps in (("nccl", 1700.0), ("gloo", 1300.0))])
    text = findings.backends(both["cells"], comm=pd.DataFrame({"bytes": [1024], "gbps": [3.2]}))
    assert "on 2 devices at batch 64: NCCL reached 1.31x the throughput of Gloo (1700 vs 1300 samples/s)." in text
    assert "all-reduce microbenchmark below" in text


def test_memory_imbalance(grid, tmp_path):
    text = findings.memory(grid["cells"])
    assert "- DP: *Not measured in this study:* no DP cell finished (dp needs CUDA" in text
    assert "DDP (gloo) on 2 devices: the fullest device peaked at 1.01x the memory of the emptiest (120 MB vs 119 MB" in text
    dp = tables_of(tmp_path, [make_record(mode="dp", gpus=2, device="cuda", peak_mem=[300.0, 180.0])])
    assert "DP on 2 devices: the fullest device peaked at 1.67x the memory of the emptiest (300 MB vs 180 MB" in findings.memory(dp["cells"])


def test_utilisation_when_sampled_or_not(grid, tmp_path):
    assert findings.utilisation(grid["util"], grid["cells"]).startswith("*Not measured in this study:* GPU utilisation")
    tables = tables_of(tmp_path, [make_record(mode="ddp", gpus=2, backend="nccl", device="cuda",
                                              util=make_util(2, [60.0, 58.0]))])
    assert "GPU 0 60 %, GPU 1 58 % busy on average" in findings.utilisation(tables["util"], tables["cells"])


def test_stale_and_unfinished_cells(grid):
    text = findings.stale(grid["cells"], "results/tables/stale.txt")
    assert "1 cell was made with older training code" in text and "synthetic-lenet-single-g1-b256-none" in text
    assert "snakemake --cores 1 --resources gpu=2 --forcerun $(cat results/tables/stale.txt)" in text
    fresh = grid["cells"].assign(stale=False)
    assert findings.stale(fresh, "x") == "Every cell was made with the current training code."
    listing = findings.not_run(grid["cells"])
    assert all(reason in listing for reason in (DP_REASON, NCCL_REASON, OOM_REASON))
    assert listing.count("\n") == 2 + 3 - 1  # header, rule, three cells


def test_cell_listing_has_every_cell(grid):
    listing = findings.cell_listing(grid["cells"])
    assert all(cell in listing for cell in grid["cells"]["cell"])
    assert "| synthetic-lenet-ddp-g2-b256-gloo | ok | 3400 | 1.70 | 85% | 87.2% |" in listing


def test_every_finding_when_no_cell_finished(tmp_path):
    """Read back from CSV, as the notebook does: every question says why it has no answer."""
    tables = tables_of(tmp_path, [r for r in small_grid() if r["status"] != "ok"])
    collect.write_tables(tables, tmp_path / "tables")
    tables = collect.read_tables(tmp_path / "tables")
    cells, epochs, util = tables["cells"], tables["epochs"], tables["util"]
    answers = [findings.speedup(cells, epochs), findings.accuracy(cells), findings.data_wait(epochs, cells),
               findings.backends(cells), findings.utilisation(util, cells), findings.kernels(None)]
    assert all(a.startswith("*Not measured in this study:*") for a in answers)
    assert f"no multi-device cell finished ({DP_REASON}; {NCCL_REASON}; {OOM_REASON})" in answers[0]
    assert findings.memory(cells).count("*Not measured in this study:*") == 2


# ---- the notebook, executed by papermill and converted to HTML --------------------------------

@pytest.fixture(scope="module")
def python3_kernel() -> None:
    """The kernel papermill runs; `make setup` installs it, a bare venv may lack it."""
    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"],
                       check=True, capture_output=True)


@pytest.fixture(scope="module")
def report(tmp_path_factory, python3_kernel) -> Path:
    root = tmp_path_factory.mktemp("study")
    tables = collect.collect(write_records(root, small_grid()), CURRENT)
    collect.write_tables(tables, root / "tables")
    (root / "figures").mkdir()
    for name in ("throughput.png", "scaling.png"):  # test_plots draws them all; two keep this quick
        plots.FIGURES[name](tables).savefig(root / "figures" / name)
    (root / "bench").mkdir()
    (root / "bench" / "comm.csv").write_text("backend,bytes,busbw_gbps\ngloo,1048576,1.25\n")
    (root / "study.yaml").write_text(f"study: {STUDY}\n")
    subprocess.run([sys.executable, str(REPO / "scripts" / "report.py"), "--notebook",
                    str(REPO / "notebooks" / "report.ipynb"), "--out-dir", "report", "--study", STUDY,
                    "--config", "study.yaml", "--tables", "tables", "--figures", "figures", "--bench", "bench"],
                   cwd=root, check=True, capture_output=True)
    return root / "report"


def test_report_html_answers_from_the_data(report):
    html = (report / "report.html").read_text()
    assert STUDY in html
    assert "DDP (gloo) on 2 devices was 1.70x faster than one device at batch 256, 85 % efficiency." in html
    assert html.count("data:image/png;base64,") >= 2
    assert "Figure <code>memory.png</code> was not rendered" in html
    for reason in (DP_REASON, NCCL_REASON, "OutOfMemoryError"):
        assert reason in html
    assert "--forcerun $(cat tables/stale.txt)" in html
    assert "busbw_gbps" in html  # the optional comm table
    assert "kernels.csv" in html  # ... and the honest note for the missing kernel results
    assert "findings.speedup" not in html  # code inputs are hidden


def test_report_notebook_is_executed_with_parameters(report):
    notebook = json.loads((report / "report.ipynb").read_text())
    injected = [c for c in notebook["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and f'study = "{STUDY}"' in "".join(injected[0]["source"])
    assert sorted(p.name for p in report.iterdir()) == ["report.html", "report.ipynb"]


def test_template_is_stripped_and_parameterised():
    notebook = json.loads((REPO / "notebooks" / "report.ipynb").read_text())
    assert all(not c.get("outputs") and not c.get("execution_count") for c in notebook["cells"] if c["cell_type"] == "code")
    tagged = [c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1
    source = "".join(tagged[0]["source"])
    assert all(f"{name} =" in source for name in ("study", "config_path", "tables_dir", "figures_dir", "bench_dir"))
