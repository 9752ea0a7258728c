"""Text from records is text: what dpstudy.report.text.text()/code() and the report's markdown makers
give shows, once nbconvert renders it, exactly the characters the record held, and no tag or
markdown construct the record smuggled in."""

from __future__ import annotations

import io
from html.parser import HTMLParser

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from helpers.records import CURRENT, make_record, small_grid, write_records
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from dpstudy.analysis import collect
from dpstudy.report import inventory
from dpstudy.report.figures import layout
from dpstudy.report.text import Safe, code, code_block, markdown_table, more_in, not_run_lines, text

IMG = """<img src=x onerror="document.title='pwned'">"""
SCRIPT = "<script>document.title='pwned2'</script>"
PAYLOADS = [
    IMG,
    SCRIPT,
    "`tick` and ``two ticks`` and a lone ` tick",
    "a | b || c",
    "$x$ and $$y^2$$ cost $5",
    r"*star* **bold** _under_ __dunder__ snake_case_ a__b \backslash\ ~~strike~~",
    "[link](javascript:alert(1)) ![i](x) <https://e.org>",
    "# heading",
    "## heading #",
    "- item",
    "+ item",
    "* item",
    "1. item",
    "12) item",
    "> quote",
    "---",
    "===",
    "https://e.org/<b>?a=1&b=2_x_",
    "&lt; entity &amp; &#36; &#0;",
    "<!-- comment --> <b onclick='x'>b</b>",
    "tab\there",
    "{curly} ^caret^ ==mark== :smile: [^1]",
    "ends with backslash \\",
    "-0.430",
    "3.14",
]


