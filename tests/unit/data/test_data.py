"""dpstudy.data.registry: registry, generated datasets, and downloads against a loopback HTTP server."""

from __future__ import annotations

import hashlib
import json
import runpy
import socket
import subprocess
import sys
import time

import pytest
import torch
from helpers import REPO
from helpers.archives import WRITERS
from helpers.loopback import serve
from torch import nn

from dpstudy.data import store as data
from dpstudy.data import synthetic
from dpstudy.data.registry import DATASETS, DatasetError
from dpstudy.study import sweeps
from dpstudy.study.datasets import check_overrides
from dpstudy.util.errors import ConfigError

SMALL = {"train_size": 200, "test_size": 40}


# --- registry ------------------------------------------------------------------------------


def test_registry_entries_are_sane():
    images = {"mnist", "fashion_mnist", "cifar10", "stl10", "synthetic", "synthetic_rgb", "synthetic_stl"}
    assert set(DATASETS) == images | {"tiny_shakespeare", "synthetic_text"}
    for name, info in DATASETS.items():
        assert info.name == name
        assert info.is_text == (name not in images) == (info.kind == "text")
        assert info.generated == name.startswith("synthetic")
        assert bool(info.files) != info.generated
        assert info.generated == (info.stand_in is None)
        if info.is_text:  # a vocabulary, no shape nor classes; a stand-in of the same vocabulary
            assert info.vocab_size == 256 and (info.channels, info.size, info.classes) == (0, 0, ())
            assert not info.stand_in or DATASETS[info.stand_in].vocab_size == info.vocab_size
            continue
        assert info.kind == "image" and info.vocab_size == 0
        assert info.channels in (1, 3) and info.size in (28, 32, 96)
        assert len(info.classes) == 10 == len(set(info.classes))
        assert info.generated == name.startswith("synthetic")
        assert bool(info.files) != info.generated
        # a downloadable dataset's stand-in is generated and has its shape (config stand_in)
        assert info.generated == (info.stand_in is None)
        if info.stand_in:
            stand_in = DATASETS[info.stand_in]
            assert stand_in.generated and (stand_in.channels, stand_in.size) == (info.channels, info.size)


def test_registry_files_match_torchvision():
    from torchvision import datasets as tv

    from dpstudy.data import download, fetch

    for name, info in DATASETS.items():
        if not info.generated:
            assert tuple(fetch.official_md5(name)) == info.files
            assert all(url.startswith("http") for url in fetch.official_mirrors(name))
            if not info.is_text:  # torchvision's own lists
                assert fetch.official_md5(name) == download.official_md5(name)
    assert list(DATASETS["fashion_mnist"].classes) == tv.FashionMNIST.classes


def test_importing_the_registry_does_not_import_torch():
    code = "import sys, dpstudy.data.registry; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- generated datasets --------------------------------------------------------------------


def test_synthetic_is_deterministic_per_seed():
    first, again = (synthetic.splits(1, 28, 0, 200, 40) for _ in range(2))
    other = synthetic.splits(1, 28, 1, 200, 40)
    for split in ("train", "test"):
        assert torch.equal(first[split][0], again[split][0]) and torch.equal(first[split][1], again[split][1])
        assert not torch.equal(first[split][0], other[split][0])


@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_synthetic_shapes_dtypes_and_balance(channels, size):
    images, labels = synthetic.splits(channels, size, 0, 10000, 30)["train"]
    assert images.shape == (10000, channels, size, size) and images.dtype == torch.uint8
    assert images.is_contiguous()
    assert labels.shape == (10000,) and labels.dtype == torch.int64
    assert torch.bincount(labels, minlength=10).tolist() == [1000] * 10
    assert 0 < images.float().std() < 128  # noisy, but not clipped to black and white


def test_synthetic_test_set_does_not_depend_on_train_size():
    small, large = synthetic.splits(1, 28, 0, 100, 40), synthetic.splits(1, 28, 0, 300, 40)
    assert torch.equal(small["test"][0], large["test"][0])


