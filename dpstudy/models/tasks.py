"""A cell's Task: its dataset's, for text at the cell's window. Apart from dpstudy.models so that
what imports the registry (the spec's rules, hence every entry point's code) does not depend on
the prepared-data code (dpstudy.data.store): an edit there reruns only what prepares or plans."""

from __future__ import annotations

from typing import Any

from dpstudy.data import store
from dpstudy.data.task import Task
from dpstudy.models import window


def cell_task(spec: dict[str, Any], overrides: dict | None = None, code_path: str | None = None) -> Task:
    """The Task a cell's model is built for: its dataset's (dpstudy.data.store.data_task; a user's
    dataset from its settings `overrides`, else its prepared meta.json), for text at the cell's
    window."""
    return store.data_task(spec["dataset"], spec["data_root"], lambda: window(spec), overrides, code_path)