class Page(HTMLParser):
    """The text a browser would show for an HTML fragment, and the tags it would make."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.text, self.tags, self.links = "", [], []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.links += [value for name, value in attrs if tag == "a" and name == "href"]

    def handle_data(self, data):
        self.text += data


def rendered(markdown: str) -> Page:
    """`markdown` as the report's HTML has it (nbconvert's markdown2html, mistune)."""
    return Page(markdown2html_mistune(markdown))


def shown(markdown: str) -> str:
    """The visible text of rendered `markdown`, whitespace as a browser collapses it."""
    return " ".join(rendered(markdown).text.replace("\u00b6", "").split())


def squeeze(value: str) -> str:
    return " ".join(value.split())


# ---- text() and code() ------------------------------------------------------------------------


@pytest.mark.parametrize("value", PAYLOADS)
def test_text_renders_as_exactly_its_characters(value):
    page = rendered(text(value))
    assert page.tags == ["p"]  # one paragraph: no heading, list, quote, link, code, emphasis, image, script
    assert squeeze(page.text) == squeeze(value)


@pytest.mark.parametrize("value", PAYLOADS)
def test_text_inside_a_sentence_and_a_list_item(value):
    page = rendered(f"- the reason: {text(value)} (`cell`)")
    assert page.tags == ["ul", "li", "code"]
    assert squeeze(page.text) == squeeze(f"the reason: {value} (cell)")


@pytest.mark.parametrize("value", PAYLOADS)
def test_code_renders_as_inline_code_of_exactly_its_characters(value):
    page = rendered(f"cell {code(value)} ran")
    assert page.tags == ["p", "code"]
    assert squeeze(page.text) == squeeze(f"cell {value} ran")


def test_text_and_code_are_one_line_and_blank_for_missing_values():
    assert text("a\n# b\r\n- c") == r"a \# b - c"  # joined: the - no longer starts a line
    assert text(None) == text(float("nan")) == text(pd.NA) == code(None) == ""
    assert text(IMG) == """&lt;img src=x onerror="document.title='pwned'"&gt;"""
    assert text(SCRIPT) == "&lt;script&gt;document.title='pwned2'&lt;/script&gt;"
    assert code(SCRIPT) == f"`{SCRIPT}`"  # markdown shows HTML in inline code as it is


def test_plain_ids_keep_their_backticks_and_safe_text_is_not_escaped_twice():
    assert code("synthetic-lenet-ddp-g2-b64-gloo") == "`synthetic-lenet-ddp-g2-b64-gloo`"
    assert code("a|b").startswith("<code>") and code("a`b").startswith("<code>")
    once = text("_a_ b_c <d>")
    assert isinstance(once, Safe) and text(once) == once == r"\_a\_ b_c &lt;d&gt;"  # snake_case needs no escape
    assert text(code("x")) == "`x`"


def test_code_block_cannot_be_closed_by_its_content():
    content = f"study: s\n```\n{IMG}\n````yaml\n  key: `v`\n"
    block = code_block(content, "yaml")
    assert block.startswith("`````yaml\n") and block.endswith("\n`````")
    page = rendered("before\n\n" + block + "\n\nafter")
    assert "img" not in page.tags and "script" not in page.tags
    assert content.strip() in page.text and page.text.rstrip().endswith("after")


# ---- tables and not-run lines -----------------------------------------------------------------


def table_cells(markdown: str) -> list[str]:
    """The text of every th and td of the rendered table, in order."""
    cells: list[str] = []

    class Cells(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag in ("th", "td"):
                cells.append("")

        def handle_data(self, data):
            if cells:
                cells[-1] += data

    Cells(convert_charrefs=True).feed(markdown2html_mistune(markdown))
    return [c.strip() for c in cells]


def test_markdown_table_escapes_headers_and_values_and_keeps_safe_ones():
    values = [IMG, SCRIPT, "a | b", "$x$", "`t`", "*s*", "-0.430"]
    table = pd.DataFrame(
        {f"{IMG} |": pd.Series(values, dtype=object), "cell": pd.Series([code(v) for v in values], dtype=object)}
    )
    markdown = markdown_table(table)
    assert "| -0.430 | `-0.430` |" in markdown
    assert table_cells(markdown) == [f"{IMG} |", "cell", *[v for pair in zip(values, values) for v in pair]]
    page = rendered(markdown)
    assert "img" not in page.tags and "script" not in page.tags and page.tags.count("code") == len(values)


def test_markdown_table_keeps_markdown_when_asked():
    markdown = markdown_table(pd.DataFrame({"a": [r"**b** c\_d"]}), escape=False)
    assert markdown.splitlines()[-1] == r"| **b** c\_d |"


def test_not_run_lines_escape_for_markdown_and_stay_plain_for_figures():
    rows = pd.DataFrame(
        {"status": ["failed", "failed", "skipped"], "reason": [IMG, IMG, "$x$ * 2"], "cell": ["a|b", "c`d", "e_f"]}
    )
    lines = not_run_lines(rows, "cell", lambda r: code(r.cell))
    assert [shown(line) for line in lines] == [f"2 cells failed: {IMG} (a|b, c`d)", "1 cell skipped: $x$ * 2 (e_f)"]
    named = not_run_lines(rows, "cell", lambda r: r.cell)
    assert shown(named[0]) == f"2 cells failed: {IMG} (a|b, c`d)" and "<img" not in named[0]
    assert not_run_lines(rows, "cell", lambda r: r.cell, markdown=False) == [
        f"2 cells failed: {IMG} (a|b, c`d)",
        "1 cell skipped: $x$ * 2 (e_f)",
    ]


# ---- the inventory ----------------------------------------------------------------------------


@pytest.fixture
def poisoned(tmp_path) -> pd.DataFrame:
    """cells.csv's rows with every string column a record can fill holding markup."""
    records = small_grid()
    cells = collect.summarise(collect.collect(write_records(tmp_path, records), CURRENT))["cells"]
    fields = {
        "hostname": IMG,
        "cpu": "*Test* CPU `9000` | $x$",
        "torch": SCRIPT,
        "torch_path": f"/opt/{IMG}/torch",
        "torch_provider": "host",
        "git_commit": "[commit](javascript:x)",
        "source_hash": "_hash_",
        "gpu_names": f"GPU {SCRIPT}; GPU {SCRIPT}",
        "scheduler": "slurm",
        "job_id": "7 <b>bold</b>",
        "rank_nodes": f"n1; {IMG}",
        "python": "3.11 ~~x~~",
        "allocator": f"jemalloc (/lib/{IMG})",
    }
    cells = cells.assign(**fields, cell=cells["cell"] + " `x` | " + SCRIPT)
    return cells.assign(reason=cells["reason"].where(cells["reason"].isna(), IMG + " $x$ | *y*"))


