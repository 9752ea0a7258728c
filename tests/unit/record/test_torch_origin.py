"""Where a record says its PyTorch came from: "venv" only for the venv `make setup` made, "host" for
any other, a GPU image's own venv included (that H200 run's report said "dpstudy's venv" of
/opt/torch/.venv)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from helpers import REPO

from dpstudy.record import envinfo


def test_the_state_file_is_the_one_make_setup_writes():
    # Read, not imported: importing the set-up package here pulls in pip's vendored modules, after
    # which torch.utils.cpp_extension's setuptools cannot load in this worker.
    tree = ast.parse((REPO / "scripts/dpstudy_setup/venv.py").read_text())
    (value,) = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["STATE_FILE"]
    ]
    assert envinfo.SETUP_STATE_FILE == value


def test_a_venv_that_holds_torch_without_dpstudy_s_state_file_is_the_host_s(monkeypatch):
    torch_dir = envinfo._torch_package()
    site = torch_dir.parent
    # A stand-in for a GPU image's /opt/torch/.venv: torch inside the prefix, no state file.
    monkeypatch.setattr(envinfo, "SETUP_STATE_FILE", "no-such-file.json")
    seen = envinfo.torch_origin(prefix=sys.prefix)
    assert seen == {"torch_path": str(site), "torch_provider": "host"}


def test_dpstudy_s_venv_holding_torch_is_the_venv():
    prefix = Path(sys.prefix)
    if not (prefix / envinfo.SETUP_STATE_FILE).is_file() or not envinfo._torch_package().is_relative_to(prefix):
        pytest.skip("needs the venv `make setup` made with its own PyTorch (make test's)")
    assert envinfo.torch_origin(prefix=str(prefix))["torch_provider"] == "venv"


def test_torch_outside_the_venv_is_the_host_s(tmp_path):
    (tmp_path / envinfo.SETUP_STATE_FILE).write_text("{}")  # dpstudy's venv, but torch lies elsewhere
    assert envinfo.torch_origin(prefix=str(tmp_path))["torch_provider"] == "host"
