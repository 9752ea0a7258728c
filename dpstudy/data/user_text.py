"""A user's own text (dpstudy.data.user's `text` source): its settings checked, its files listed and
fingerprinted, its vocabulary known, all without torch (the Snakefile does these when it plans).

  path           a text file, or a folder whose *.txt files (recursively) are read in sorted order,
                 concatenated as they are
  tokenizer      byte (default: the UTF-8 bytes, 256 symbols), bpe (a byte-level BPE trained on the
                 training split, `vocab_size` symbols, default 2048) or the path of a Hugging Face
                 tokenizer.json (its own vocabulary); bpe and a file need the `tokenizers` library
  test_fraction  the last share of the tokens held out for testing (default 0.1)

Reading and tokenizing the text is dpstudy.data.text's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dpstudy.data.registry import BYTES
from dpstudy.util.errors import ConfigError

# the functions take a dpstudy.data.user.UserDataset, which imports this module: not imported here
UserDataset = Any

SOURCE = "text"
BYTE, BPE, FILE = "byte", "bpe", "file"  # tokenizer kinds; FILE: the user's tokenizer.json
DEFAULT_VOCAB_SIZE = 2048
DEFAULT_TEST_FRACTION = 0.1
# A text dataset's settings (dpstudy.data.user.settings_of); the image-only ones are refused.
SETTINGS = ("source", "path", "test_fraction", "tokenizer", "vocab_size")
IMAGE_ONLY = ("test_path", "image_size", "channels", "args")
INSTALL = "install the `text` extra: pip install 'dpstudy[text]', or make setup EXTRAS=...,text"


def check(dataset: UserDataset, settings: dict[str, Any], where: str) -> None:
    """ConfigError naming the setting of a text dataset that cannot work."""
    for key in IMAGE_ONLY:
        if settings.get(key) not in (None, {}):
            raise ConfigError(f"{where}{key!r} applies to image datasets only, not to source {SOURCE!r}")
    if not dataset.path:
        raise ConfigError(f"{where}a text dataset needs `path` (a text file or a folder of .txt files)")
    files = text_files(dataset.path, f"{where}path: ")
    if not any(file.stat().st_size for file in files):
        raise ConfigError(f"{where}path: {dataset.path!r} holds no text: its {len(files)} file(s) are empty")
    kind = tokenizer_kind(dataset.tokenizer, where)
    if dataset.vocab_size is not None and kind != BPE:
        raise ConfigError(
            f"{where}vocab_size applies to tokenizer {BPE!r} only, not to {dataset.tokenizer or BYTE!r} "
            f"({'256 bytes' if kind == BYTE else 'the file sets its vocabulary'})"
        )
    if kind != BYTE:
        tokenizers_library(f"{where}tokenizer {dataset.tokenizer!r}: ")


def tokenizer_kind(tokenizer: str | None, where: str = "") -> str:
    """BYTE, BPE or FILE; ConfigError for any other value or a tokenizer file that is not there."""
    if tokenizer in (None, BYTE):
        return BYTE
    if tokenizer == BPE:
        return BPE
    if not tokenizer.endswith(".json"):
        raise ConfigError(
            f"{where}tokenizer {tokenizer!r} is neither {BYTE!r}, {BPE!r} nor the path of a tokenizer.json"
        )
    if not Path(tokenizer).is_file():
        raise ConfigError(
            f"{where}tokenizer file {tokenizer!r} does not exist "
            f"(relative paths start where Snakemake runs: {os.getcwd()})"
        )
    return FILE


def text_files(path: str, where: str = "") -> list[Path]:
    """The file at `path`, or a folder's *.txt files sorted by their path within it."""
    root = Path(path)
    if not root.exists():
        raise ConfigError(f"{where}{path!r} does not exist (relative paths start where Snakemake runs: {os.getcwd()})")
    if root.is_file():
        files = [root]
    else:
        files = sorted((p for p in root.rglob("*.txt") if p.is_file()), key=lambda p: p.relative_to(root).parts)
        if not files:
            raise ConfigError(f"{where}{path!r} holds no .txt file")
    unreadable = [p for p in files if not os.access(p, os.R_OK)]
    if unreadable:
        raise ConfigError(f"{where}{len(unreadable)} text file(s) cannot be read, e.g. {str(unreadable[0])!r}")
    return files


def fingerprint_parts(dataset: UserDataset) -> list[str]:
    """What preparing reads besides the settings: every text file's and a tokenizer file's path,
    size and modification time."""
    files = text_files(dataset.path)
    if tokenizer_kind(dataset.tokenizer) == FILE:
        files.append(Path(dataset.tokenizer))
    parts = []
    for file in files:
        stat = file.stat()
        parts.append(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\0")
    return parts


def vocab_size(dataset: UserDataset) -> int:
    """The symbols the dataset's tokens are drawn from, known before it is prepared: 256 bytes,
    the BPE's vocab_size, or a tokenizer file's vocabulary (loaded, not trained)."""
    kind = tokenizer_kind(dataset.tokenizer, f"datasets.{dataset.name}: ")
    if kind == BYTE:
        return BYTES
    if kind == BPE:
        return dataset.vocab_size or DEFAULT_VOCAB_SIZE
    return load_tokenizer(dataset.tokenizer, f"datasets.{dataset.name}: ").get_vocab_size(with_added_tokens=True)


def load_tokenizer(path: str, where: str = ""):
    """A tokenizer.json as a tokenizers.Tokenizer; ConfigError naming the file when it is not one."""
    library = tokenizers_library(f"{where}tokenizer {path!r}: ")
    try:
        return library.Tokenizer.from_file(path)
    except Exception as error:  # the library raises plain Exceptions for a malformed file
        raise ConfigError(f"{where}tokenizer file {path!r} is not a tokenizers JSON file: {error}") from error


def tokenizers_library(where: str = ""):
    """The `tokenizers` module; ConfigError that says how to install it when it is missing."""
    try:
        import tokenizers
    except ImportError as error:
        raise ConfigError(f"{where}needs the `tokenizers` library, which is not installed: {INSTALL}") from error
    return tokenizers