def assert_literal(markdown: str, *values: str) -> None:
    page = rendered(markdown)
    assert "img" not in page.tags and "script" not in page.tags, page.tags
    assert all(link.startswith("#") for link in page.links), page.links  # a heading's anchor at most
    for value in values:
        assert squeeze(value) in squeeze(page.text), value


def test_environment_shows_the_records_strings_as_text(poisoned):
    assert_literal(
        inventory.environment(poisoned, f"study {IMG}"),
        f"study {IMG}",
        IMG,
        "*Test* CPU `9000` | $x$",
        SCRIPT,
        f"/opt/{IMG}/torch",
        "[commit](javascript:x)",
        "_hash_",
        f"2 x GPU {SCRIPT}",
        "7 <b>bold</b>",
        "3.11 ~~x~~",
        f"jemalloc (/lib/{IMG})",
    )


def test_not_run_stale_and_listing_show_the_records_strings_as_text(poisoned):
    failed = poisoned[poisoned["status"] != "ok"]
    assert_literal(inventory.not_run(poisoned), IMG + " $x$ | *y*", *failed["cell"])
    assert_literal(
        inventory.stale(poisoned.assign(stale=True), "tables/```/stale.txt"),
        *poisoned["cell"],
        "--forcerun $(cat tables/```/stale.txt)",
    )
    listing = inventory.cell_listing(poisoned)
    ok = poisoned[poisoned["status"] == "ok"]["cell"]
    assert_literal(listing, *ok)
    assert [c for c in table_cells(listing) if c.startswith("synthetic")] == list(ok)


def test_configuration_shows_the_file_as_it_is(tmp_path):
    config = tmp_path / "study `x`.yaml"
    config.write_text(f"study: s\n# {IMG}\n```\n{SCRIPT}\nsweeps: []\n")
    markdown = inventory.configuration(config)
    assert markdown.startswith("## Configuration\n\n")
    assert_literal(markdown, str(config), IMG, SCRIPT, "```")


# ---- figures: a note's $ is a dollar sign, not mathtext --------------------------------------


def test_figure_notes_show_reasons_literally(tmp_path):
    reason = r"cost $\notacommand{x}$ and $5 " + IMG
    cells = collect.summarise(
        collect.collect(
            write_records(tmp_path, [make_record("failed", mode="ddp", gpus=2, backend="gloo", reason=reason)]), CURRENT
        )
    )["cells"]
    fig = layout.message("No cell finished: costs $1 $2.", "title", cells)
    fig.savefig(io.BytesIO(), format="png")  # mathtext would raise on \notacommand
    texts = "\n".join(t.get_text() for t in fig.findobj(plt.Text))
    assert reason in texts and "No cell finished: costs $1 $2." in texts
    plt.close(fig)


def test_a_list_cut_short_says_how_many_more_and_where():
    assert more_in(3, "results/tables/util.csv", "cell") == "... 3 more cells in `results/tables/util.csv`."
    assert more_in(2, "results/tables/settings.csv") == "... 2 more in `results/tables/settings.csv`."
    assert more_in(1, "cells.csv", "reason", markdown=False) == "... 1 more reason in cells.csv."  # a figure's note
