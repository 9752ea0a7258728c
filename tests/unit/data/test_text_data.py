"""Text datasets (dpstudy.data.text): the generated text, tiny_shakespeare through a loopback server,
and a user's own text with each tokenizer, prepared into token files and a meta.json."""

from __future__ import annotations

import collections
import hashlib
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.loopback import serve

from dpstudy.data import fetch, store, synthetic_text, text, user
from dpstudy.data.registry import DatasetError
from dpstudy.data.task import Task
from dpstudy.study import sweeps
from dpstudy.study.datasets import check_overrides
from dpstudy.util.errors import ConfigError

SMALL = {"train_size": 6000, "test_size": 1000}
SHAKESPEARE_MD5 = "6fb458f1232090904fb40fe944165e91"  # of karpathy/char-rnn's input.txt, 1,115,394 bytes


def entropy(data: bytes) -> float:
    counts = collections.Counter(data)
    return -sum(c / len(data) * math.log(c / len(data)) for c in counts.values())


def heldout_entropy(train: bytes, test: bytes, order: int) -> float:
    """Nats per byte of `test` under an order-`order` byte model counted on `train`: the longest
    context seen in training, each order Dirichlet-smoothed towards the one below, down to the
    (add-half) unigram. Held out, so that a random text cannot score low by overfitting."""
    tables = [collections.defaultdict(collections.Counter) for _ in range(order + 1)]
    for k in range(1, order + 1):
        for i in range(k, len(train)):
            tables[k][train[i - k : i]][train[i]] += 1
    unigram = collections.Counter(train)
    total = 0.0
    for i in range(order, len(test)):
        p = (unigram[test[i]] + 0.5) / (len(train) + 128)
        for k in range(1, order + 1):
            seen = tables[k].get(test[i - k : i])
            if seen is None:
                break
            p = (seen[test[i]] + p) / (sum(seen.values()) + 1)
        total -= math.log(p)
    return total / (len(test) - order)


# --- generated text ------------------------------------------------------------------------


def test_generated_text_is_deterministic_per_seed():
    first, again = synthetic_text.splits(0, 3000, 500), synthetic_text.splits(0, 3000, 500)
    other = synthetic_text.splits(1, 3000, 500)
    assert first == again and len(first["train"]) == 3000 and len(first["test"]) == 500
    assert first["train"] != other["train"] and first["test"] != other["test"]
    assert synthetic_text.splits(0, 1000, 500)["test"] == first["test"]  # the test text ignores train_size


def test_generated_text_is_broad_yet_predictable():
    data = synthetic_text.splits(0, 20_000, 2_000)
    unigram = entropy(data["train"])
    assert unigram > 3.3 and len(set(data["train"])) >= 50  # a broad byte distribution
    conditional = heldout_entropy(data["train"], data["test"], order=8)
    assert conditional < unigram / 3
    # the same bytes in random order: the measure finds nothing to predict (it can fail)
    shuffled = {split: bytes(random.Random(0).sample(list(b), len(b))) for split, b in data.items()}
    assert heldout_entropy(shuffled["train"], shuffled["test"], order=8) > 0.9 * unigram


def test_prepare_synthetic_text_writes_tokens_and_meta(tmp_path):
    assert store.split_sizes("synthetic_text", tmp_path) == (200_000, 20_000)  # the defaults, in tokens
    folder = store.prepare("synthetic_text", tmp_path, SMALL)
    meta = store.load_meta("synthetic_text", tmp_path)
    expected = synthetic_text.splits(store.GENERATOR_SEED, 6000, 1000)
    assert meta["kind"] == "text" and meta["vocab_size"] == 256 and meta["tokenizer"] == {"kind": "byte"}
    assert meta["generator"] == {"seed": store.GENERATOR_SEED, **SMALL} and meta["sources"] == {}
    assert meta["unigram_entropy_nats"] == pytest.approx(entropy(expected["train"]), rel=1e-9)
    for split in ("train", "test"):
        tokens = store.load_tokens("synthetic_text", tmp_path, split)
        assert tokens.dtype == torch.uint8 and tokens.dim() == 1 and bytes(tokens.tolist()) == expected[split]
        entry = meta["splits"][split]
        assert entry["n"] == len(expected[split])
        assert entry["sha256"] == hashlib.sha256((folder / entry["file"]).read_bytes()).hexdigest()
    assert sorted(p.name for p in folder.iterdir()) == [".prepare.lock", "meta.json", "test.pt", "train.pt"]
    assert store.split_sizes("synthetic_text", tmp_path) == (6000, 1000)
    stamp = (folder / "meta.json").stat().st_mtime_ns
    store.prepare("synthetic_text", tmp_path, SMALL)  # ready: nothing done
    assert (folder / "meta.json").stat().st_mtime_ns == stamp
    store.prepare("synthetic_text", tmp_path, {**SMALL, "test_size": 700})
    assert store.load_meta("synthetic_text", tmp_path)["splits"]["test"]["n"] == 700


