"""`make gpu-check`: run the GPU items (dpstudy.gpucheck.registry), then write summary.md.

    python -m dpstudy.gpucheck [--out results/gpu-check] [--only tests,study,loader,resnet,lm,...]
    python -m dpstudy.gpucheck --summary-only [--out DIR]     # rewrite summary.md from the raw files

Without a CUDA GPU it prints one line and exits with NO_GPU (77), creating nothing. Otherwise
each item runs in a process of its own (dpstudy.gpucheck.worker), its output shown here and kept
in <out>/logs/<item>.log, its figures in <out>/raw/<item>.json; summary.md is then rewritten from
every raw file present, so the items can be run in several shorter runs (--only) and still make
one summary. Exit status: 0 when every item run here met its targets, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from dpstudy.gpucheck.registry import BY_NAME, NAMES
from dpstudy.jobs.exits import describe_exit

# make gpu-check runs in the repository: its tests, its workflow and its results are checked.
REPO = Path.cwd()
DEFAULT_OUT = REPO / "results" / "gpu-check"
NO_GPU = 77  # automake's "skipped": nothing could be checked here, which is not a failure


def cuda_status() -> tuple[int, str]:
    """(visible CUDA devices, a description of torch's CUDA) without touching any device."""
    import torch

    with warnings.catch_warnings(record=True) as caught:  # e.g. "CUDA initialization: driver too old"
        warnings.simplefilter("always")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    what = f"torch {torch.__version__}, " + (
        f"CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
    )
    if caught:
        what += "; " + str(caught[0].message).strip().splitlines()[0]
    return count, what


def parse_only(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or text!r}: the items are {','.join(NAMES)}")
    return [n for n in NAMES if n in names]  # the registry's order, whatever order was given


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def run_item(name: str, out: Path, number: int, total: int) -> None:
    """Run one item in a child process: its output echoed and logged, a hang stopped at the item's
    timeout, and a raw record written for it whatever happens."""
    from dpstudy.gpucheck import worker
    from dpstudy.util.atomic import atomic_output, write_text
    from dpstudy.util.lifeline import child_dies_with_us

    item = BY_NAME[name]
    raw = out / "raw" / f"{name}.json"
    raw.unlink(missing_ok=True)  # an old result must not stand for this run
    print(
        f"[gpu-check] {number}/{total} {name}: start: {item.title} (stopped after {_duration(item.timeout_s)})",
        flush=True,
    )
    started, start = worker.now(), time.monotonic()
    command = [sys.executable, "-m", "dpstudy.gpucheck.worker", name, "--out", str(out)]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    timed_out = threading.Event()
    with atomic_output(out / "logs" / f"{name}.log") as log_path, open(log_path, "w") as log:
        child = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=child_dies_with_us(),
        )

        def stop() -> None:
            timed_out.set()
            _stop_group(child)

        timer = threading.Timer(item.timeout_s, stop)
        timer.start()
        try:
            for line in child.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
            code = child.wait()
        except BaseException:  # Ctrl-C, SIGTERM: take the item's processes along
            _stop_group(child)
            raise
        finally:
            timer.cancel()
    if not raw.exists():
        why = (
            f"stopped after its time limit of {_duration(item.timeout_s)}"
            if timed_out.is_set()
            else f"its process ended ({describe_exit(code)}) without a result"
        )
        write_text(
            raw,
            json.dumps(
                {
                    "schema": worker.SCHEMA,
                    "item": name,
                    "title": item.title,
                    "status": "error",
                    "error": f"{name} {why}; see logs/{name}.log",
                    "started": started,
                    "finished": worker.now(),
                    "duration_s": round(time.monotonic() - start, 2),
                    "env": {},
                    "figures": {},
                    "details": {},
                    "notes": [],
                    "params": {},
                    "files": [],
                    "data": None,
                },
                indent=1,
            )
            + "\n",
        )
    from dpstudy.gpucheck import summary

    verdict = summary.evaluate(item, summary.read_raw(out).get(name))
    print(
        f"[gpu-check] {number}/{total} {name}: {verdict.verdict} in {_duration(time.monotonic() - start)}", flush=True
    )


def _stop_group(child: subprocess.Popen) -> None:
    """SIGTERM to the item's process group (its own session), SIGKILL to whatever is left of it
    15 s later (Snakemake, pytest and their children are in it too)."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            child.poll()  # reap the worker, so that an empty group reads as gone
            try:
                os.killpg(child.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def print_table(path: Path) -> None:
    """The summary's verdict line and table, for a log that shows only the end of the output."""
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("**Result")), None)
    end = next((i for i, line in enumerate(lines) if line.startswith("## Notes")), len(lines))
    if start is not None:
        print("\n".join(lines[start:end]).rstrip(), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpstudy.gpucheck", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default results/gpu-check)")
    parser.add_argument(
        "--only",
        type=parse_only,
        default=list(NAMES),
        help=f"comma-separated items to run, of {','.join(NAMES)} (default: all, in that order)",
    )
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="run nothing: rewrite summary.md from the raw files in --out (needs no GPU)",
    )
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if not (REPO / "Snakefile").is_file() and not args.summary_only:
        parser.error(f"run it in the dpstudy repository (make gpu-check): {REPO} has no Snakefile")
    if args.summary_only:
        from dpstudy.gpucheck import summary

        if not (out / "raw").is_dir():
            print(f"gpu-check: no raw results in {out}/raw to summarise", file=sys.stderr)
            return 2
        path, verdicts = summary.write(out)
        print_table(path)
        print(f"gpu-check: summary in {path}", flush=True)
        return summary.exit_status(verdicts)
    gpus, what = cuda_status()
    if gpus == 0:
        print(f"gpu-check: no CUDA GPU visible ({what}): nothing run", file=sys.stderr)
        return NO_GPU
    print(
        f"[gpu-check] {gpus} CUDA GPU{'s' * (gpus > 1)} visible ({what}); items: {', '.join(args.only)}; "
        f"output in {out}",
        flush=True,
    )
    for number, name in enumerate(args.only, 1):
        run_item(name, out, number, len(args.only))
    from dpstudy.gpucheck import summary

    path, verdicts = summary.write(out)
    print_table(path)
    status = summary.exit_status(verdicts, args.only)
    print(
        f"gpu-check: {'all items run here met their targets' if status == 0 else 'a check failed'}; summary in {path}",
        flush=True,
    )
    return status
