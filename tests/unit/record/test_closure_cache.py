"""Import closures kept on disk: found again for the same files, read afresh after any change."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpstudy.record import closure_cache


def lookup(starts, package):
    return closure_cache.lookup(closure_cache.entry(starts, package))


def store(starts, package, found):
    closure_cache.store(closure_cache.entry(starts, package), found)


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(closure_cache.ENV, str(tmp_path / "cache"))
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (root / name).write_text(f"# {name}\n")
    return root


def test_a_closure_is_found_again_until_a_file_it_may_read_changes(package, tmp_path):
    starts, found = [package / "a.py"], [package / "a.py", package / "sub" / "b.py"]
    assert lookup(starts, package) is None
    store(starts, package, found)
    assert lookup(starts, package) == found
    assert lookup([package / "sub" / "b.py"], package) is None  # other roots, other entry
    # an edit (its size), a touch (its time), a new file, a renamed one: each a state of its own
    changes = [
        lambda: (package / "sub" / "b.py").write_text("import pkg.a\n"),
        lambda: os.utime(package / "a.py", ns=(1, 1)),
        lambda: (package / "sub" / "schema.yaml").write_text("x: 1\n"),
        lambda: (package / "sub" / "schema.yaml").rename(package / "sub" / "defaults.yaml"),
    ]
    for change in changes:
        change()
        assert lookup(starts, package) is None
        store(starts, package, found)
        assert lookup(starts, package) == found
    # a file back as it was (its time too) is that state again; byte-code caches are no state
    (package / "sub" / "defaults.yaml").unlink()
    assert lookup(starts, package) == found
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert lookup(starts, package) == found


def test_entries_unused_for_long_go_when_one_is_written(package, tmp_path):
    old = tmp_path / "cache" / "0123.json"
    old.parent.mkdir()
    old.write_text("[]")
    os.utime(old, (0, 0))
    store([package / "a.py"], package, [package / "a.py"])
    assert not old.exists() and len(list(old.parent.iterdir())) == 1


def test_off_or_unwritable_the_closure_is_read_each_time(package, tmp_path, monkeypatch):
    monkeypatch.setenv(closure_cache.ENV, "off")
    store([package / "a.py"], package, [package / "a.py"])
    assert lookup([package / "a.py"], package) is None
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(closure_cache.ENV, str(blocker / "cache"))  # a folder below a file
    store([package / "a.py"], package, [package / "a.py"])
    assert lookup([package / "a.py"], package) is None


def test_a_process_reads_the_training_closure_from_the_cache(tmp_path):
    # A new process (a rank, a Snakemake start) finds the closure an earlier one stored: the same
    # files, without parsing a module.
    code = (
        "import json; from dpstudy.record import provenance; paths = provenance.training_paths(); "
        "print(json.dumps([provenance._names_in.cache_info().misses, list(map(str, paths))]))"
    )
    env = {**os.environ, closure_cache.ENV: str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)]
    runs.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True))
    (first_parsed, first), (second_parsed, second) = (json.loads(r.stdout) for r in runs)
    assert first == second and len(first) > 50
    assert first_parsed > 50 and second_parsed == 0
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