def test_a_text_is_not_read_as_images_nor_images_as_text(tmp_path):
    store.prepare("synthetic_text", tmp_path, SMALL)
    store.prepare("synthetic", tmp_path, {"train_size": 20, "test_size": 10})
    with pytest.raises(DatasetError, match="'synthetic_text' is a text dataset.*load_tokens"):
        store.load_split("synthetic_text", tmp_path, "train")
    with pytest.raises(DatasetError, match="'synthetic' is an image dataset.*load_split"):
        store.load_tokens("synthetic", tmp_path, "train")
    with pytest.raises(ConfigError, match="'synthetic_text' is a text dataset"):
        store.shape_and_classes("synthetic_text", tmp_path)


def test_data_task_of_registry_datasets_before_preparing(tmp_path):
    assert store.data_task("mnist", tmp_path, None) == Task.image(1, 28, 10)
    assert store.data_task("tiny_shakespeare", tmp_path, 128) == Task.text(256, 128)
    with pytest.raises(ConfigError, match="dataset 'synthetic_text' is a text dataset: set seq_len"):
        store.data_task("synthetic_text", tmp_path, None)
    assert not (tmp_path / "synthetic_text").exists()


# --- tiny_shakespeare ----------------------------------------------------------------------


@pytest.fixture
def shakespeare(tmp_path):
    """(server, overrides): a loopback server of a generated input.txt, with its true md5."""
    with serve(tmp_path / "served") as server:
        (server.folder / "input.txt").write_bytes(synthetic_text.splits(3, 10_007, 1)["train"])
        md5 = hashlib.md5((server.folder / "input.txt").read_bytes()).hexdigest()
        yield server, {"mirror": server.url, "md5": {"input.txt": md5}}


def test_tiny_shakespeare_downloads_verifies_and_splits_90_10(shakespeare, tmp_path):
    server, overrides = shakespeare
    assert fetch.official_md5("tiny_shakespeare") == {"input.txt": SHAKESPEARE_MD5}
    assert fetch.official_mirrors("tiny_shakespeare")[0].startswith("https://raw.githubusercontent.com/karpathy/")
    root = tmp_path / "data"
    folder = store.prepare("tiny_shakespeare", root, overrides)
    served = (server.folder / "input.txt").read_bytes()
    n_train = int(10_007 * 0.9)  # nanoGPT's split: 9006 train, 1001 test bytes
    assert bytes(store.load_tokens("tiny_shakespeare", root, "train").tolist()) == served[:n_train]
    assert bytes(store.load_tokens("tiny_shakespeare", root, "test").tolist()) == served[n_train:]
    meta = store.load_meta("tiny_shakespeare", root)
    assert meta["sources"] == overrides["md5"] and "generator" not in meta and meta["kind"] == "text"
    assert (meta["splits"]["train"]["n"], meta["splits"]["test"]["n"]) == (9006, 1001)
    assert meta["unigram_entropy_nats"] == pytest.approx(entropy(served[:n_train]))
    assert sorted(p.name for p in (folder / "raw").iterdir()) == ["input.txt"]
    asked = len(server.requests)
    assert asked == 1
    store.prepare("tiny_shakespeare", root, overrides)
    assert len(server.requests) == asked


