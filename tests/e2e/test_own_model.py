"""Your own model and data (issue 17), through the real workflow: examples/own_model's study (a
torchvision model, a timm model and the example's factory, one device and DDP over Gloo, on an
image folder its script makes) runs to the report; editing the factory flags its cells as stale
and reruns none; adding images prepares the folder anew and reruns its cells; a factory that
cannot be imported stops the workflow before any job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers.workflow import copy_checkout, planned, snakemake

STUDY = "examples/own_model/study.yaml"
MODELS = {"torchvision_resnet18", "timm_convnext_atto"}


def example(checkout: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return snakemake(checkout, "--configfile", STUDY, *args, check=check)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """The example run to its report in a private checkout, as `make example` runs it."""
    checkout = copy_checkout(tmp_path_factory.mktemp("own_model"))
    subprocess.run([sys.executable, "examples/own_model/make_images.py"], cwd=checkout, check=True)
    example(checkout, "--cores", "2", "--resources", "gpu=2")
    return checkout


def cells_table(checkout: Path) -> pd.DataFrame:
    return pd.read_csv(checkout / "results" / "tables" / "cells.csv")


@pytest.mark.slow
def test_the_example_runs_every_kind_of_model_on_its_image_folder_to_the_report(finished):
    cells = cells_table(finished)
    assert len(cells) == 6 and (cells["status"] == "ok").all(), cells[["cell", "status", "reason"]]
    tokens = {cell.split("-")[1] for cell in cells["cell"]}
    factory = next(t for t in tokens if t.startswith("tiny_cnn_"))
    assert tokens == MODELS | {factory} and len(factory) == len("tiny_cnn_") + 6
    assert set(cells["dataset"]) == {"shapes"} and set(cells["model"]) == {
        "torchvision:resnet18",
        "timm:convnext_atto",
        "own_models:tiny_cnn",
    }
    # DDP over Gloo on 2 processes for each kind of model, with its speedup against one device
    ddp = cells[cells["mode"] == "ddp"]
    assert len(ddp) == 3 and set(ddp["backend"]) == {"gloo"} and (ddp["world_size"] == 2).all()
    assert ddp["speedup"].notna().all()
    meta = json.loads((finished / "results" / "data" / "shapes" / "meta.json").read_text())
    assert meta["classes"] == ["blob", "circle", "stripes"] and meta["shape"] == [3, 32, 32]
    assert meta["splits"]["train"]["n"] + meta["splits"]["test"]["n"] == 144
    # the factory's model_args reached it: 16 filters, then 32
    factory_cell = cells[cells["model"] == "own_models:tiny_cnn"].iloc[0]
    assert json.loads(factory_cell["model_args"]) == {"width": 16}
    plan = pd.read_csv(finished / "results" / "plan" / "memory.csv")
    assert plan["peak_mb"].notna().all() and plan["reason"].isna().all()  # every model predicted
    html = (finished / "results" / "report" / "report.html").read_text()
    assert "timm:convnext_atto" in html and "own_models:tiny_cnn" in html


@pytest.mark.slow
def test_editing_the_factory_flags_its_cells_and_reruns_none(finished):
    factory = finished / "examples" / "own_model" / "own_models.py"
    original = factory.read_text()
    factory.write_text(original + "\n# a change of the user's model code\n")
    try:
        jobs = planned(example(finished, "-n"))
        assert "train" not in jobs and "collect" in jobs
        example(finished, "--cores", "2", "results/tables/cells.csv")
        cells = cells_table(finished)
        stale = dict(zip(cells["model"], cells["stale"]))
        assert stale == {"torchvision:resnet18": False, "timm:convnext_atto": False, "own_models:tiny_cnn": True}
        listed = (finished / "results" / "tables" / "stale.txt").read_text().split()
        assert sorted(listed) == sorted(cells.loc[cells["stale"], "record"])
    finally:
        factory.write_text(original)


@pytest.mark.slow
def test_adding_images_prepares_the_folder_anew_and_reruns_its_cells(finished, tmp_path):
    images = finished / "examples" / "own_model" / "images"
    shutil.copy(next((images / "blob").iterdir()), images / "blob" / "added.png")
    try:
        jobs = planned(example(finished, "-n"))
        assert jobs.get("prepare_data") == [""] and len(jobs.get("train", [])) == 6
    finally:
        (images / "blob" / "added.png").unlink()
    assert "train" not in planned(example(finished, "-n"))  # as before: nothing to redo


@pytest.mark.slow
def test_a_factory_that_cannot_be_imported_stops_the_workflow_before_any_job(finished):
    study = finished / "examples" / "own_model" / "broken.yaml"
    config = (finished / STUDY).read_text().replace("own_models:tiny_cnn", "own_modles:tiny_cnn")
    study.write_text(config)
    proc = snakemake(finished, "--configfile", str(study.relative_to(finished)), "-n", check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "invalid study config" in output
    assert (
        "sweeps 'mine_one', 'mine_ddp': model 'own_modles:tiny_cnn' with model_args {'width': 16} on dataset "
        "'shapes': cannot import module 'own_modles' (looked in examples/own_model and on the Python path): "
        "ModuleNotFoundError: No module named 'own_modles'" in output
    ), output[-3000:]
    assert not planned(proc)
