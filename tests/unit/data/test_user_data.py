"""A user's own data (dpstudy.data.user): an image folder or a function, prepared into the resident
format the loaders read, with every bad input one error that names it and nothing half-prepared."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from PIL import Image

from dpstudy.data import store, user
from dpstudy.data.registry import DatasetError
from dpstudy.util.errors import ConfigError

FOLDER = {"source": "imagefolder", "image_size": 16}


def image_tree(root: Path, counts: dict[str, int], size: int = 24, start: int = 0) -> Path:
    """root/<class>/img_<k>.png: class c's images are one grey level, c x 60 + k."""
    for c, (name, n) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for k in range(start, start + n):
            grey = c * 60 + k
            Image.new("RGB", (size + k % 3 * 4, size), (grey, grey, grey)).save(root / name / f"img_{k:03d}.png")
    return root


def test_torchvision_reads_the_same_image_extensions():
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert set(user.IMAGE_EXTENSIONS) == set(IMG_EXTENSIONS)


def test_an_image_folder_is_prepared_like_a_registry_dataset(tmp_path):
    images = image_tree(tmp_path / "photos", {"cat": 5, "dog": 4})
    (images / "cat" / "notes.txt").write_text("not an image: left out")
    folder = store.prepare("pets", tmp_path / "data", {**FOLDER, "path": str(images), "test_fraction": 0.25})
    meta = store.load_meta("pets", tmp_path / "data")
    assert folder == tmp_path / "data" / "pets"
    assert meta["shape"] == [3, 16, 16] and meta["classes"] == ["cat", "dog"]
    # a quarter of each class held out, at least one: cat 5 -> 1, dog 4 -> 1
    assert (meta["splits"]["train"]["n"], meta["splits"]["test"]["n"]) == (7, 2)
    train_x, train_y = store.load_split("pets", tmp_path / "data", "train")
    test_x, test_y = store.load_split("pets", tmp_path / "data", "test")
    assert train_x.dtype == torch.uint8 and tuple(train_x.shape) == (7, 3, 16, 16)
    assert sorted(test_y.tolist()) == [0, 1] and sorted(train_y.tolist()) == [0, 0, 0, 0, 1, 1, 1]
    # each image is one grey level: resizing keeps it, so every pixel tells its class and index
    greys = sorted({int(x[0, 0, 0]) for x in torch.cat([train_x, test_x])})
    assert greys == [0, 1, 2, 3, 4, 60, 61, 62, 63]
    mean = torch.cat([train_x]).double().div(255).mean().item()
    assert meta["mean"] == pytest.approx([mean] * 3, rel=1e-6)
    settings = {**FOLDER, "path": str(images), "test_fraction": 0.25}
    assert meta["fingerprint"] == user.fingerprint(user.describe("pets", settings))


def test_the_fingerprint_follows_the_images_and_the_settings(tmp_path):
    images = image_tree(tmp_path / "photos", {"cat": 3, "dog": 3})
    settings = {**FOLDER, "path": str(images)}
    before = user.fingerprint(user.describe("pets", settings))
    assert user.fingerprint(user.describe("pets", settings)) == before
    assert user.fingerprint(user.describe("pets", {**settings, "image_size": 20})) != before
    image_tree(images, {"cat": 1}, start=3)  # one image added
    added = user.fingerprint(user.describe("pets", settings))
    assert added != before
    (images / "dog" / "README").write_text("not an image")
    assert user.fingerprint(user.describe("pets", settings)) == added


def test_adding_images_prepares_the_folder_anew(tmp_path):
    images = image_tree(tmp_path / "photos", {"cat": 3, "dog": 3})
    settings = {**FOLDER, "path": str(images), "test_fraction": 0.34}
    store.prepare("pets", tmp_path / "data", settings)
    first = store.load_meta("pets", tmp_path / "data")
    store.prepare("pets", tmp_path / "data", settings)  # nothing new: not read again
    assert store.load_meta("pets", tmp_path / "data") == first
    image_tree(images, {"cat": 3}, start=3)
    store.prepare("pets", tmp_path / "data", settings)
    again = store.load_meta("pets", tmp_path / "data")
    assert again["fingerprint"] != first["fingerprint"]
    assert again["splits"]["train"]["n"] + again["splits"]["test"]["n"] == 9


