"""The README and docs/ against the tree they describe: the config and record references are their
schemas', every link resolves, and every make target, command and path they name exists. Each
checker is also run on a page made to break it, so that a pass means the docs are right, not that
the checker is blind."""

from __future__ import annotations

from helpers import REPO
from helpers.docs import (
    broken_links,
    doc_files,
    missing_commands_and_paths,
    slug,
    too_long,
    unknown_make_targets,
)

from dpstudy.record import reference as record_reference
from dpstudy.study import reference

README_LINES = 250


def listing(offenders: list[str], what: str) -> str:
    return f"{len(offenders)} {what}:\n  " + "\n  ".join(offenders)


def test_the_config_reference_is_the_schemas():
    current = (REPO / reference.OUT).read_text() == reference.render()
    assert current, f"{reference.OUT} is not generated from dpstudy/study/schema.yaml as it is now: run `make docs`"


def test_the_record_reference_is_the_record_schemas():
    current = (REPO / record_reference.OUT).read_text() == record_reference.render()
    assert current, f"{record_reference.OUT} is not generated from RECORD_SCHEMA as it is now: run `make docs`"


def test_every_link_between_the_readme_and_docs_resolves():
    offenders = broken_links(doc_files(REPO), REPO)
    assert not offenders, listing(offenders, "broken links")


def test_every_make_target_the_docs_name_is_in_the_makefile():
    offenders = unknown_make_targets(doc_files(REPO), REPO / "Makefile", REPO)
    assert not offenders, listing(offenders, "unknown make targets")


def test_every_command_and_path_the_docs_name_exists():
    offenders = missing_commands_and_paths(doc_files(REPO), REPO)
    assert not offenders, listing(offenders, "missing modules and paths")


def test_the_readme_is_short():
    offenders = too_long(REPO / "README.md", README_LINES)
    assert not offenders, listing(offenders, "pages too long (the rest belongs in docs/)")


# The checkers, each on a page made to break it.


def test_slugs_are_githubs():
    assert slug("The C++/CUDA extension") == "the-ccuda-extension"
    assert slug("On a GPU host: `make gpu-check`") == "on-a-gpu-host-make-gpu-check"
    assert slug("`datasets.<name>`") == "datasetsname"
    assert slug("Step 2 — the *fast* [path](x.md)") == "step-2--the-fast-path"


def test_broken_links_and_anchors_are_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text('# A heading\n\n## Twice\n\n## Twice\n\n<a id="kept"></a>\n[up](../README.md#top)\n')
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Top\n\n"
        "[fine](docs/page.md#a-heading), [second of two](docs/page.md#twice-1), [explicit](docs/page.md#kept)\n"
        "[no file](docs/missing.md) and [no anchor](docs/page.md#twice-2)\n"
        "[here](#top) [not here](#nowhere) [web](https://example.com/x.md#y)\n"
        "`[in code](docs/gone.md)`\n```\n[in a block](docs/gone.md)\n```\n"
    )
    assert broken_links([readme, page], tmp_path) == [
        "README.md:4: docs/missing.md (no such file)",
        "README.md:4: docs/page.md#twice-2 (no such anchor)",
        "README.md:5: #nowhere (no such anchor)",
    ]


def test_unknown_make_targets_are_reported(tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text(".PHONY: run phony-only\nVAR := x\nrun: setup\n\techo make never\nsetup:\n\ttrue\n")
    page = tmp_path / "README.md"
    page.write_text(
        "`make run` then `make setup X=1` and `snakemake -n`; make nothing in prose\n"
        "```\nmake phony-only && make VAR   # make comments are words\nsudo make gone\n```\n"
        "`make setup ... WHEELS=DIR`, `make typo`, a span over two lines `make\nbroken`\n"
        "| table | `make setup` |\n"
    )
    assert unknown_make_targets([page], makefile, tmp_path) == [
        "README.md:3: make VAR (no such target)",
        "README.md:4: make gone (no such target)",
        "README.md:6: make typo (no such target)",
        "README.md:6: make broken (no such target)",
    ]


def test_missing_modules_and_paths_are_reported(tmp_path):
    for name in [
        "dpstudy/tool.py",
        "dpstudy/pkg/__main__.py",
        "dpstudy/lib/__init__.py",
        "scripts/a.py",
        "rules/x.smk",
    ]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    page = tmp_path / "README.md"
    page.write_text(
        "`python -m dpstudy.tool`, `python -m dpstudy.pkg`, `.venv/bin/python -m dpstudy.lib` (a package without\n"
        "__main__), `python3 -m dpstudy.gone`\n"
        "`scripts/a.py:12`, `scripts/a.py`, `rules/*.smk`, `rules/`; `scripts/b.py`, `rules/*.py`\n"
        "`config/{name}.yaml`, `config/<study>.yaml`, `results/tables/x.csv`, `~/.cache/docs/x`\n"
        "```\npython benchmarks/gone.py --out results/x   # scripts/in_a_comment.py\n```\n"
    )
    assert missing_commands_and_paths([page], tmp_path) == [
        "README.md:1: python -m dpstudy.lib (no such module)",
        "README.md:2: python -m dpstudy.gone (no such module)",
        "README.md:3: scripts/b.py (no such path)",
        "README.md:3: rules/*.py (no such path)",
        "README.md:6: benchmarks/gone.py (no such path)",
    ]


def test_a_long_readme_is_reported(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("line\n" * README_LINES)
    assert too_long(page, README_LINES) == []
    page.write_text("line\n" * (README_LINES + 1))
    assert too_long(page, README_LINES) == [f"README.md: {README_LINES + 1} lines, more than {README_LINES}"]
