"""The machine's cache of built libraries (dpstudy.ext.cache): a build of the same inputs in another
folder copies the stored library instead of compiling; anything else that changes the library
compiles. The compiler is replaced by a stand-in that counts its calls; the real compile and its
entry are what the session's builds (the default study, results/ext-test) run through."""

from __future__ import annotations

import json
import threading
import time

import pytest

from dpstudy.ext import builder, cache


@pytest.fixture
def compiles(monkeypatch, tmp_path):
    """The folders the stand-in compiler built into, in order; the cache in tmp_path/cache."""
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    done = []

    def compile_(out, plan, expected, cxx):
        time.sleep(0.2)  # long enough for a second build of the same key to wait on the lock
        (out / builder.SO_NAME).write_bytes(f"library {len(done)}".encode())
        done.append(out)
        return {**expected, "so": str(out / builder.SO_NAME), "ops": list(builder.OPS), "cxx": cxx, "build_s": 0.2}

    monkeypatch.setattr(builder, "_compile", compile_)
    return done


def test_a_second_folder_copies_the_stored_build(compiles, tmp_path):
    first = builder.build(tmp_path / "a", cpu_only=True)
    second = builder.build(tmp_path / "b", cpu_only=True)
    assert compiles == [tmp_path / "a"]
    assert first["cache"].startswith("compiled here, stored in ") and second["cache"].startswith("copied from ")
    assert (tmp_path / "b" / builder.SO_NAME).read_bytes() == b"library 0"
    assert second["so"] == str(tmp_path / "b" / builder.SO_NAME)  # its own folder's copy, not the entry's
    assert json.loads((tmp_path / "b/build.json").read_text()) == second
    assert {k: v for k, v in second.items() if k not in ("so", "cache")} == {
        k: v for k, v in first.items() if k not in ("so", "cache")
    }
    # up to date in its own folder: neither compiled nor copied again
    assert builder.build(tmp_path / "b", cpu_only=True) == second and compiles == [tmp_path / "a"]


def test_two_builds_of_one_key_at_once_compile_once(compiles, tmp_path):
    results = {}
    threads = [
        threading.Thread(target=lambda name=name: results.update({name: builder.build(tmp_path / name, cpu_only=True)}))
        for name in ("a", "b")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(compiles) == 1
    assert sorted(info["cache"].split(" ")[0] for info in results.values()) == ["compiled", "copied"]


def test_force_other_inputs_and_the_cache_off_compile(compiles, tmp_path, monkeypatch):
    builder.build(tmp_path / "a", cpu_only=True)
    builder.build(tmp_path / "b", cpu_only=True, force=True)  # anew, and the entry replaced
    assert compiles == [tmp_path / "a", tmp_path / "b"]
    assert builder.build(tmp_path / "c", cpu_only=True)["cache"].startswith("copied from ")
    assert (tmp_path / "c" / builder.SO_NAME).read_bytes() == b"library 1"
    monkeypatch.setattr(builder, "CFLAGS", [*builder.CFLAGS, "-DOTHER"])  # another library
    builder.build(tmp_path / "d", cpu_only=True)
    monkeypatch.setenv(cache.ENV, "off")
    assert builder.build(tmp_path / "e", cpu_only=True)["cache"] == "off"
    assert compiles[2:] == [tmp_path / "d", tmp_path / "e"]


def test_an_entry_without_its_library_or_of_other_inputs_is_not_used(compiles, tmp_path):
    builder.build(tmp_path / "a", cpu_only=True)
    (entry,) = [p for p in (tmp_path / "cache").iterdir()]
    (entry / cache.LIBRARY).unlink()  # a library someone deleted
    builder.build(tmp_path / "b", cpu_only=True)
    assert compiles == [tmp_path / "a", tmp_path / "b"]
    stored = json.loads((entry / "build.json").read_text())
    assert cache.lookup(entry, {**stored["inputs"], "torch": "0.0"}) is None
    assert cache.lookup(entry, stored["inputs"])["so"] == str(tmp_path / "b" / builder.SO_NAME)


def test_the_default_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.folder() == tmp_path / "dpstudy" / "ext"
    monkeypatch.setenv(cache.ENV, "OFF")
    assert cache.folder() is None
