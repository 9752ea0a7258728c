"""The memory allocator a cell's processes get (dpstudy.util.allocator): what each choice means on a
host, how it reaches a process's environment, and what a process reads back about itself. That the
launcher gives it to every rank of a DDP and an FSDP cell: tests/unit/engine/test_train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dpstudy.study.schema import schema
from dpstudy.util import allocator
from dpstudy.util.errors import ConfigError

JEMALLOC = allocator.find_library("jemalloc")


def test_the_schema_offers_the_modules_choices():
    assert tuple(schema()["properties"]["allocator"]["enum"]) == allocator.CHOICES
    assert schema()["properties"]["allocator"]["default"] == "auto"


def test_auto_takes_the_best_library_present_else_tuned_glibc(monkeypatch):
    libraries = {"jemalloc": None, "tcmalloc": "/usr/lib/libtcmalloc_minimal.so.4"}
    monkeypatch.setattr(allocator, "find_library", libraries.get)
    keep_tc, keep_je = {"TCMALLOC_RELEASE_RATE": "0"}, {"MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}
    assert allocator.resolve("auto") == allocator.Setup("tcmalloc", "/usr/lib/libtcmalloc_minimal.so.4", keep_tc)
    libraries["jemalloc"] = "/usr/lib/libjemalloc.so.2"
    assert allocator.resolve("auto") == allocator.Setup("jemalloc", "/usr/lib/libjemalloc.so.2", keep_je)
    assert allocator.resolve("jemalloc") == allocator.resolve("auto")
    monkeypatch.setattr(allocator, "find_library", lambda name: None)
    assert allocator.resolve("auto") == allocator.Setup("glibc", variables=allocator.GLIBC_KEEP)
    assert allocator.resolve("system") == allocator.Setup("system")
    with pytest.raises(ConfigError, match=r"^allocator: 'tcmalloc': no libtcmalloc_minimal.so.4 or"):
        allocator.resolve("tcmalloc")
    with pytest.raises(ConfigError, match=r"^allocator: 'ptmalloc' is not one of auto, jemalloc"):
        allocator.resolve("ptmalloc")


def test_the_environment_preloads_the_library_first_and_keeps_what_was_preloaded():
    setup = allocator.Setup("jemalloc", "/lib/libjemalloc.so.2", {"MALLOC_CONF": "dirty_decay_ms:-1"})
    env = setup.environment({"PATH": "/bin", "LD_PRELOAD": "/lib/libother.so"})
    assert env == {
        "PATH": "/bin",
        "LD_PRELOAD": "/lib/libjemalloc.so.2 /lib/libother.so",
        "MALLOC_CONF": "dirty_decay_ms:-1",
    }
    # options of the user's own come after ours: jemalloc takes the last of a repeated option
    assert setup.environment({"MALLOC_CONF": "narenas:2"})["MALLOC_CONF"] == "dirty_decay_ms:-1,narenas:2"
    glibc = allocator.Setup("glibc", variables=allocator.GLIBC_KEEP).environment({"PATH": "/bin"})
    assert glibc == {"PATH": "/bin", **allocator.GLIBC_KEEP} and int(glibc["MALLOC_TOP_PAD_"]) == 1 << 30
    assert allocator.Setup("system").environment({"PATH": "/bin"}) == {"PATH": "/bin"}


def read_back(choice: str) -> dict:
    """What a fresh process given `choice`'s environment says about its own allocator."""
    env = {k: v for k, v in os.environ.items() if k not in allocator.VARIABLES}
    env = allocator.resolve(choice).environment(env)
    code = "import json; from dpstudy.util import allocator; print(json.dumps(allocator.in_this_process()))"
    return json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


def test_a_process_reads_back_the_allocator_it_was_given():
    assert read_back("system") == {"name": "system", "library": None, "variables": {}}
    assert read_back("glibc") == {"name": "glibc", "library": None, "variables": allocator.GLIBC_KEEP}


@pytest.mark.skipif(JEMALLOC is None, reason="needs libjemalloc2 (make system-packages installs it)")
def test_a_preloaded_jemalloc_is_found_mapped_into_the_process():
    found = read_back("jemalloc")
    keep = allocator.LIBRARY_KEEP["jemalloc"]
    assert found == {"name": "jemalloc", "library": JEMALLOC, "variables": {**keep, "LD_PRELOAD": JEMALLOC}}
    assert read_back("auto")["name"] == "jemalloc"