def test_tiny_shakespeare_with_a_bad_checksum_leaves_nothing_ready(shakespeare, tmp_path):
    server, overrides = shakespeare
    good, bad = overrides["md5"]["input.txt"], "0" * 32
    root = tmp_path / "data"
    with pytest.raises(DatasetError) as error:
        store.prepare("tiny_shakespeare", root, {**overrides, "md5": {"input.txt": bad}})
    for part in ("tiny_shakespeare", "input.txt", bad, good):
        assert part in str(error.value)
    folder = root / "tiny_shakespeare"
    assert not store.is_ready("tiny_shakespeare", root) and not list(folder.glob("*.pt"))
    assert not list((folder / "raw").iterdir())  # neither the file nor its .part
    store.prepare("tiny_shakespeare", root, overrides)
    assert store.is_ready("tiny_shakespeare", root)


def test_downloading_imports_neither_torch_nor_torchvision():
    code = "import sys, dpstudy.data.fetch; assert not {'torch', 'torchvision'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the user's own text -------------------------------------------------------------------

TEXT = {"source": "text"}


def corpus(folder: Path) -> bytes:
    """folder/b.txt, folder/a.txt, folder/sub/c.txt (and a note that is not .txt); returns the text
    read in sorted order: a.txt, b.txt, sub/c.txt."""
    parts = {"b.txt": "Zweite Datei: grüße.\n", "a.txt": "first file\n" * 30, "sub/c.txt": "the end — fin.\n"}
    for name, content in parts.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(content, encoding="utf-8")
    (folder / "notes.md").write_text("not read")
    return "".join(parts[name] for name in ("a.txt", "b.txt", "sub/c.txt")).encode()


def test_a_folder_of_text_is_prepared_as_bytes(tmp_path):
    expected = corpus(tmp_path / "texts")
    settings = {**TEXT, "path": str(tmp_path / "texts"), "test_fraction": 0.25}
    root = tmp_path / "data"
    assert store.data_task("mine", root, 64, settings) == Task.text(256, 64)  # before preparing
    assert store.split_sizes("mine", root, settings) is None
    folder = store.prepare("mine", root, settings)
    n_train = int(len(expected) * 0.75)
    assert bytes(store.load_tokens("mine", root, "train").tolist()) == expected[:n_train]
    assert bytes(store.load_tokens("mine", root, "test").tolist()) == expected[n_train:]
    meta = store.load_meta("mine", root)
    assert meta["tokenizer"] == {"kind": "byte"} and meta["vocab_size"] == 256
    assert meta["sources"] == {"source": "text", "path": str(tmp_path / "texts")}
    assert meta["fingerprint"] == user.fingerprint(user.describe("mine", settings))
    assert meta["unigram_entropy_nats"] == pytest.approx(entropy(expected[:n_train]))
    assert store.split_sizes("mine", root) == (n_train, len(expected) - n_train)
    assert store.data_task("mine", root, 32) == Task.text(256, 32)  # after, from meta.json
    assert sorted(p.name for p in folder.iterdir()) == [".prepare.lock", "meta.json", "test.pt", "train.pt"]


def test_editing_the_text_prepares_it_anew(tmp_path):
    corpus(tmp_path / "texts")
    settings = {**TEXT, "path": str(tmp_path / "texts")}
    store.prepare("mine", tmp_path / "data", settings)
    first = store.load_meta("mine", tmp_path / "data")
    store.prepare("mine", tmp_path / "data", settings)
    assert store.load_meta("mine", tmp_path / "data") == first
    with open(tmp_path / "texts" / "b.txt", "a") as f:
        f.write("one more line\n")
    store.prepare("mine", tmp_path / "data", settings)
    again = store.load_meta("mine", tmp_path / "data")
    assert again["fingerprint"] != first["fingerprint"]
    assert sum(s["n"] for s in again["splits"].values()) == sum(s["n"] for s in first["splits"].values()) + 14


