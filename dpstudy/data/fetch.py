"""Downloading a dataset's files and verifying each against its MD5, for every downloaded dataset.

The official locations and checksums are torchvision's for its datasets (dpstudy.data.download, one
source of truth) and TEXT_SOURCES' for the text datasets; the config may replace them (`mirror`,
`md5`). Plain urllib, no torchvision: a text dataset's download imports neither torch nor it.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import urllib.request
from pathlib import Path

from dpstudy.data.registry import DatasetError, log
from dpstudy.util.errors import ConfigError

TIMEOUT_ENV = "DPSTUDY_DOWNLOAD_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
USER_AGENT = "dpstudy"  # some servers refuse urllib's default agent

# Text datasets: (base URL, {file: md5}). tiny_shakespeare's MD5 was computed from the file in git
# (karpathy/char-rnn, commit 6f9487a, unchanged since its first commit 370cbcd): 1,115,394 bytes,
# SHA-256 86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed, the checksum Hugging
# Face datasets' tiny_shakespeare records for this URL (its dataset_infos.json).
TEXT_SOURCES: dict[str, tuple[str, dict[str, str]]] = {
    "tiny_shakespeare": (
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare",
        {"input.txt": "6fb458f1232090904fb40fe944165e91"},
    ),
}


def official_mirrors(name: str) -> list[str]:
    """Base URLs to try in order; a file's URL is base + '/' + file name."""
    if name in TEXT_SOURCES:
        return [TEXT_SOURCES[name][0]]
    from dpstudy.data import download  # torchvision's lists

    return download.official_mirrors(name)


def official_md5(name: str) -> dict[str, str]:
    if name in TEXT_SOURCES:
        return dict(TEXT_SOURCES[name][1])
    from dpstudy.data import download

    return download.official_md5(name)


def fetch(name: str, files: tuple[str, ...], raw: Path, overrides: dict) -> dict[str, str]:
    """Download every missing file into raw/ and verify it; return {file: md5}.

    A file is moved to its final name only after its checksum matched, so whatever sits in
    raw/ under a real name was verified, and a killed download leaves just a `.part` file.
    """
    md5s = {**official_md5(name), **overrides.get("md5", {})}
    mirrors = [overrides["mirror"]] if "mirror" in overrides else official_mirrors(name)
    raw.mkdir(parents=True, exist_ok=True)
    for file in files:
        if (raw / file).is_file() and md5_of(raw / file) == md5s[file]:
            log(name, f"{file}: already downloaded and verified")
            continue
        (raw / file).unlink(missing_ok=True)
        _download_verified(name, file, raw, mirrors, md5s[file])
    return {file: md5s[file] for file in files}


def md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _download_verified(name: str, file: str, raw: Path, mirrors: list[str], expected: str) -> None:
    part = raw / f".{file}.part"
    _download_any(name, file, part, [m.rstrip("/") + "/" + file for m in mirrors])
    actual = md5_of(part)
    if actual != expected:
        part.unlink()  # a retry must download again
        raise DatasetError(
            f"dataset {name!r}: checksum mismatch for {file}: expected md5 {expected}, "
            f"got {actual}; the download was deleted"
        )
    part.rename(raw / file)
    log(name, f"{file}: verified md5 {actual}")


def _download_any(name: str, file: str, part: Path, urls: list[str]) -> None:
    """Download from the first URL that answers; DatasetError naming every URL otherwise."""
    failures = []
    timeout = download_timeout()
    for url in urls:
        log(name, f"downloading {file} from {url}")
        try:
            _get(url, part, timeout)
            return
        except (OSError, http.client.HTTPException, ValueError) as e:  # ValueError: a malformed URL
            failures.append(f"{url} ({e})")
    part.unlink(missing_ok=True)
    raise DatasetError(f"dataset {name!r}: cannot download {file} from " + "; ".join(failures))


def _get(url: str, part: Path, timeout: float) -> None:
    """GET `url` into `part` (redirects followed); `timeout` bounds the connection and every read."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(part, "wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)


def download_timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        timeout = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        timeout = -1.0
    if not timeout > 0:
        raise ConfigError(f"{TIMEOUT_ENV}={text!r} is not a positive number of seconds")
    return timeout
