"""Execute the report notebook with papermill and convert it to a self-contained HTML page.

    python scripts/report.py --notebook notebooks/report.ipynb --out-dir results/report \\
        --study NAME --config PATH --tables results/tables --figures results/figures --bench results/bench

Writes OUT_DIR/report.ipynb (executed) and OUT_DIR/report.html (code hidden, figures embedded
as data URIs, markdown's HTML sanitised); each appears complete or not at all.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import bleach
import nbformat
import papermill
from nbconvert import HTMLExporter

from dpstudy.util.atomic import atomic_output


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebook", type=Path, required=True, help="the papermill template")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--study", required=True, help="study name shown in the report")
    parser.add_argument("--config", required=True, help="the study's config file, shown in the report")
    parser.add_argument("--tables", required=True, help="folder written by scripts/collect.py")
    parser.add_argument("--figures", required=True, help="folder written by scripts/figures.py")
    parser.add_argument("--bench", required=True, help="folder of kernels.csv / comm.csv (may be missing)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name")
    return parser.parse_args(argv)


TEMPLATES = Path(__file__).resolve().parent.parent / "notebooks" / "templates"


# What the report's markdown renders to (headings, paragraphs, lists, tables, emphasis, code, the
# highlighted YAML). nbconvert's own clean_html lacks headings, paragraphs and table heads.
TAGS = frozenset(
    {
        *bleach.ALLOWED_TAGS,
        "p",
        "br",
        "hr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "div",
        "span",
        "pre",
        "del",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
    }
)
ATTRIBUTES = {**bleach.ALLOWED_ATTRIBUTES, "*": ["class", "id"]}


def clean_html(element: str | bytes) -> str:
    """Defence in depth behind dpstudy.report.text.text(): in markdown's HTML, a tag the report does not
    make (<img onerror>, <script>) is shown as text, an attribute it does not use (onclick, style) is
    dropped, and a link goes only to http(s), mailto or within the page."""
    element = element.decode() if isinstance(element, bytes) else str(element)
    return bleach.clean(element, tags=TAGS, attributes=ATTRIBUTES)


def html(notebook: nbformat.NotebookNode, title: str) -> str:
    """Code hidden, figures embedded, and no script from a CDN: the page works offline. Markdown and
    HTML outputs are sanitised; the figures are PNG outputs, embedded as they are."""
    exporter = HTMLExporter(
        template_name="offline",
        extra_template_basedirs=[str(TEMPLATES)],
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        sanitize_html=True,
        filters={"clean_html": clean_html},
    )
    body, _ = exporter.from_notebook_node(notebook, resources={"metadata": {"name": title}})
    return body


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parameters = {
        "study": args.study,
        "config_path": args.config,
        "tables_dir": args.tables,
        "figures_dir": args.figures,
        "bench_dir": args.bench,
    }
    out_ipynb, out_html = args.out_dir / "report.ipynb", args.out_dir / "report.html"
    with atomic_output(out_ipynb) as tmp:
        # The kernel runs here, so the relative paths above mean what they mean to the caller.
        papermill.execute_notebook(
            str(args.notebook),
            str(tmp),
            parameters=parameters,
            kernel_name=args.kernel,
            cwd=os.getcwd(),
            progress_bar=False,
        )
        notebook = nbformat.read(tmp, as_version=4)
    with atomic_output(out_html) as tmp:
        tmp.write_text(html(notebook, f"dpstudy report: {args.study}"), encoding="utf-8")
    print(f"wrote {out_ipynb}\nwrote {out_html}")
    return 0


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
