"""One speedup everywhere: the rendered report quotes a setting's speedup, and its interval, the
same way in every section that names it (speedup, the step model, the sources' verdicts), and
that is the settings table's number."""

from __future__ import annotations

import html
import re

import pytest
from helpers.records import NCCL_REASON, make_record, render_report

from dpstudy.analysis import tablefiles

STUDY = "s004_stl10_ddp"  # a study the sources compare with: their verdicts quote the speedup too
COMMON = {"dataset": "synthetic_stl", "model": "simplecnn", "batch_scope": "per_device"}
PROBE = {"steps": 8, "sync_step_s": 0.045, "nosync_step_s": 0.035, "allreduce_s": 0.020, "grad_bytes": 400_000}


def recorded_study() -> list[dict]:
    """Three repeats of one GPU and DDP on 2 at batch 32, with noise, the scaling probe on DDP."""
    records = []
    for r, (single, ddp) in enumerate(((500.0, 820.0), (530.0, 780.0), (490.0, 850.0))):
        records += [
            make_record(mode="single", batch=32, samples_per_s=single, repeat=r, suffix=f"-r{r}", **COMMON),
            make_record(
                mode="ddp",
                gpus=2,
                backend="gloo",
                batch=32,
                samples_per_s=ddp,
                repeat=r,
                suffix=f"-r{r}",
                probe=PROBE,
                **COMMON,
            ),
        ]
    return records + [
        make_record("skipped", mode="ddp", gpus=2, backend="nccl", batch=32, reason=NCCL_REASON, **COMMON)
    ]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, python3_kernel) -> tuple[str, dict]:
    root = tmp_path_factory.mktemp("consistency")
    report = render_report(root, recorded_study(), STUDY)
    tables = tablefiles.read_tables(root / "tables")
    page = report.read_text()
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    ddp = tables["settings"][tables["settings"]["mode"] == "ddp"].iloc[0]
    return re.sub(r"\s+", " ", text), ddp


@pytest.mark.slow
def test_every_section_quotes_the_settings_speedup(rendered):
    text, ddp = rendered
    quoted = f"{ddp['speedup']:.2f}x [{ddp['speedup_low']:.2f}-{ddp['speedup_high']:.2f}]"
    assert ddp["repeats"] == 3 and ddp["speedup_low"] < ddp["speedup"] < ddp["speedup_high"]
    # speedup section, the step model's sentence and its table, the sources' verdict
    assert f"DDP (gloo) on 2 devices at batch 32 per device: {quoted} one device's throughput" in text
    assert f"DDP (gloo) on 2 devices at batch 32 per device: measured {quoted}, step model" in text
    assert f"DDP on 2 GPUs runs at {quoted} the throughput of one GPU" in text
    # and no other speedup for that setting anywhere: every 'N.NNx [' in the page is this one
    intervals = set(re.findall(r"\d+\.\d\dx \[\d+\.\d\d-\d+\.\d\d\]", text))
    assert intervals == {quoted}, intervals
    assert text.count(quoted) >= 4