def test_a_bpe_is_trained_on_the_training_text_only(tmp_path):
    words = synthetic_text.splits(0, 6000, 1)["train"].decode()
    (tmp_path / "book.txt").write_text(words + "zqxj " * 200)  # 1000 bytes at the end: the test split
    settings = {
        **TEXT,
        "path": str(tmp_path / "book.txt"),
        "tokenizer": "bpe",
        "vocab_size": 300,
        "test_fraction": 0.15,
    }
    root = tmp_path / "data"
    assert store.data_task("book", root, 16, settings) == Task.text(300, 16)
    folder = store.prepare("book", root, settings)
    meta = store.load_meta("book", root)
    tokenizer_sha = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    assert meta["tokenizer"] == {"kind": "bpe", "file": "tokenizer.json", "sha256": tokenizer_sha}
    assert meta["vocab_size"] == 300 and store.data_task("book", root, 16) == Task.text(300, 16)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert 256 < tokenizer.get_vocab_size() <= 300
    assert not [token for token in tokenizer.get_vocab() if "zq" in token or "xj" in token]  # never saw them
    train, test = (store.load_tokens("book", root, split) for split in ("train", "test"))
    assert train.dtype == torch.int32 and int(train.max()) < 300 and int(train.max()) > 255  # merges used
    assert tokenizer.decode(train.tolist()) + tokenizer.decode(test.tolist()) == (tmp_path / "book.txt").read_text()
    assert tokenizer.decode(test.tolist()).endswith("zqxj " * 200)
    assert meta["splits"]["train"]["n"] == len(train) and meta["unigram_entropy_nats"] > 0


def test_a_tokenizer_file_is_loaded_not_trained(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    given = Tokenizer(models.WordLevel({"[UNK]": 0, "to": 1, "be": 2, "or": 3, "not": 4}, unk_token="[UNK]"))
    given.pre_tokenizer = pre_tokenizers.Whitespace()
    given.save(str(tmp_path / "words.json"))
    (tmp_path / "hamlet.txt").write_text("to be or not to be " * 5 + "question")
    settings = {**TEXT, "path": str(tmp_path / "hamlet.txt"), "tokenizer": str(tmp_path / "words.json")}
    root = tmp_path / "data"
    assert store.data_task("hamlet", root, 4, settings) == Task.text(5, 4)
    folder = store.prepare("hamlet", root, settings)
    ids = [1, 2, 3, 4, 1, 2] * 5 + [0]
    train, test = store.load_tokens("hamlet", root, "train"), store.load_tokens("hamlet", root, "test")
    assert train.dtype == torch.uint8 and train.tolist() + test.tolist() == ids and len(train) == int(31 * 0.9)
    meta = store.load_meta("hamlet", root)
    assert meta["tokenizer"] == {
        "kind": "file",
        "file": "tokenizer.json",
        "sha256": hashlib.sha256((tmp_path / "words.json").read_bytes()).hexdigest(),
        "path": str(tmp_path / "words.json"),
    }
    assert (folder / "tokenizer.json").read_bytes() == (tmp_path / "words.json").read_bytes()
    first = meta["fingerprint"]
    given.add_tokens(["question"])  # the tokenizer file changes: prepared anew
    given.save(str(tmp_path / "words.json"))
    store.prepare("hamlet", root, settings)
    assert store.load_meta("hamlet", root)["fingerprint"] != first
    assert store.load_tokens("hamlet", root, "test").tolist()[-1] == 5


def test_text_that_is_not_utf8_is_named_with_its_byte_offset(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("fine\n")
    (tmp_path / "texts" / "b.txt").write_bytes("caf\u00e9 ".encode() + b"na\xefve")
    settings = {**TEXT, "path": str(tmp_path / "texts")}
    with pytest.raises(ConfigError, match=r"datasets\.mine: '.*texts/b\.txt' is not UTF-8 text: byte 8 \(0xef\)"):
        store.prepare("mine", tmp_path / "data", settings)
    assert not store.is_ready("mine", tmp_path / "data")


def test_a_missing_tokenizers_library_says_how_to_install_it(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("some text, " * 10)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers raises ImportError
    settings = {**TEXT, "path": str(tmp_path / "a.txt"), "tokenizer": "bpe"}
    for call in (lambda: check_overrides("mine", settings), lambda: store.prepare("mine", tmp_path / "data", settings)):
        with pytest.raises(ConfigError, match=r"datasets\.mine: tokenizer 'bpe': .*pip install 'dpstudy\[text\]'"):
            call()
    store.prepare("mine", tmp_path / "data", {**TEXT, "path": str(tmp_path / "a.txt")})  # bytes need no library


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"tokenizer": "bytes"}, "tokenizer 'bytes' is neither 'byte', 'bpe' nor the path of a tokenizer.json"),
        ({"tokenizer": "nowhere/tok.json"}, "tokenizer file 'nowhere/tok.json' does not exist"),
        ({"vocab_size": 512}, "vocab_size applies to tokenizer 'bpe' only, not to 'byte'"),
        ({"tokenizer": "byte", "vocab_size": 512}, "vocab_size applies to tokenizer 'bpe' only"),
        ({"tokenizer": "TOKFILE", "vocab_size": 512}, "vocab_size applies to tokenizer 'bpe' only"),
        ({"tokenizer": "bpe", "vocab_size": 100}, "vocab_size: 100 is less than the minimum of 257"),
        ({"path": "EMPTY"}, "holds no text: its 1 file(s) are empty"),
        ({"path": "NOTXT"}, "holds no .txt file"),
        ({"path": None}, "a text dataset needs `path`"),
        ({"image_size": 32}, "'image_size' applies to image datasets only, not to source 'text'"),
        ({"test_path": "TEXTS"}, "'test_path' applies to image datasets only"),
        ({"source": "imagefolder", "tokenizer": "bpe", "image_size": 8}, "tokenizer applies to source 'text' only"),
    ],
)
def test_bad_text_settings_are_config_errors_naming_them(tmp_path, settings, message):
    for folder in ("texts", "empty", "notxt"):
        (tmp_path / folder).mkdir()
    (tmp_path / "texts" / "a.txt").write_text("text")
    (tmp_path / "empty" / "a.txt").write_text("")
    (tmp_path / "notxt" / "a.md").write_text("text")
    (tmp_path / "tok.json").write_text("{}")
    places = {"TEXTS": "texts", "EMPTY": "empty", "NOTXT": "notxt", "TOKFILE": "tok.json"}
    settings = {k: str(tmp_path / places[v]) if v in places else v for k, v in {"path": "TEXTS", **settings}.items()}
    settings = {"source": "text", **{k: v for k, v in settings.items() if v is not None}}
    if settings["source"] == "imagefolder":
        settings["path"] = str(tmp_path)
    pattern = message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    with pytest.raises(ConfigError, match=rf"datasets\.mine: .*{pattern}"):
        check_overrides("mine", settings)


