"""summary.md of `make gpu-check`: every figure against its target, from the raw files alone.

`render` is a pure function of the raw items (out/raw/<item>.json) and the list of files, so the
same raw files always give the same summary, and the tests check it on recorded inputs
(tests/data/gpucheck/). An item without a raw file reads "not run"; an item whose process failed
reads FAIL with its error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from dpstudy.gpucheck.figures import FORMATS, Figure
from dpstudy.gpucheck.registry import ITEMS, NAMES, NOT_APPLICABLE, Item
from dpstudy.util.atomic import write_text

PASS, FAIL, NOT_RUN, NO_TARGET = "PASS", "FAIL", "not run", "no target"


@dataclass
class Row:
    figure: str
    measured: str
    target: str
    verdict: str


@dataclass
class Verdict:
    name: str
    verdict: str  # PASS, FAIL or "not run"
    rows: list[Row] = field(default_factory=list)


def read_raw(out: str | Path) -> dict[str, dict]:
    """{item: its raw record} for the items with a raw file in out/raw; an unreadable one becomes
    an error record, so it shows as FAIL instead of vanishing."""
    raws = {}
    for name in NAMES:
        path = Path(out) / "raw" / f"{name}.json"
        if not path.exists():
            continue
        try:
            raws[name] = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raws[name] = {"item": name, "status": "error", "error": f"unreadable raw file {path.name}: {error}"}
    return raws


def list_files(out: str | Path) -> list[str]:
    """The raw files and logs under `out`, relative to it (temporary files left out)."""
    out = Path(out)
    found = [
        p for folder in ("raw", "logs") for p in (out / folder).rglob("*") if p.is_file() and not p.name.startswith(".")
    ]
    return sorted(str(p.relative_to(out)) for p in found)


def _measured(figure: Figure, value, detail: str | None) -> str:
    if value is None:
        return detail or "not measured"
    text = FORMATS[figure.fmt](value)
    if not detail:
        return text
    if figure.fmt == "bool":
        return f"{text}: {detail}"
    return f"{text} {detail}" if detail.startswith("of ") else f"{text} ({detail})"


def evaluate(item: Item, raw: dict | None) -> Verdict:
    """The item's rows (one per figure) and verdict from its raw record."""
    if raw is None or raw.get("status") == NOT_APPLICABLE:
        targets = "; ".join(f"{f.label}: {f.target.describe(f.fmt)}" for f in item.figures if f.target)
        measured = NOT_RUN if raw is None else f"{NOT_APPLICABLE}: {raw.get('error')}"
        return Verdict(item.name, NOT_RUN, [Row(item.title, measured, targets, NOT_RUN)])
    if raw.get("status") != "ok":
        error = (raw.get("error") or "failed").strip().splitlines()
        return Verdict(item.name, FAIL, [Row("error", error[-1] if error else "failed", "runs to the end", FAIL)])
    figures, details = raw.get("figures") or {}, raw.get("details") or {}
    rows, failed = [], False
    for figure in item.figures:
        value = figures.get(figure.key)
        measured = _measured(figure, value, details.get(figure.key))
        if figure.target is None:
            rows.append(Row(figure.label, measured, "—", NO_TARGET))
            continue
        met = figure.target.met(value)
        failed |= not met
        rows.append(Row(figure.label, measured, figure.target.describe(figure.fmt), PASS if met else FAIL))
    return Verdict(item.name, FAIL if failed else PASS, rows)


def evaluate_all(raws: dict[str, dict]) -> list[Verdict]:
    return [evaluate(item, raws.get(item.name)) for item in ITEMS]


def exit_status(verdicts: list[Verdict], names: list[str] | None = None) -> int:
    """0 when every item of `names` (default: every item that ran) met its targets, else 1."""
    chosen = [v for v in verdicts if (names is None or v.name in names) and v.verdict != NOT_RUN]
    return 1 if any(v.verdict == FAIL for v in chosen) else 0


def _env(raws: dict[str, dict]) -> dict:
    """The environment of the most recently finished item (the summary's header)."""
    latest = max((r for r in raws.values() if r.get("env")), key=lambda r: r.get("finished") or "", default=None)
    return latest["env"] if latest else {}


def _identity(env: dict) -> tuple:
    return (
        env.get("hostname"),
        env.get("torch"),
        env.get("driver"),
        tuple(d.get("name") for d in env.get("devices") or []),
    )


