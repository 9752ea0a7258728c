"""Open a page in headless Chromium (Debian's chromium, driven by Playwright) with the network cut
off: what renders there renders offline."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def open_offline(path: Path) -> dict:
    """{"images": [(complete, natural width)], "blocked": [urls it tried to fetch], "text": str}."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is installed by `make setup`")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is missing; `make test` installs it when it runs as root")
    blocked: list[str] = []

    def route(route):
        if route.request.url.startswith(("file:", "data:")):
            return route.continue_()
        blocked.append(route.request.url)
        return route.abort()

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.route("**/*", route)
            page.goto(path.resolve().as_uri(), wait_until="load")
            images = page.evaluate("() => [...document.images].map(i => [i.complete, i.naturalWidth])")
            text = page.inner_text("body")
        finally:
            browser.close()
    return {"images": [tuple(i) for i in images], "blocked": blocked, "text": text}
