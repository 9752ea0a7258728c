"""Text from records is text, end to end: records whose reason, hostname, torch path and cell id hold
markup, the report notebook run by scripts/report.py, and the page opened in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, FLAGS
from helpers.records import make_record, render_report

IMG = """<img src=x onerror="document.title='pwned'">"""
SCRIPT = "<script>document.title='pwned2'</script>"
STUDY = "escaping_study"
MARKDOWN = "*Test* CPU `9000` | $x$ [link](https://e.org)"  # shown as typed, not as emphasis, code or math


def poisoned_records() -> list[dict]:
    """A finished cell on a host named with an <img onerror>, one whose PyTorch came from a path with
    a <script>, and a failed cell whose id and reason hold both."""
    ok = make_record(mode="single", batch=64)
    ok["env"].update(hostname=IMG, cpu=MARKDOWN)
    host_torch = make_record(mode="single", batch=128)
    host_torch["env"].update(torch_provider="host", torch_path=f"/opt/{SCRIPT}/site-packages")
    failed = make_record("failed", mode="ddp", gpus=2, backend="gloo", reason=f"{IMG} {SCRIPT} $x$ | `tick`")
    failed["cell"] += "-`x`|<b>"
    return [ok, host_torch, failed]


@pytest.fixture(scope="module")
def poisoned_report(tmp_path_factory, python3_kernel) -> Path:
    # valid YAML whose block scalar holds a line that would close a ``` fence
    return render_report(
        tmp_path_factory.mktemp("poisoned"),
        poisoned_records(),
        STUDY,
        f"study: {STUDY}\n# {IMG}\nnote: |\n  ```\n  {SCRIPT}\n",
    )


def open_page(path: Path) -> dict:
    """Title, images, scripts, dialogs and visible text of `path` in headless Chromium, offline."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is installed by `make setup`")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is missing; `make test` installs it when it runs as root")
    dialogs: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.route(
                "**/*",
                lambda route: route.continue_() if route.request.url.startswith(("file:", "data:")) else route.abort(),
            )
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(path.resolve().as_uri(), wait_until="load")
            page.wait_for_timeout(300)  # an onerror handler runs after the failed load of its image
            return {
                "title": page.title(),
                "dialogs": dialogs,
                "text": page.inner_text("body"),
                "image_srcs": page.evaluate("() => [...document.images].map(i => i.getAttribute('src'))"),
                "scripts": page.evaluate("() => [...document.scripts].map(s => s.textContent)"),
            }
        finally:
            browser.close()


def test_markup_from_records_shows_as_text_and_nothing_runs(poisoned_report):
    page = open_page(poisoned_report)
    assert page["title"] == f"dpstudy report: {STUDY}"  # not 'pwned' or 'pwned2'
    assert page["dialogs"] == []
    assert "x" not in page["image_srcs"]
    assert not [s for s in page["scripts"] if "pwned" in s]
    text = page["text"]
    for literal in (
        IMG,
        f"/opt/{SCRIPT}/site-packages",
        MARKDOWN,
        f"1 cell failed: {IMG} {SCRIPT} $x$ | `tick` (synthetic-lenet-ddp-g2-b64-gloo-`x`|<b>)",
    ):
        assert literal in text, literal
    # the study config, shown as it is: its own fence cannot end the report's
    assert f"# {IMG}\nnote: |\n  ```\n  {SCRIPT}" in text
