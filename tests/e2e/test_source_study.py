"""A source study on generated stand-ins, side by side with its source: s004 (one GPU vs DDP over
four batch sizes, NCCL vs Gloo) as planned on this CPU with config/stand_in.yaml, its report
setting the source's figures beside ours and saying which findings hold and which cells cannot
run here. The report is what is under test: it renders (papermill, a real kernel) from records of
the planned cells; that Snakemake plans the same cells from the same files is
tests/e2e/test_planning.py's, and what training measures is tests/e2e/test_default_study.py's."""

from __future__ import annotations

import pytest
import yaml
from helpers import REPO
from helpers.glossary import report_columns, undefined_in_glossary
from helpers.records import make_record, render_report
from snakemake.utils import update_config

from dpstudy.report import sources
from dpstudy.workflow.planning import load_study

FILES = ("config/studies/s004_stl10_ddp.yaml", "config/stand_in.yaml")
NCCL_ON_CPU = "backend nccl needs CUDA GPUs; on CPU only gloo runs"  # dpstudy.study.spec.hardware_gap's


def planned_records() -> tuple[list[dict], dict]:
    """A record per planned cell (NCCL's skipped with the engine's reason, the rest trained: the
    throughput grows with the devices), and the study config the workflow would read."""
    config: dict = {}
    for name in FILES:
        update_config(config, yaml.safe_load((REPO / name).read_text()))
    records = []
    for cell in load_study(config, [str(REPO / FILES[0])], user_check=None, visible_gpus=0, capabilities=[]).cells:
        keys = {k: v for k, v in cell.spec.items() if k not in ("data_root", "code_path")}
        if keys["backend"] == "nccl":
            records.append(make_record("skipped", reason=NCCL_ON_CPU, **keys))
        else:
            records.append(make_record(samples_per_s=300.0 * keys["gpus"] + keys["batch"], **keys))
        assert records[-1]["cell"] == cell.id
    return records, config


@pytest.mark.slow
def test_a_source_study_on_stand_in_data_reports_side_by_side(tmp_path, python3_kernel):
    records, config = planned_records()
    assert len(records) == 14 and sum(r["status"] == "skipped" for r in records) == 8
    html = render_report(tmp_path, records, config["study"], yaml.safe_dump(config)).read_text()
    assert "Source 004: University of Tehran" in html and "generated stand-ins" in html
    assert "DDP on 2 GPUs (gloo for nccl):" in html  # NCCL cannot run here; the study's Gloo cell stands in
    assert "cannot tell: cannot run here: backend nccl needs CUDA GPUs" in html
    questions = [c["question"] for c in sources.sources()["s004_stl10_ddp"]["comparisons"]]
    assert len(questions) == 6
    for question in questions:  # every comparison of sources.yaml for s004 has its row
        assert html.count(f"<td>{question}</td>") == 1, question
    # the side-by-side table's columns are the glossary's, as every other table's
    assert "question" in report_columns(html) and undefined_in_glossary(html) == []
