"""The sources side by side: sources.yaml against the source studies, and the verdicts."""

import re

import pandas as pd
import pytest
import yaml
from helpers import REPO
from helpers.records import CURRENT, NCCL_REASON, make_record, write_records

from dpstudy.analysis import collect
from dpstudy.report import sources
from dpstudy.study import sweeps


@pytest.mark.parametrize("name", sorted(sources.sources()))
def test_every_comparison_picks_one_cell_of_its_study(name):
    config = yaml.safe_load((REPO / "config/studies" / f"{name}.yaml").read_text())
    cells = pd.DataFrame(
        [{**c.spec, "cell": c.id} for c in sweeps.expand(sweeps.load(config)) if c.spec["repeat"] == 0]
    )
    for comparison in sources.sources()[name]["comparisons"]:
        assert comparison["metric"] in sources.METRICS and comparison["finding"] in sources.FINDINGS
        assert (comparison["finding"] == "similar") == ("tolerance" in comparison)
        for side in ("a", "b"):
            for want in sources.alternatives(comparison[side]["match"]):
                found = sources.matching(cells, want)
                assert len(found) == 1, f"{name}: {comparison['question']} {side} {want}: {list(found['cell'])}"


def s004_records(repeats: int = 1, gloo_tput: tuple = (800.0,)) -> list[dict]:
    """Single at batch 32 and 128, DDP over Gloo at batch 32; DDP over NCCL skipped."""
    common = {"dataset": "synthetic_stl", "model": "simplecnn", "batch_scope": "per_device"}
    records = []
    for r in range(repeats):
        suffix = f"-r{r}" if repeats > 1 else ""
        records += [
            make_record(mode="single", batch=32, samples_per_s=500.0 + r, repeat=r, suffix=suffix, **common),
            make_record(mode="single", batch=128, samples_per_s=600.0 + r, repeat=r, suffix=suffix, **common),
            make_record(
                mode="ddp",
                gpus=2,
                backend="gloo",
                batch=32,
                samples_per_s=gloo_tput[r % len(gloo_tput)],
                repeat=r,
                suffix=suffix,
                **common,
            ),
        ]
    return records + [
        make_record("skipped", mode="ddp", gpus=2, backend="nccl", batch=b, reason=NCCL_REASON, **common)
        for b in (32, 128)
    ]


def rows_of(markdown: str) -> dict[str, str]:
    """{question: 'holds here?' column} of the side-by-side table."""
    rows = [line.split(" | ") for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]
    plain = lambda cell: re.sub(r"\\(.)", r"\1", cell)  # noqa: E731 - markdown's escapes, as shown
    return {plain(r[0].lstrip("| ")): plain(r[-1].rstrip(" |")) for r in rows[1:]}


def test_their_findings_checked_on_our_cells(tmp_path):
    cells = collect.collect(write_records(tmp_path, s004_records()), CURRENT)["cells"]
    text = sources.side_by_side("s004_stl10_ddp", cells, stand_in=True)
    assert text.startswith("Source 004: University of Tehran") and "generated stand-ins" in text
    verdicts = rows_of(text)
    # 6000 samples per epoch: single 500/s -> 12 s epochs; DDP over Gloo 800/s -> 7.5 s
    # The speedup (throughput 800 / 500), not a ratio of times that reads as a slowdown.
    assert verdicts["Is DDP on 2 GPUs faster than one GPU (batch 32 per GPU)?"] == (
        "yes (DDP on 2 GPUs runs at 1.60x the throughput of one GPU; too few runs for an interval)"
    )
    assert "DDP on 2 GPUs (gloo for nccl): 16.0 s" in text  # 2 epochs of 7.5 s + 0.5 s evaluation
    assert (
        verdicts["Is NCCL faster than Gloo (DDP on 2 GPUs, batch 32)?"]
        == f"cannot tell: cannot run here: {NCCL_REASON}"
    )
    assert verdicts["Is DDP on 2 GPUs faster than one GPU (batch 128 per GPU)?"].startswith("cannot tell")
    assert verdicts["Does a larger batch shorten training on one GPU (16 vs 128)?"] == "cannot tell: not in this study"
    assert verdicts["Does DDP keep the test accuracy (batch 32)?"] == "yes: 0 apart (their tolerance 1.5)"


def test_repeats_decide_beyond_noise_or_say_within_noise(tmp_path):
    clear = collect.collect(write_records(tmp_path / "a", s004_records(3, (800.0, 810.0, 790.0))), CURRENT)["cells"]
    assert rows_of(sources.side_by_side("s004_stl10_ddp", clear))[
        "Is DDP on 2 GPUs faster than one GPU (batch 32 per GPU)?"
    ].startswith("yes (DDP on 2 GPUs runs at 1.60x [1.5")
    noisy = collect.collect(write_records(tmp_path / "b", s004_records(3, (300.0, 900.0, 500.0))), CURRENT)["cells"]
    assert rows_of(sources.side_by_side("s004_stl10_ddp", noisy))[
        "Is DDP on 2 GPUs faster than one GPU (batch 32 per GPU)?"
    ].startswith("within noise")


def test_a_study_without_a_source_has_no_table(tmp_path):
    assert sources.side_by_side("quickstart", pd.DataFrame()) is None
    assert "publishes no figure" in sources.side_by_side("s003_resnet_fashion", pd.DataFrame({"env_device": ["cpu"]}))


def test_our_figures_read_as_numbers_with_thousands_separated():
    side = {"label": "batch 16", "match": {"mode": "single", "batch": 16}}
    assert sources.ours_text(side, {"value": (1234.5, float("nan"), float("nan"))}, "MB") == "batch 16: 1,230 MB"
    assert sources.ours_text(side, {"value": (51.52, 50.1, 53.0)}, "%") == "batch 16: 51.5 % [50.1-53.0]"
    assert sources.ours_text(side, {"missing": "not in this study"}, "s") == "batch 16: not in this study"