def test_a_test_folder_and_grayscale(tmp_path):
    train = image_tree(tmp_path / "train", {"a": 2, "b": 2})
    test = image_tree(tmp_path / "test", {"a": 1, "b": 1}, start=10)
    settings = {**FOLDER, "path": str(train), "test_path": str(test), "channels": 1, "image_size": 8}
    store.prepare("mine", tmp_path / "data", settings)
    meta = store.load_meta("mine", tmp_path / "data")
    assert meta["shape"] == [1, 8, 8] and (meta["splits"]["train"]["n"], meta["splits"]["test"]["n"]) == (4, 2)
    x, y = store.load_split("mine", tmp_path / "data", "test")
    assert [int(v) for v in x[:, 0, 0, 0]] == [10, 70] and y.tolist() == [0, 1]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"image_size": 16}, "datasets.pets: an image folder needs `path`"),
        ({"path": "PHOTOS"}, "datasets.pets: an image folder needs `image_size`"),
        ({**FOLDER, "path": "nowhere"}, "datasets.pets: path: 'nowhere' does not exist"),
        ({**FOLDER, "path": "EMPTY"}, "holds no class folder: an image folder has one subfolder per class"),
        ({**FOLDER, "path": "NOIMAGES"}, "holds no image (.jpg"),
        ({**FOLDER, "path": "PHOTOS", "test_path": "OTHER"}, "test_path's classes ['x'] are not path's ['cat', 'dog']"),
        ({**FOLDER, "path": "PHOTOS", "test_path": "OTHER", "test_fraction": 0.5}, "give test_path or test_fraction"),
        ({**FOLDER, "path": "PHOTOS", "args": {"n": 1}}, "args apply to a function's dataset only"),
        ({"source": "imagefoldr", **{"path": "PHOTOS"}}, "source 'imagefoldr' is neither"),
    ],
)
def test_a_bad_image_folder_is_one_error_naming_the_setting(tmp_path, settings, message):
    image_tree(tmp_path / "photos", {"cat": 1, "dog": 1})
    image_tree(tmp_path / "other", {"x": 1})
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimages" / "cat").mkdir(parents=True)
    (tmp_path / "noimages" / "cat" / "a.txt").write_text("")
    places = {"PHOTOS": "photos", "OTHER": "other", "EMPTY": "empty", "NOIMAGES": "noimages"}
    settings = {k: str(tmp_path / places[v]) if isinstance(v, str) and v in places else v for k, v in settings.items()}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        user.describe("pets", settings)


