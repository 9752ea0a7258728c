"""make setup: the lock, the host's PyTorch (TORCH=system) and offline installs (WHEELS=...)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
from helpers import REPO, left_in_tmpdir
from helpers.workflow import copy_checkout
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version


def script(name: str):
    """A module of scripts/ (they are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock_requirements = script("lock_requirements")
# scripts/setup_venv.py's package, importable as `python3 scripts/setup_venv.py` imports it (appended:
# it shadows nothing).
sys.path.append(str(REPO / "scripts"))
from dpstudy_setup import LOCK, TORCH_LOCK, SetupError, hosttorch, installer, versions  # noqa: E402
from dpstudy_setup.venv import STATE_FILE  # noqa: E402

RANGES = versions.declared_ranges()
BASE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"


# ---- versions and ranges ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, release",
    [
        ("2.14.1", (2, 14, 1)),
        ("2.11.0+cu130", (2, 11, 0)),
        ("2.7.0a0+79aa17489c.nv25.04", (2, 7, 0)),
        ("0.22.0a0", (0, 22, 0)),
        ("3", (3,)),
    ],
)
def test_release_drops_pre_release_and_local_labels(version, release):
    assert versions.release(version) == release


@pytest.mark.parametrize("version", ["2.5.1", "2.6.0", "2.6.3", "2.11.0", "2.14.1", "2.99", "3.0.0", "3.1"])
def test_range_check_agrees_with_packaging_on_releases(version):
    assert versions.satisfies(version, RANGES["torch"]) == (Version(version) in SpecifierSet(RANGES["torch"]))


def test_vendor_builds_count_as_the_release_they_precede():
    # NVIDIA's containers label torch as a pre-release of the version whose API it carries
    assert versions.satisfies("2.6.0a0+ecf3bae40a.nv25.01", RANGES["torch"])
    assert not versions.satisfies("2.5.0a0+nv24.08", RANGES["torch"])


def test_declared_ranges_are_pyproject_s():
    assert RANGES == {"torch": ">=2.6,<3", "torchvision": ">=0.21,<1"}


