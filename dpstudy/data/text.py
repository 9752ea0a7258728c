"""Text datasets prepared into tokens: the generated text, a downloaded file, a user's own text.

`{split}.pt` holds {"tokens": a 1-D tensor}, uint8 when the vocabulary fits a byte (vocab_size <=
256), else int32; a BPE trained here is saved beside them as tokenizer.json. Every text dataset's
meta.json has `kind: "text"`, `vocab_size`, `tokenizer` ({"kind": "byte"}, {"kind": "bpe", "file",
"sha256"} or, for the user's own tokenizer.json, {"kind": "file", "file", "sha256", "path"}) and
`unigram_entropy_nats`, the entropy of the train split's token frequencies: the loss of a model
that knows only how often each token occurs, the yardstick of what a language model learned.

The split is at the end, as nanoGPT splits tiny_shakespeare: the first (1 - test_fraction) of the
tokens train, the rest test. A BPE is trained on the training text only, so the text is split
first (at the byte of that share, moved back to a character boundary) and each part encoded.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import torch

from dpstudy.data import synthetic_text, user_text
from dpstudy.data.files import save_atomic, sha256_of
from dpstudy.data.registry import BYTES, DATASETS, DatasetError, log
from dpstudy.data.task import TEXT
from dpstudy.data.user import UserDataset
from dpstudy.util.atomic import atomic_output
from dpstudy.util.errors import ConfigError

DOWNLOAD_TEST_FRACTION = 0.1  # tiny_shakespeare: nanoGPT's 90/10 split
TOKENIZER_FILE = "tokenizer.json"


def generate(name: str, folder: Path, params: dict) -> dict[str, Any]:
    """synthetic_text's splits of params' sizes (tokens) from params' seed, written; meta fields."""
    log(name, f"generating {params['train_size']} train + {params['test_size']} test tokens, seed {params['seed']}")
    data = synthetic_text.splits(params["seed"], params["train_size"], params["test_size"])
    splits = {split: as_tokens(text, BYTES) for split, text in data.items()}
    return {**write(name, folder, splits, BYTES, {"kind": user_text.BYTE}), "sources": {}, "generator": params}


def from_download(name: str, folder: Path, file: Path) -> dict[str, Any]:
    """A downloaded text file's bytes as tokens, split 90/10; meta fields but `sources`."""
    data = file.read_bytes()
    n_train = int(len(data) * (1 - DOWNLOAD_TEST_FRACTION))
    splits = {"train": as_tokens(data[:n_train], BYTES), "test": as_tokens(data[n_train:], BYTES)}
    return write(name, folder, splits, DATASETS[name].vocab_size, {"kind": user_text.BYTE})


def from_user(dataset: UserDataset, folder: Path) -> dict[str, Any]:
    """A user's text read, tokenized and split; meta fields but `sources` and `fingerprint`."""
    data = read_text(dataset)
    fraction = dataset.test_fraction or user_text.DEFAULT_TEST_FRACTION
    kind = user_text.tokenizer_kind(dataset.tokenizer, f"datasets.{dataset.name}: ")
    where = f"datasets.{dataset.name}: "
    if kind == user_text.BYTE:
        n_train = int(len(data) * (1 - fraction))
        splits = {"train": as_tokens(data[:n_train], BYTES), "test": as_tokens(data[n_train:], BYTES)}
        return write(dataset.name, folder, splits, BYTES, {"kind": kind})
    vocab_size = user_text.vocab_size(dataset)
    if kind == user_text.BPE:
        n_train = char_boundary(data, int(len(data) * (1 - fraction)))
        train, test = data[:n_train].decode(), data[n_train:].decode()
        tokenizer = train_bpe(dataset.name, train, vocab_size)
        ids = {"train": encode(tokenizer, train), "test": encode(tokenizer, test)}
    else:
        tokenizer = user_text.load_tokenizer(dataset.tokenizer, where)
        every = encode(tokenizer, data.decode())
        n_train = int(len(every) * (1 - fraction))
        ids = {"train": every[:n_train], "test": every[n_train:]}
    with atomic_output(folder / TOKENIZER_FILE) as tmp:
        if kind == user_text.BPE:
            tokenizer.save(str(tmp))
        else:
            shutil.copyfile(dataset.tokenizer, tmp)
    described = {"kind": kind, "file": TOKENIZER_FILE, "sha256": sha256_of(folder / TOKENIZER_FILE)}
    if kind == user_text.FILE:
        described["path"] = dataset.tokenizer
    source = f"{where}tokenizer {dataset.tokenizer!r}"
    splits = {split: as_tokens(values, vocab_size, source) for split, values in ids.items()}
    return write(dataset.name, folder, splits, vocab_size, described)