@pytest.mark.parametrize(
    "name, overrides, needle",
    [
        ("synthetic_text", {"tokenizer": "bpe"}, "'tokenizer' applies to a dataset of your own"),
        ("tiny_shakespeare", {"vocab_size": 512}, "'vocab_size' applies to a dataset of your own"),
        ("synthetic_text", {"mirror": "http://example.org/"}, "'mirror' applies to downloaded datasets only"),
        ("tiny_shakespeare", {"train_size": 1000}, "'train_size' applies to generated datasets only"),
        ("tiny_shakespeare", {"md5": {"shakespeare.txt": "0" * 32}}, "unknown file 'shakespeare.txt'"),
    ],
)
def test_registry_text_overrides_are_checked_when_the_study_loads(name, overrides, needle):
    study = {
        "datasets": {name: overrides},
        "sweeps": [{"name": "s", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"]}}],
    }
    with pytest.raises(ConfigError, match=needle):
        sweeps.load(study)


def test_a_text_too_short_for_two_splits_is_an_error(tmp_path):
    (tmp_path / "a.txt").write_text("tiny text")  # 9 bytes: 8 train, 1 test
    with pytest.raises(DatasetError, match="dataset 'mine': its test split has 1 token"):
        store.prepare("mine", tmp_path / "data", {**TEXT, "path": str(tmp_path / "a.txt")})
    assert not store.is_ready("mine", tmp_path / "data")


def test_unigram_entropy_and_token_dtypes():
    assert text.unigram_entropy(torch.tensor([0, 1, 2, 3] * 5, dtype=torch.uint8), 256) == pytest.approx(math.log(4))
    assert text.token_dtype(256) == torch.uint8 and text.token_dtype(257) == torch.int32
    with pytest.raises(DatasetError, match="token ids 0..300 outside 0..299"):
        text.as_tokens([0, 300], 300, "dataset 'x'")
