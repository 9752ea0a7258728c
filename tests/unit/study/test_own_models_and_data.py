"""A study that names its own models and data (issue 17): the cells, their ids, and the errors a
bad name or setting gives when the study loads, before any job."""

from __future__ import annotations

import copy

import pytest
from PIL import Image

from dpstudy.study import sweeps
from dpstudy.util import refs
from dpstudy.util.errors import ConfigError


@pytest.fixture
def photos(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # paths in a study start where Snakemake runs
    for name in ("cat", "dog"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "photos" / name / "a.png")
    (tmp_path / "studies").mkdir()
    return tmp_path


def study(**changes):
    config = {
        "study": "own",
        "datasets": {"pets": {"source": "imagefolder", "path": "photos", "image_size": 16}},
        "sweeps": [
            {"name": "lib", "dataset": "pets", "model": "torchvision:resnet18", "grid": {"mode": ["single"]}},
            {
                "name": "mine",
                "dataset": "pets",
                "model": "nets:tiny",
                "grid": {"mode": ["single"], "model_args": [{"width": 8}, {"width": 16, "depth": 2}]},
            },
            {"name": "made", "dataset": "my_data:make", "model": "lenet", "grid": {"mode": ["single"]}},
        ],
    }
    for key, value in changes.items():
        config[key] = value
    return config


def cells(config, files=("studies/own.yaml",)):
    loaded = sweeps.load(config, list(files))
    return loaded, {c.id: c for c in sweeps.expand(loaded)}


def test_ids_spell_library_models_factories_and_model_args(photos):
    loaded, by_id = cells(study())
    factory = refs.token("nets:tiny")
    data = refs.token("my_data:make")
    assert set(by_id) == {
        "pets-torchvision_resnet18-single-g1-b64-none",
        f"pets-{factory}-single-g1-b64-none-model_argswidth8",
        f"pets-{factory}-single-g1-b64-none-model_argsdepth2_width16",
        f"{data}-lenet-single-g1-b64-none",
    }
    assert loaded["code_path"] == "studies"  # the study file's folder
    mine = by_id[f"pets-{factory}-single-g1-b64-none-model_argswidth8"]
    assert mine.spec["code_path"] == "studies" and mine.spec["model_args"] == {"width": 8}
    lib = by_id["pets-torchvision_resnet18-single-g1-b64-none"]
    assert lib.spec["code_path"] is None and lib.spec["model_args"] == {}
    # the train rule's params leave out what holds nothing: cells made before these keys keep theirs
    assert "code_path" not in lib.params() and "model_args" not in lib.params()
    assert mine.params()["model_args"] == {"width": 8}


def test_an_explicit_code_path_wins(photos):
    loaded, _ = cells(study(code_path="elsewhere"))
    assert loaded["code_path"] == "elsewhere"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda c: c["sweeps"][0].update(dataset="petz"),
            "sweep 'lib': dataset 'petz' is not one of the registry's .* not declared under datasets",
        ),
        (
            lambda c: c["datasets"].update(mnist={"path": "photos"}),
            "datasets.mnist: 'path' applies to a dataset of your own, not to the registry's 'mnist'",
        ),
        (
            lambda c: c["datasets"]["pets"].update(train_size=10),
            "datasets.pets: 'train_size' applies to the registry's datasets only",
        ),
        (
            lambda c: c["datasets"]["pets"].update(path="no/such/folder"),
            "^sweeps 'lib', 'mine': datasets.pets: path: 'no/such/folder' does not exist",
        ),
        (
            lambda c: c["sweeps"][2].update(set={"model_args": {"width": 2}}),
            "sweep 'made': model 'lenet' takes no model_args 'width': it accepts none",
        ),
        (lambda c: c["sweeps"][0].update(model="torchvision:res net"), "sweep 'lib'"),
        (lambda c: c["datasets"]["pets"].update(image_size=2), "datasets.pets"),
    ],
)
def test_bad_names_and_settings_fail_when_the_study_loads(photos, change, message):
    config = copy.deepcopy(study())
    change(config)
    with pytest.raises(ConfigError, match=message):
        cells(config)