def test_an_unreadable_image_is_named_and_nothing_is_half_prepared(tmp_path):
    images = image_tree(tmp_path / "photos", {"cat": 2, "dog": 2})
    (images / "dog" / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(DatasetError, match=r"dataset 'pets': cannot read image .*dog/broken\.png"):
        store.prepare("pets", tmp_path / "data", {**FOLDER, "path": str(images)})
    assert not store.is_ready("pets", tmp_path / "data")
    assert sorted(p.name for p in (tmp_path / "data" / "pets").iterdir()) == [".prepare.lock"]


FUNCTIONS = """
import torch
from torch.utils.data import Dataset
from PIL import Image


def tensors(n=12, size=8):
    g = torch.Generator().manual_seed(0)
    train = (torch.rand(n, 1, size, size, generator=g), torch.arange(n) % 3)
    test = (torch.rand(6, 1, size, size, generator=g), torch.arange(6) % 3)
    return train, test, ["a", "b", "c"]


class Pictures(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return Image.new("RGB", (20, 10), (i, i, i)), i % 2


def pil_datasets():
    return Pictures(4), Pictures(2), ["even", "odd"]


def wrong_shape():
    return torch.zeros(3, 8, 8), torch.zeros(3), ["a"]


def labels_too_big():
    data = (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([0, 5]))
    return data, data, ["a", "b"]
"""


@pytest.fixture
def functions(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "my_data.py").write_text(textwrap.dedent(FUNCTIONS))
    return tmp_path / "code"


def test_a_function_of_tensors_is_prepared(tmp_path, functions):
    name = "my_data:tensors"
    store.prepare(name, tmp_path / "data", {"args": {"n": 9}}, code_path=str(functions))
    folder = store.dataset_dir(name, tmp_path / "data")
    assert folder.name.startswith("tensors_") and folder.is_dir()
    meta = store.load_meta(name, tmp_path / "data")
    assert meta["shape"] == [1, 8, 8] and meta["classes"] == ["a", "b", "c"]
    assert (meta["splits"]["train"]["n"], meta["splits"]["test"]["n"]) == (9, 6)
    x, y = store.load_split(name, tmp_path / "data", "train")
    expected = (torch.rand(9, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 255).round().to(torch.uint8)
    assert torch.equal(x, expected) and y.tolist() == [0, 1, 2] * 3


def test_a_function_of_pil_datasets_is_resized_to_the_image_size(tmp_path, functions):
    store.prepare("my_data:pil_datasets", tmp_path / "data", {"image_size": 6}, code_path=str(functions))
    x, y = store.load_split("my_data:pil_datasets", tmp_path / "data", "train")
    assert tuple(x.shape) == (4, 3, 6, 6) and y.tolist() == [0, 1, 0, 1]
    assert [int(v) for v in x[:, 0, 3, 3]] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "function, settings, error, message",
    [
        ("my_data:tensors", {"args": {"colour": True}}, ConfigError, r"cannot be called with args \{'colour': True\}"),
        ("my_data:wrong_shape", {}, DatasetError, r"train: expected \(images, labels\) tensors or a Dataset"),
        ("my_data:labels_too_big", {}, DatasetError, r"train: labels outside 0\.\.1 \(2 classes\)"),
        ("my_data:pil_datasets", {}, DatasetError, r"images \(10, 20\) are not square: set image_size"),
        ("missing_module:make", {}, ConfigError, r"cannot import module 'missing_module' \(looked in"),
        ("my_data:nothing", {}, ConfigError, r"module 'my_data' \(.*my_data.py\) has no callable 'nothing'"),
    ],
)
def test_a_bad_function_is_named_and_leaves_nothing(tmp_path, functions, function, settings, error, message):
    with pytest.raises(error, match=message):
        store.prepare(function, tmp_path / "data", settings, code_path=str(functions))
    assert not store.is_ready(function, tmp_path / "data")
    assert not [p for p in store.dataset_dir(function, tmp_path / "data").iterdir() if p.suffix in (".pt", ".json")]


def test_meta_says_where_the_data_came_from(tmp_path, functions):
    store.prepare("my_data:tensors", tmp_path / "data", {}, code_path=str(functions))
    meta = json.loads((store.dataset_dir("my_data:tensors", tmp_path / "data") / "meta.json").read_text())
    assert meta["sources"] == {"source": "my_data:tensors"} and len(meta["fingerprint"]) == 16


@pytest.mark.parametrize("loader", ["torch", "device"])
def test_both_loaders_train_on_a_prepared_image_folder(tmp_path, loader):
    """The engine trains a cell on a user's prepared folder with either loader (a real process)."""
    from helpers.engine import train

    from dpstudy.record import fields as record

    images = image_tree(tmp_path / "photos", {"cat": 6, "dog": 6})
    store.prepare("pets", tmp_path / "data", {**FOLDER, "path": str(images), "test_fraction": 0.25})
    spec = {
        "dataset": "pets",
        "model": "torchvision:resnet18",
        "mode": "single",
        "batch": 3,
        "epochs": 1,
        "warmup_steps": 1,
        "loader": loader,
        "augment": "crop_flip",
        "data_root": str(tmp_path / "data"),
    }
    proc = train(spec, tmp_path / "cell")
    assert proc.returncode == 0, proc.stderr
    rec = record.read(tmp_path / "cell" / "record.json")
    assert rec["status"] == "ok" and rec["cell"] == "pets-torchvision_resnet18-single-g1-b3-none"
    assert rec["epochs"][0]["samples"] == 8  # 12 images, a quarter held out
    # torchvision's ResNet-18 for 2 classes: its parameters and BatchNorm's buffers, as the tracker counts them
    from torchvision.models import resnet18

    net = resnet18(num_classes=2)
    state_mb = sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()]) / 2**20
    assert sum(p.numel() for p in net.parameters()) == 11_177_538
    assert rec["memory"]["params_mb"][0] == pytest.approx(state_mb, rel=1e-6)
