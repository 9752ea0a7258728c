"""Item 1 of `make gpu-check`: the gpu-marked tests (`python -m pytest -m gpu`), read back from
their JUnit XML.

`run_tests` returns the item's record for dpstudy.gpucheck.worker (see dpstudy.gpucheck.registry
for its figures); `junit_counts` and `tests_result` are pure, so they are tested without a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# make gpu-check runs in the repository: its tests, its workflow and its results are checked.
REPO = Path.cwd()


def _rel(path: Path, out: Path) -> str:
    return str(Path(path).relative_to(out))


def junit_counts(xml_path: str | Path) -> dict:
    """Counts, failing test names and suite properties of a pytest JUnit XML file."""
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failing, properties = [], {}
    for suite in suites:
        for key in totals:
            totals[key] += int(suite.get(key, 0))
        for prop in suite.iter("property"):
            properties[prop.get("name")] = prop.get("value")
        for case in suite.iter("testcase"):
            problem = case.find("failure") if case.find("failure") is not None else case.find("error")
            if problem is not None:
                name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
                failing.append(
                    {
                        "test": name,
                        "message": (problem.get("message") or "").splitlines()[0][:300]
                        if problem.get("message")
                        else "",
                    }
                )
    ran = totals["tests"] - totals["skipped"]
    failed = totals["failures"] + totals["errors"]
    return {
        **totals,
        "ran": ran,
        "failed": failed,
        "passed": ran - failed,
        "failing": failing,
        "properties": properties,
    }


def tests_result(counts: dict, returncode: int, duration_s: float, xml_name: str) -> dict:
    """The item's figures from junit_counts(): pass iff something ran and nothing failed."""
    details, notes = {}, []
    if counts["failing"]:
        shown = "; ".join(f["test"] for f in counts["failing"][:5])
        more = f" and {len(counts['failing']) - 5} more" if len(counts["failing"]) > 5 else ""
        details["failed"] = f"{shown}{more}"
        notes += [f"FAILED {f['test']}: {f['message']}" for f in counts["failing"]]
    if counts["ran"] == 0:
        details["ran"] = "every gpu test was skipped: CUDA was not usable inside pytest"
    seed = counts["properties"].get("dpstudy_gpu_seed")
    if seed is not None:
        notes.append(
            f"random shapes drawn from seed {seed}; replay with DPSTUDY_GPU_SEED={seed} "
            "python -m pytest -m gpu tests/e2e/test_gpu.py"
        )
    notes.append(f"pytest exit status {returncode}; JUnit XML in {xml_name}")
    return {
        "figures": {key: counts[key] for key in ("ran", "failed", "passed", "skipped")} | {"duration_s": duration_s},
        "details": details,
        "notes": notes,
        "data": counts,
    }


def run_tests(out: Path) -> dict:
    """`python -m pytest -m gpu` in the repository, JUnit XML into raw/tests.xml."""
    import time

    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    xml, tmp = raw / "tests.xml", raw / ".tests.tmp.xml"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={tmp}"]
    print("[gpu-check] " + " ".join(command), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    duration = time.perf_counter() - start
    if not tmp.exists():
        raise RuntimeError(f"pytest ended with exit status {proc.returncode} without writing its JUnit XML")
    os.replace(tmp, xml)  # pytest writes the file in place; the rename makes it appear whole
    result = tests_result(junit_counts(xml), proc.returncode, duration, _rel(xml, out))
    return {**result, "params": {"command": command[1:]}, "files": [_rel(xml, out)]}