def read_text(dataset: UserDataset) -> bytes:
    """Every text file's bytes, concatenated in order; ConfigError naming a file that is not
    UTF-8 and the offset of its first bad byte, or text that is all empty."""
    parts = []
    for file in user_text.text_files(dataset.path, f"datasets.{dataset.name}: path: "):
        data = file.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ConfigError(
                f"datasets.{dataset.name}: {str(file)!r} is not UTF-8 text: byte {error.start} "
                f"(0x{data[error.start]:02x}) {error.reason}"
            ) from error
        parts.append(data)
    data = b"".join(parts)
    if not data:
        raise ConfigError(f"datasets.{dataset.name}: path {dataset.path!r} holds no text")
    log(dataset.name, f"read {len(data):,} bytes of text from {len(parts)} file(s) under {dataset.path}")
    return data


def char_boundary(data: bytes, at: int) -> int:
    """`at`, moved back past UTF-8 continuation bytes (10xxxxxx) to the start of a character."""
    while 0 < at < len(data) and data[at] & 0xC0 == 0x80:
        at -= 1
    return at


def train_bpe(name: str, text: str, vocab_size: int):
    """A byte-level BPE of at most `vocab_size` symbols trained on `text` (Hugging Face's
    tokenizers; fewer symbols when the text has fewer pairs worth merging)."""
    tk = user_text.tokenizers_library(f"datasets.{name}: tokenizer 'bpe': ")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    alphabet = tk.pre_tokenizers.ByteLevel.alphabet()  # every byte, so any text encodes
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator([text], trainer=trainer)
    log(name, f"trained a byte-level BPE of {tokenizer.get_vocab_size()} symbols on the training text")
    return tokenizer


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids if text else []


def token_dtype(vocab_size: int) -> torch.dtype:
    return torch.uint8 if vocab_size <= 256 else torch.int32


def as_tokens(values, vocab_size: int, where: str = "") -> torch.Tensor:
    """A 1-D token tensor of the compact dtype; DatasetError for an id outside the vocabulary."""
    if isinstance(values, bytes | bytearray):
        tokens = torch.frombuffer(bytearray(values), dtype=torch.uint8) if values else torch.empty(0, dtype=torch.uint8)
    else:
        tokens = torch.tensor(values, dtype=torch.int64)
    if len(tokens) and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab_size:
        raise DatasetError(f"{where}: token ids {int(tokens.min())}..{int(tokens.max())} outside 0..{vocab_size - 1}")
    return tokens.to(token_dtype(vocab_size)).contiguous()


def unigram_entropy(tokens: torch.Tensor, vocab_size: int) -> float:
    """Entropy (nats) of the tokens' frequencies."""
    counts = torch.bincount(tokens.long(), minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum()) if len(p) else math.nan


def write(name: str, folder: Path, splits: dict[str, torch.Tensor], vocab_size: int, tokenizer: dict) -> dict:
    """Write train.pt and test.pt ({"tokens": ...}); return the meta fields that describe them."""
    if "file" not in tokenizer:
        (folder / TOKENIZER_FILE).unlink(missing_ok=True)  # a BPE of an earlier preparation
    entries = {}
    for split, tokens in splits.items():
        if len(tokens) < 2:
            raise DatasetError(
                f"dataset {name!r}: its {split} split has {len(tokens)} token(s), too few (at least 2): "
                "give more text, or a test_fraction that leaves both splits some"
            )
        file = f"{split}.pt"
        save_atomic(folder / file, {"tokens": tokens})
        entries[split] = {"n": len(tokens), "file": file, "sha256": sha256_of(folder / file)}
        log(name, f"wrote {len(tokens):,} {split} tokens")
    return {
        "name": name,
        "kind": TEXT,
        "vocab_size": vocab_size,
        "tokenizer": tokenizer,
        "splits": entries,
        "unigram_entropy_nats": unigram_entropy(splits["train"], vocab_size),
    }
