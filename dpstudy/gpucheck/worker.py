"""Run one gpu-check item in this process and record it in OUT/raw/ITEM.json.

    python -m dpstudy.gpucheck.worker ITEM --out OUT

The runner (dpstudy.gpucheck.runner) starts one such process per item, in a session of its own
and tied to the runner's life, so that a CUDA error that poisons a process (an illegal address,
a hung collective the runner has to kill) costs that item only, and stopping the runner stops
the item with everything it started. Whatever happens inside the item, the raw file records it: status "ok" with
the figures, or "error" with the exception.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from dpstudy.gpucheck.registry import BY_NAME, NAMES, NOT_APPLICABLE
from dpstudy.util.atomic import write_text

SCHEMA = "dpstudy.gpucheck-raw/1"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def environment() -> dict:
    """Where the item ran: host, GPUs, driver, torch (and where it was imported from), CUDA, cuDNN, NCCL."""
    env: dict = {"hostname": socket.gethostname(), "python": platform.python_version()}
    try:
        import torch

        from dpstudy.record import envinfo
        from dpstudy.record.provenance import code_version

        env.update(
            torch=torch.__version__,
            torch_file=torch.__file__,
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            nccl=envinfo.nccl_version(),
            driver=envinfo.driver_version(),
            code_version=code_version(),
        )
        devices = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "index": i,
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 1),
                }
            )
        env["devices"] = devices
    except Exception as error:  # after a sticky CUDA error the item's own record still matters more
        env["error"] = f"{type(error).__name__}: {error}"
    env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return env


def _plain(value):
    """JSON for what items may return besides plain types: numpy scalars, paths, tuples of them."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def run(name: str, out: Path) -> int:
    item = BY_NAME[name]
    started, start = now(), time.perf_counter()
    try:
        result = item.run(out)
        # an item this host cannot run (too few GPUs) says why; it neither passes nor fails
        status, error = (NOT_APPLICABLE, result["not_applicable"]) if "not_applicable" in result else ("ok", None)
    except BaseException as exc:  # KeyboardInterrupt too: the record says how the item ended
        traceback.print_exc()
        sys.stdout.flush()
        result, status = {}, "error"
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip() or type(exc).__name__
    raw = {
        "schema": SCHEMA,
        "item": name,
        "title": item.title,
        "status": status,
        "error": error,
        "started": started,
        "finished": now(),
        "duration_s": round(time.perf_counter() - start, 2),
        "env": environment(),
        **{
            key: result.get(key, default)
            for key, default in (
                ("figures", {}),
                ("details", {}),
                ("notes", []),
                ("params", {}),
                ("files", []),
                ("data", None),
            )
        },
    }
    write_text(out / "raw" / f"{name}.json", json.dumps(raw, indent=1, default=_plain) + "\n")
    return 0 if status in ("ok", NOT_APPLICABLE) else 1


def _stop_everything(signum, frame) -> None:
    """SIGTERM or SIGHUP (the runner stopping the item, or dying): take the whole process group
    along, this process included: pytest, Snakemake and whatever they started."""
    signal.signal(signum, signal.SIG_DFL)
    os.killpg(0, signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one gpu-check item (the runner's child process).")
    parser.add_argument("item", choices=NAMES)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_everything)
    return run(args.item, args.out)


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