def test_prepare_synthetic_writes_splits_and_meta(tmp_path):
    folder = data.prepare("synthetic_rgb", tmp_path, SMALL)
    assert folder == tmp_path / "synthetic_rgb" and data.is_ready("synthetic_rgb", tmp_path)
    meta = data.load_meta("synthetic_rgb", tmp_path)
    assert meta["name"] == "synthetic_rgb" and meta["shape"] == [3, 32, 32]
    assert meta["classes"] == list(DATASETS["synthetic_rgb"].classes)
    assert meta["generator"] == {"seed": data.GENERATOR_SEED, **SMALL} and meta["sources"] == {}
    expected = synthetic.splits(3, 32, data.GENERATOR_SEED, 200, 40)
    for split, n in (("train", 200), ("test", 40)):
        images, labels = data.load_split("synthetic_rgb", tmp_path, split)
        assert torch.equal(images, expected[split][0]) and torch.equal(labels, expected[split][1])
        entry = meta["splits"][split]
        assert entry["n"] == n and entry["sha256"] == hashlib.sha256((folder / entry["file"]).read_bytes()).hexdigest()
    train = expected["train"][0].double() / 255
    assert meta["mean"] == pytest.approx(train.mean((0, 2, 3)).tolist(), abs=1e-9)
    assert meta["std"] == pytest.approx(train.transpose(0, 1).flatten(1).std(1).tolist(), abs=1e-9)
    assert sorted(p.name for p in folder.iterdir()) == [".prepare.lock", "meta.json", "test.pt", "train.pt"]


def test_prepare_is_idempotent_and_regenerates_on_new_sizes(tmp_path):
    meta = data.prepare("synthetic", tmp_path, SMALL) / "meta.json"
    stamp = meta.stat().st_mtime_ns
    data.prepare("synthetic", tmp_path, SMALL)
    assert meta.stat().st_mtime_ns == stamp
    data.prepare("synthetic", tmp_path, {"train_size": 80, "test_size": 40})
    assert data.load_meta("synthetic", tmp_path)["splits"]["train"]["n"] == 80


def test_prepare_removes_leftovers_of_a_killed_run(tmp_path):
    folder = tmp_path / "synthetic"
    (folder / ".extract-abc").mkdir(parents=True)
    (folder / ".train.pt.x.tmp").write_bytes(b"half")
    data.prepare("synthetic", tmp_path, SMALL)
    assert not list(folder.glob(".extract-*")) and not list(folder.glob("*.tmp"))


