"""The tables read back as written: identifiers and versions stay text (dpstudy.analysis.tablefiles)."""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import tablefiles
from dpstudy.study.outputs import TABLES


def test_identifiers_that_look_like_numbers_read_back_as_written(tmp_path):
    # A source hash read as a float was inf, and the report's header said "source hash inf".
    looks_numeric = {
        "source_hash": "3819e1247242",
        "git_commit": "0123456789",
        "job_id": "8",
        "torch": "2.10",
        "cuda": "12.10",
        "nccl": "2.28",
        "python": "3.12",
        "driver": "580",
        "hostname": "1e5",
    }
    tables = {name: pd.DataFrame({"x": [1]}) for name in TABLES}
    tables["cells"] = pd.DataFrame([{"cell": "c", "stale": False, "record": "r", **looks_numeric}])
    tablefiles.write_tables(tables, tmp_path)
    cells = tablefiles.read_tables(tmp_path)["cells"]
    assert cells.iloc[0][list(looks_numeric)].to_dict() == looks_numeric
    assert cells["stale"].dtype == bool  # the rest as pandas reads them
