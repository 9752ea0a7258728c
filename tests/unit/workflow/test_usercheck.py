"""The check of a study's own models and data before any job (dpstudy.workflow.usercheck): a real
child process builds each model for its dataset and runs a batch; every problem is one error
naming the sweep, the setting and the cause; a passed check is remembered."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from PIL import Image

from dpstudy.study import sweeps
from dpstudy.util.errors import ConfigError
from dpstudy.workflow import usercheck

NETS = """
from torch import nn


def good(num_classes, in_channels, image_size, width=4):
    pooled = nn.Sequential(nn.Conv2d(in_channels, width, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return nn.Sequential(pooled, nn.Linear(width, num_classes))


def thousand(num_classes, in_channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(1000))  # ignores num_classes


def crashes(num_classes, in_channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(5, num_classes))  # the wrong input size


def wrong_args(classes, channels):
    return nn.Linear(channels, classes)
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("cat", "dog", "fox"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "photos" / name / "a.png")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "nets.py").write_text(textwrap.dedent(NETS))
    return tmp_path


def plan(models: dict[str, str], datasets: dict[str, str] | None = None):
    """A study of one sweep per entry of `models` ({sweep: model}), on `pets` unless `datasets`
    ({sweep: dataset}) says otherwise."""
    config = {
        "code_path": "code",
        "datasets": {"pets": {"path": "photos", "image_size": 12}},
        "sweeps": [
            {
                "name": sweep,
                "dataset": (datasets or {}).get(sweep, "pets"),
                "model": model,
                "grid": {"mode": ["single"]},
            }
            for sweep, model in models.items()
        ],
    }
    study = sweeps.load(config)
    return study, sweeps.expand(study)


def test_every_bad_model_is_one_error_naming_sweep_model_dataset_and_cause(project):
    study, cells = plan(
        {
            "fine": "nets:good",
            "wide": "nets:thousand",
            "broken": "nets:crashes",
            "missing": "no_such_module:make",
            "typo": "torchvision:resnet81",
            "signature": "nets:wrong_args",
            "registry": "lenet",  # on a user dataset: tried too
            "data": "lenet",
        },
        {"data": "no_data:make"},
    )
    with pytest.raises(ConfigError) as raised:
        usercheck.check(study, cells, str(project / "verdict.json"))
    errors = str(raised.value).splitlines()
    assert len(errors) == 6, errors
    assert errors.pop(0) == (
        "sweep 'data': dataset 'no_data:make': cannot import module 'no_data' (looked in code and on the Python "
        "path): ModuleNotFoundError: No module named 'no_data'"
    )
    assert errors[0] == (
        "sweep 'wide': model 'nets:thousand' on dataset 'pets': returned (2, 1000) for a batch (2, 3, 12, 12); "
        "expected (2, 3): one logit per class"
    )
    assert errors[1].startswith(
        "sweep 'broken': model 'nets:crashes' on dataset 'pets': fails on a batch (2, 3, 12, 12): RuntimeError: "
    )
    assert errors[2].startswith(
        "sweep 'missing': model 'no_such_module:make' on dataset 'pets': cannot import module 'no_such_module' "
        "(looked in code and on the Python path): ModuleNotFoundError"
    )
    assert errors[3].startswith("sweep 'typo': model 'torchvision:resnet81' on dataset 'pets': torchvision has no")
    assert errors[4].startswith(
        "sweep 'signature': model 'nets:wrong_args' on dataset 'pets': factory nets:wrong_args(classes, channels) "
        "cannot be called with (num_classes, in_channels, image_size)"
    )
    assert not (project / "verdict.json").exists()  # nothing but a passed check's verdict is written


def test_a_passed_check_is_remembered_until_something_it_read_changes(project, monkeypatch):
    study, cells = plan({"fine": "nets:good", "lib": "torchvision:resnet18"})
    verdict = project / "verdict.json"
    usercheck.check(study, cells, str(verdict))
    assert json.loads(verdict.read_text())["models"] == 2

    def no_child(*args, **kwargs):
        raise AssertionError("the check ran again")

    monkeypatch.setattr(subprocess, "run", no_child)
    usercheck.check(study, cells, str(verdict))  # nothing changed: no child
    (project / "code" / "nets.py").write_text(textwrap.dedent(NETS) + "\n# edited\n")
    with pytest.raises(AssertionError, match="the check ran again"):
        usercheck.check(study, cells, str(verdict))


def test_a_registry_study_starts_no_child(project, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a child for registry models"))
    config = {"sweeps": [{"name": "s", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"]}}]}
    study = sweeps.load(config)
    usercheck.check(study, sweeps.expand(study), str(project / "verdict.json"))
    assert not (project / "verdict.json").exists()


def test_a_text_file_that_is_not_utf8_stops_the_study_naming_the_file_and_byte(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("to be or not to be\n" * 50)
    (corpus / "b.txt").write_bytes(b"fine so far, \xff\xfe then latin-1")
    study = sweeps.load(
        {
            "study": "own_text",
            "data_root": str(tmp_path / "data"),
            "datasets": {"mine": {"source": "text", "path": str(corpus)}},
            "sweeps": [
                {"name": "lm", "dataset": "mine", "model": "gpt", "set": {"seq_len": 16}, "grid": {"mode": ["single"]}}
            ],
        }
    )
    with pytest.raises(ConfigError) as error:
        usercheck.check(study, sweeps.expand(study), str(tmp_path / "verdict.json"))
    assert "sweep 'lm': dataset 'mine'" in str(error.value)
    assert f"{str(corpus / 'b.txt')!r} is not UTF-8 text: byte 13 (0xff)" in str(error.value)
    (corpus / "b.txt").write_text("fine all along")
    usercheck.check(study, sweeps.expand(study), str(tmp_path / "verdict.json"))  # the gpt tried on it too