def test_versions_work_on_a_python_without_pip_or_packaging():
    # make setup runs with the system's python3, which may have neither (Debian's without
    # python3-pip): packaging then comes from the pip wheel that `python -m venv` installs.
    code = (
        f"import importlib.util, json, sys; sys.path.insert(0, {str(REPO / 'scripts')!r}); "
        "found = [m for m in ('pip', 'packaging') if importlib.util.find_spec(m)]; "
        "from dpstudy_setup import versions; "
        "print(json.dumps([found, versions.Version.__module__, "
        "versions.satisfies('2.7.0a0+79aa17489c.nv25.04', '>=2.6,<3'), versions.declared_ranges()]))"
    )
    # -I -S: no site-packages, where pip and packaging are installed
    proc = subprocess.run([str(BASE_PYTHON), "-I", "-S", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    found, module, satisfied, ranges = json.loads(proc.stdout)
    assert satisfied and ranges == RANGES
    if found:
        pytest.skip(f"{BASE_PYTHON} imports {found} without site-packages: the fallback is not needed there")
    assert module == "pip._vendor.packaging.version"


# ---- the host's PyTorch -------------------------------------------------------------------------

GOOD = {
    "python": "/opt/torch/bin/python3",
    "torch": "2.11.0+cu130",
    "torch_path": "/opt/torch/site-packages",
    "cuda": "13.0",
    "gpus": 1,
    "torchvision": "0.26.0+cu130",
    "torchvision_requires": ["torch==2.11.0"],
}


@pytest.mark.parametrize(
    "found, problem",
    [
        (
            {"python": "/usr/bin/python3", "torch_error": "ModuleNotFoundError: No module named 'torch'"},
            "/usr/bin/python3 cannot import torch (ModuleNotFoundError: No module named 'torch')",
        ),
        (
            {**GOOD, "torch": "2.5.1", "torchvision": "0.21.0", "torchvision_requires": ["torch==2.6.0"]},
            "torch 2.5.1 (in /opt/torch/site-packages) is outside dpstudy's supported range torch>=2.6,<3",
        ),
        (
            {**GOOD, "torchvision": None, "torchvision_error": "ModuleNotFoundError: No module named 'torchvision'"},
            "torchvision is not importable beside torch 2.11.0+cu130 (ModuleNotFoundError",
        ),
        (
            {**GOOD, "torchvision": "0.25.0", "torchvision_requires": ["torch==2.10.0"]},
            "torchvision 0.25.0 was built for torch 2.10.0, but the host's torch is 2.11.0+cu130",
        ),
        # no declared pin (a vendor build): the release pairing 0.(n+15) <-> 2.n decides
        (
            {**GOOD, "torchvision": "0.24.0a0+nv", "torchvision_requires": []},
            "torchvision 0.24.0a0+nv was built for torch 2.9, but the host's torch is 2.11.0+cu130",
        ),
        (
            {**GOOD, "torchvision_error": "RuntimeError: operator torchvision::nms does not exist"},
            "torchvision 0.26.0+cu130 does not work with torch 2.11.0+cu130: RuntimeError: operator torchvision::nms",
        ),
    ],
)
def test_host_torch_refused_with_the_reason(found, problem):
    found = {key: value for key, value in found.items() if value is not None}
    problems = hosttorch.host_torch_problems(found, RANGES)
    assert problems[0].startswith(problem), problems


def test_every_problem_is_named():
    found = {**GOOD, "torch": "2.5.1", "torchvision": "0.20.1", "torchvision_requires": ["torch==2.5.1"]}
    assert hosttorch.host_torch_problems(found, RANGES) == [
        "torch 2.5.1 (in /opt/torch/site-packages) is outside dpstudy's supported range torch>=2.6,<3 (pyproject.toml)",
        "torchvision 0.20.1 is outside dpstudy's supported range torchvision>=0.21,<1",
    ]


@pytest.mark.parametrize(
    "found",
    [
        GOOD,
        {**GOOD, "torch": "2.7.0a0+79aa17489c.nv25.04", "torchvision": "0.22.0a0+9eb57cd5", "torchvision_requires": []},
    ],
)
def test_host_torch_accepted(found):
    assert hosttorch.host_torch_problems(found, RANGES) == []


def test_a_python_without_torch_is_refused_before_the_venv_is_touched(tmp_path):
    venv = tmp_path / ".venv"
    venv.mkdir()
    (venv / "keep").write_text("an earlier venv")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/setup_venv.py"),
            "setup",
            "--venv",
            str(venv),
            "--torch",
            "system",
            "--python",
            str(BASE_PYTHON),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert f"TORCH=system cannot use this PyTorch:\n  - {BASE_PYTHON} cannot import torch" in proc.stderr
    assert [p.name for p in venv.iterdir()] == ["keep"]


def test_a_wrong_mode_or_a_missing_wheel_folder_is_an_error(tmp_path):
    for args, message in (
        (["--torch", "conda"], "TORCH='conda': use TORCH=system"),
        (["--wheels", str(tmp_path / "none")], f"WHEELS={tmp_path / 'none'}: no such folder"),
        (["--installer", "conda"], "argument --installer: invalid choice: 'conda'"),
    ):
        proc = subprocess.run(
            [sys.executable, str(REPO / "scripts/setup_venv.py"), "setup", "--venv", str(tmp_path / "v"), *args],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2 and message in proc.stderr
        assert not (tmp_path / "v").exists()


def venv_site(venv: Path) -> Path:
    return Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )


def test_where_uv_cannot_install_pip_tries_and_its_failure_is_the_error(tmp_path, capfd, monkeypatch):
    # No index: the pip that runs the set-up cannot install uv into the venv, nor can the venv's own
    # pip, a stand-in that fails as pip does offline (no ensurepip: the venv has its own pip).
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    venv = tmp_path / "v"
    subprocess.run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    fake = venv_site(venv) / "pip"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("import sys\nsys.exit(f'offline pip: no {sys.argv[-1]}')\n")
    with pytest.raises(SetupError, match="pip install failed; its messages are above"):
        installer.install(venv, ["install", "dpstudy-no-such-package"], None, "lock", python=sys.executable)
    out, err = capfd.readouterr()
    assert "uv could not install them (its messages are above); installing with pip instead" in out + err
    # uv by the venv's pip (the set-up's own pip failed quietly), then pip itself: both refused
    assert "offline pip: no uv==0.13.9" in err and "offline pip: no pip" in err
    assert not (venv / "bin" / "uv").exists()


def test_uv_is_given_the_index_pip_is_given_in_the_environment(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://extra.example/simple")
    monkeypatch.delenv("UV_DEFAULT_INDEX", raising=False)
    monkeypatch.setenv("UV_INDEX", "https://mine.example/simple")  # the user's own uv setting stays
    env = installer.uv_environment()
    assert env["UV_DEFAULT_INDEX"] == "https://mirror.example/simple"
    assert env["UV_INDEX"] == "https://mine.example/simple"


def test_byte_compile_skips_test_suites_model_folders_and_what_this_python_cannot_parse(tmp_path):
    # The venv itself lies in a folder called tests: only folders inside site-packages count.
    venv = tmp_path / "tests" / "v"
    subprocess.run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv_site(venv)
    for name, text in {
        "pkg/__init__.py": "",
        "pkg/core.py": "X = 1\n",
        "pkg/tests/test_core.py": "def test(): pass\n",
        "pkg/sub/test/helper.py": "Y = 2\n",
        "pkg/testing.py": "Z = 3\n",
        "pkg/future.py": "def f[T](a): pass\n" if sys.version_info < (3, 12) else "def f(:\n",
        "transformers/__init__.py": "",
        "transformers/modeling_utils.py": "W = 4\n",
        "transformers/models/gpt2/modeling_gpt2.py": "V = 5\n",  # compiled when a study imports it
    }.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    installer.byte_compile(venv)
    compiled = {p.parent.parent.relative_to(site) / p.name.split(".")[0] for p in site.rglob("*.pyc")}
    assert compiled == {
        Path("pkg/__init__"),
        Path("pkg/core"),
        Path("pkg/testing"),
        Path("transformers/__init__"),
        Path("transformers/modeling_utils"),
    }


# ---- the lock -----------------------------------------------------------------------------------


def _requirements(extras: tuple[str, ...] = ("test", "browser")) -> list[Requirement]:
    reqs = [Requirement(r) for r in metadata.requires("dpstudy") or []]
    return [
        r
        for r in reqs
        if r.marker is None or any(r.marker.evaluate({**default_environment(), "extra": e}) for e in ("", *extras))
    ]


def test_the_lock_pins_every_requirement_within_its_range():
    lock, torch = versions.read_pins(LOCK), versions.read_pins(TORCH_LOCK)
    assert not set(lock) & set(torch), "a distribution pinned twice"
    pins = {**lock, **torch}
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in the lock"
        assert Version(pins[name]) in req.specifier, f"the lock's {name}=={pins[name]} breaks {req}"
    assert versions.same_release(versions.torchvision_build_for(torch["torchvision"]), torch["torch"])
    assert {"torch", "torchvision"} <= set(torch) and "setuptools" in lock  # the offline build needs it


def test_this_environment_is_the_lock_s():
    # The versions the tests pass with are the lock's: every locked distribution this venv installed
    # itself (not one a host provides under TORCH=system) is at its pinned version.
    pins = {**versions.read_pins(LOCK), **versions.read_pins(TORCH_LOCK)}
    # setuptools is pinned as dpstudy's build backend, which pip installs in its isolated build
    # environment; the venv's own copy is whatever `python -m venv` (or a host) brought.
    pins.pop("setuptools")
    # Only this venv's site-packages: not a host's, nor the copies setuptools vendors (it puts
    # setuptools/_vendor on sys.path once imported).
    site = list(dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]))
    off = {}
    for dist in metadata.distributions(path=site):
        name = canonicalize_name(dist.metadata["Name"])
        if name in pins and dist.version != pins[name]:
            off[name] = (dist.version, pins[name])
    assert not off, f"installed vs locked: {off}; run `make setup` (or `make lock` after changing pyproject.toml)"


# ---- offline, on a host that brings its own PyTorch -----------------------------------------------


def host_with_only_torch(dest: Path) -> Path:
    """A Python whose only packages are this venv's torch and torchvision with what they need: a
    folder of links to them (no 5 GB copy) that a venv of its own sees through a .pth file, as a
    container's or a module's Python sees its PyTorch."""
    site = dest / "site"
    site.mkdir(parents=True)
    dists = lock_requirements.closure([Requirement("torch"), Requirement("torchvision")])
    tops = {f.parts[0] for dist in dists.values() for f in dist.files or [] if f.parts[0] != ".."}
    installed = Path(metadata.distribution("torch").locate_file(""))
    for top in tops:
        if (installed / top).exists():
            (site / top).symlink_to(installed / top)
    subprocess.run([str(BASE_PYTHON), "-m", "venv", str(dest / "venv")], check=True)
    purelib = subprocess.run(
        [str(dest / "venv/bin/python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "host.pth").write_text(f"{site}\n")
    return dest / "venv" / "bin" / "python"


def offline(cmd: list[str]) -> list[str]:
    """`cmd` in a network namespace of its own, with no interface but loopback, where that is allowed."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n", *cmd]
    return cmd  # not root: pip's --no-index alone keeps it off the network


@pytest.mark.slow
def test_offline_setup_on_a_host_pytorch_other_than_the_lock_s(tmp_path):
    checkout = copy_checkout(tmp_path / "checkout")
    # The lock pins another PyTorch than the host's: TORCH=system must not try to install it (offline
    # that would fail), and must keep the host's.
    torch_lock = checkout / "requirements" / "torch.txt"
    torch_lock.write_text(
        torch_lock.read_text().replace(f"torch=={versions.read_pins(torch_lock)['torch']}", "torch==2.6.0")
    )
    host_python = host_with_only_torch(tmp_path / "host")
    host_torch = subprocess.run(
        [str(host_python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert host_torch != "2.6.0"
    wheels = tmp_path / "wheels"
    make = ["make", "--no-print-directory", "-C", str(checkout), f"PYTHON={host_python}"]
    subprocess.run([*make, "wheelhouse", f"WHEELS={wheels}"], check=True, capture_output=True)
    assert not list(wheels.glob("torch-*")) and list(wheels.glob("snakemake-*.whl"))

    tmp = tmp_path / "tmp"  # the set-up's TMPDIR
    tmp.mkdir()
    proc = subprocess.run(
        offline([*make, "setup", "TORCH=system", f"WHEELS={wheels}", "EXTRAS=test"]),
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert left_in_tmpdir(tmp) == []  # ipykernel's staging folder included
    host_site = tmp_path / "host" / "site"
    assert f"using the host's torch {host_torch} (CUDA" in proc.stdout and f"from {host_site}" in proc.stdout
    assert f"installed offline from {wheels}" in proc.stdout

    venv_python = checkout / ".venv" / "bin" / "python"
    probe = (
        "import json, torch, snakemake, papermill, jsonschema, dpstudy; "
        "from dpstudy.record.envinfo import torch_origin;"
        "print(json.dumps({'torch': torch.__version__, 'dpstudy': dpstudy.__file__, **torch_origin()}))"
    )
    seen = json.loads(
        subprocess.run([str(venv_python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    )
    assert seen == {
        "torch": host_torch,
        "dpstudy": str(checkout / "dpstudy" / "__init__.py"),
        "torch_path": str(host_site),
        "torch_provider": "host",
    }
    state = json.loads((checkout / ".venv" / STATE_FILE).read_text())
    assert state["torch"] == "system" and state["torch_version"] == host_torch
    # The venv is made without pip; pip installs there, so ensurepip put the venv's own first, not the host's.
    pip = subprocess.run([str(venv_python), "-m", "pip", "--version"], capture_output=True, text=True, check=True)
    assert f"from {checkout / '.venv'}/" in pip.stdout, pip.stdout

    # The venv remembers how it was made: a plain `make setup` (make run, make test) keeps it, silently.
    again = subprocess.run(offline([*make, "setup"]), capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout == "" and again.stderr == ""
    # ... and the workflow plans with it.
    dry = subprocess.run(
        [str(checkout / ".venv/bin/snakemake"), "-n", "--cores", "1"], cwd=checkout, capture_output=True, text=True
    )
    assert dry.returncode == 0 and "report" in dry.stdout, dry.stderr[-3000:]


def test_the_conda_environment_pins_the_lock_s_pytorch():
    # --sdm conda builds envs/train.yaml: it must train with the PyTorch the lock is tested with.
    import yaml

    pip_section = next(
        d["pip"] for d in yaml.safe_load((REPO / "envs/train.yaml").read_text())["dependencies"] if isinstance(d, dict)
    )
    torch = versions.read_pins(TORCH_LOCK)
    assert {f"torch=={torch['torch']}", f"torchvision=={torch['torchvision']}"} <= set(pip_section)