def _span(first: str, last: str) -> str:
    """'2026-11-24 09:00 to 09:14 UTC' from two ISO times (UTC)."""
    from datetime import datetime, timezone

    try:
        a, b = (datetime.fromisoformat(t).astimezone(timezone.utc) for t in (first, last))
    except ValueError:
        return f"{first} to {last}"
    end = b.strftime("%H:%M") if a.date() == b.date() else b.strftime("%Y-%m-%d %H:%M")
    return f"{a.strftime('%Y-%m-%d %H:%M')} to {end} UTC"


def header(raws: dict[str, dict]) -> list[str]:
    env = _env(raws)
    times = sorted(t for r in raws.values() for t in (r.get("started"), r.get("finished")) if t)
    when = _span(times[0], times[-1]) if times else "nothing measured yet"
    devices = env.get("devices") or []
    names = sorted({d["name"] for d in devices})
    device = (
        f"{len(devices)} x {', '.join(names)} ("
        + ", ".join(f"sm_{d['capability'].replace('.', '')}, {d['memory_gib']} GiB" for d in devices[:1])
        + ")"
        if devices
        else "none recorded"
    )
    code = env.get("code_version") or {}
    lines = [
        "# make gpu-check",
        "",
        f"Measured {when}.",
        "",
        "| | |",
        "|---|---|",
        f"| host | {env.get('hostname', '—')} |",
        f"| GPUs | {device} |",
        f"| driver | {env.get('driver') or '—'} |",
        f"| torch | {env.get('torch', '—')}, imported from `{env.get('torch_file', '—')}` |",
        f"| CUDA / cuDNN / NCCL | {env.get('cuda') or '—'} / {env.get('cudnn') or '—'} / {env.get('nccl') or '—'} |",
        f"| Python | {env.get('python', '—')} |",
        f"| code | git {code.get('git_commit') or '—'}, training sources {code.get('source_hash') or '—'} |",
        f"| CUDA_VISIBLE_DEVICES | {env.get('cuda_visible_devices') or 'unset'} |",
    ]
    others = sorted(name for name, r in raws.items() if r.get("env") and _identity(r["env"]) != _identity(env))
    if others:
        lines += [
            "",
            f"**Measured elsewhere:** {', '.join(others)} ran on another host, torch, driver or GPU "
            "than the header's; their raw files say where.",
        ]
    return lines


def render(raws: dict[str, dict], files: list[str]) -> str:
    """summary.md's text from the raw records and the list of files under the output folder."""
    verdicts = evaluate_all(raws)
    count = {v: sum(1 for x in verdicts if x.verdict == v) for v in (PASS, FAIL, NOT_RUN)}
    overall = FAIL if count[FAIL] else PASS if count[PASS] else NOT_RUN
    lines = header(raws) + [
        "",
        f"**Result: {overall}**: {count[PASS]} passed, {count[FAIL]} failed, {count[NOT_RUN]} not run "
        f"(exit status {exit_status(verdicts)} for the items run).",
        "",
        "| item | figure | measured | target | verdict |",
        "|---|---|---|---|---|",
    ]
    for number, (item, verdict) in enumerate(zip(ITEMS, verdicts), 1):
        for row in verdict.rows:
            cells = (f"{number} {item.name}", row.figure, row.measured, row.target, row.verdict)
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "## Notes"]
    for number, (item, verdict) in enumerate(zip(ITEMS, verdicts), 1):
        raw = raws.get(item.name)
        lines += ["", f"### {number} {item.name}: {item.title}", ""]
        if raw is None:
            lines.append(f"- not run (`python -m dpstudy.gpucheck --only {item.name}` runs it)")
            continue
        lines.append(f"- {verdict.verdict}, {raw.get('duration_s', 0):.0f} s, finished {raw.get('finished', '—')}")
        if raw.get("status") == NOT_APPLICABLE:
            lines.append(f"- not applicable here: {raw.get('error')}")
        elif raw.get("status") != "ok":
            lines += ["- error:", "", "```", (raw.get("error") or "").strip(), "```"]
        for note in raw.get("notes") or []:
            if "\n" in note:  # a table or a block: as it is
                lines += ["", note, ""]
            else:
                lines.append(f"- {note}")
    lines += ["", "## Files", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)


def write(out: str | Path) -> tuple[Path, list[Verdict]]:
    """Rewrite out/summary.md from every raw file present; returns its path and the verdicts."""
    out = Path(out)
    raws = read_raw(out)
    path = out / "summary.md"
    write_text(path, render(raws, list_files(out)))
    return path, evaluate_all(raws)