def lenet(channels: int, size: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels, 6, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * (size // 4) ** 2, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, 10),
    )


@pytest.mark.slow
def test_lenet_learns_synthetic_in_three_epochs(tmp_path):
    data.prepare("synthetic", tmp_path)
    meta = data.load_meta("synthetic", tmp_path)
    mean, std = (torch.tensor(meta[k]).view(1, -1, 1, 1) for k in ("mean", "std"))
    x, y = data.load_split("synthetic", tmp_path, "train")
    x_test, y_test = data.load_split("synthetic", tmp_path, "test")
    x, x_test = ((t.float() / 255 - mean) / std for t in (x, x_test))
    torch.manual_seed(0)
    model = lenet(1, 28)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        for idx in torch.randperm(len(x)).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    assert 0.90 <= accuracy < 1.0


# --- downloads -----------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server for tmp_path/served; `.requests` lists the paths asked for."""
    with serve(tmp_path / "served") as httpd:
        yield httpd


def overrides_for(name: str, server) -> tuple[dict, dict]:
    """(source data, overrides pointing at the server with the archives' true md5s)."""
    source = WRITERS[name](server.folder)
    md5 = {f: hashlib.md5((server.folder / f).read_bytes()).hexdigest() for f in DATASETS[name].files}
    return source, {"mirror": server.url, "md5": md5}


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10", "stl10"])
def test_download_verifies_converts_and_is_idempotent(name, server, tmp_path):
    source, overrides = overrides_for(name, server)
    root = tmp_path / "data"
    folder = data.prepare(name, root, overrides)
    for split in ("train", "test"):
        images, labels = data.load_split(name, root, split)
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert torch.equal(images, source[split][0]) and torch.equal(labels, source[split][1])
    meta = data.load_meta(name, root)
    info = DATASETS[name]
    assert meta["shape"] == [info.channels, info.size, info.size] and meta["sources"] == overrides["md5"]
    assert meta["splits"]["train"]["n"] == len(source["train"][1]) and "generator" not in meta
    assert meta["mean"] == pytest.approx(data.channel_stats(source["train"][0])[0])
    assert sorted(p.name for p in (folder / "raw").iterdir()) == sorted(info.files)
    assert not list(folder.glob(".extract-*"))
    served = len(server.requests)
    assert served >= len(info.files)
    data.prepare(name, root, overrides)
    assert len(server.requests) == served


def test_bad_checksum_is_an_error_and_leaves_nothing_ready(server, tmp_path):
    _, overrides = overrides_for("mnist", server)
    file = "train-labels-idx1-ubyte.gz"
    good, bad = overrides["md5"][file], "0" * 32
    root = tmp_path / "data"
    with pytest.raises(DatasetError) as error:
        data.prepare("mnist", root, {**overrides, "md5": {**overrides["md5"], file: bad}})
    for part in ("mnist", file, bad, good):
        assert part in str(error.value)
    assert not data.is_ready("mnist", root)
    folder = root / "mnist"
    assert not list(folder.glob("*.pt")) and not list(folder.glob(".*.tmp"))
    assert not (folder / "raw" / file).exists() and not list((folder / "raw").glob(".*.part"))
    requested = len(server.requests)
    data.prepare("mnist", root, overrides)  # the retry downloads the deleted file again, not the verified one
    assert data.is_ready("mnist", root)
    retried = {path.rsplit("/", 1)[-1] for path in server.requests[requested:]}
    assert file in retried and "train-images-idx3-ubyte.gz" not in retried


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_an_error_naming_the_url(tmp_path):
    mirror = f"http://127.0.0.1:{_free_port()}/mnist"
    start = time.monotonic()
    with pytest.raises(DatasetError, match=f"{mirror}/train-images-idx3-ubyte.gz"):
        data.prepare("mnist", tmp_path, {"mirror": mirror})
    assert time.monotonic() - start < 5
    assert not data.is_ready("mnist", tmp_path)


def test_silent_server_times_out(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSTUDY_DOWNLOAD_TIMEOUT", "0.5")
    with socket.socket() as listener:  # accepts connections (kernel backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        mirror = f"http://127.0.0.1:{listener.getsockname()[1]}/"
        start = time.monotonic()
        with pytest.raises(DatasetError, match="timed out"):
            data.prepare("cifar10", tmp_path, {"mirror": mirror})
    assert time.monotonic() - start < 5
    assert socket.getdefaulttimeout() is None


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, overrides, needle",
    [
        ("imagenet", None, "imagenet"),
        ("mnist", {"colour": 1}, "colour"),
        ("mnist", {"train_size": 10}, "train_size"),
        ("synthetic", {"mirror": "http://example.org/"}, "mirror"),
        ("mnist", {"md5": {"other.gz": "0" * 32}}, "other.gz"),
        ("mnist", {"md5": {"train-images-idx3-ubyte.gz": "not-a-checksum"}}, "not-a-checksum"),
    ],
)
def test_bad_names_and_overrides_are_config_errors(tmp_path, name, overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        check_overrides(name, overrides)
    with pytest.raises(ConfigError, match=needle):  # also when the study loads, before any job
        sweeps.load(
            {
                "datasets": {name: overrides or {}},
                "sweeps": [{"name": "s", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"]}}],
            }
        )
    assert not (tmp_path / name).exists()


def test_loading_an_unprepared_dataset_says_how_to_prepare(tmp_path):
    with pytest.raises(DatasetError, match="scripts/prepare_data.py cifar10"):
        data.load_split("cifar10", tmp_path, "train")
    with pytest.raises(ConfigError, match="valid"):
        data.load_split("cifar10", tmp_path, "valid")


def test_cli_prepares_and_reports_errors_in_one_line(tmp_path, capsys):
    script = REPO / "scripts" / "prepare_data.py"
    cli = runpy.run_path(str(script))  # in process: a subprocess would import torch again
    assert cli["main"](["synthetic", "--root", str(tmp_path), "--overrides", json.dumps(SMALL)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "synthetic")
    assert cli["main"](["mnist", "--root", str(tmp_path), "--overrides", "{"]) == 2
    assert "--overrides" in capsys.readouterr().err
    bad = subprocess.run(
        [sys.executable, str(script), "imagenet", "--root", str(tmp_path)], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "imagenet" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
