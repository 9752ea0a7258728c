"""The job launcher: which command a cell runs, how a job ends, and SLURM's verdicts on retries.

The launcher runs in a subprocess with its training command replaced by a small Python child,
so every ending (a record, none, a signal, a dead parent) is exercised for real in milliseconds.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO

from dpstudy.jobs import cell_command, launch, plan_file, slurm, timelimit
from dpstudy.record import fields as record
from dpstudy.record.envinfo import fallback_environment
from dpstudy.study.spec import complete

DDP = complete({"dataset": "synthetic", "model": "lenet", "mode": "ddp", "gpus": 2, "backend": "gloo"})
SINGLE = complete({"dataset": "synthetic", "model": "lenet", "mode": "single"})


# ---- the command line -------------------------------------------------------------------------


def test_single_and_dp_run_one_python_process(tmp_path):
    argv = cell_command.command(SINGLE, "c", tmp_path, 1, None)
    assert argv[:3] == [sys.executable, "-m", "dpstudy.engine"]
    assert argv[argv.index("--cores") + 1] == "1" and json.loads(argv[argv.index("--spec") + 1]) == SINGLE


def test_ddp_on_one_node_runs_torchrun_standalone(tmp_path):
    argv = cell_command.command(DDP, "c", tmp_path, 2, None)
    # torchrun's main, ended without the interpreter's teardown (dpstudy.jobs.torchrun)
    # and its log folders in the cell's folder, which the launcher removes when the job ends
    logs = f"--log-dir={tmp_path / cell_command.TORCHRUN_LOGS}"
    runner = argv[:4]
    assert runner == [sys.executable, "-m", "dpstudy.jobs.torchrun", logs]
    assert argv[len(runner) : len(runner) + 3] == ["--standalone", "--nproc-per-node=2", "-m"]


def test_ddp_on_several_nodes_runs_srun_torchrun_with_a_c10d_rendezvous(tmp_path):
    spec = {**DDP, "nodes": 2}
    argv = cell_command.command(spec, "c", tmp_path, 2, slurm.Allocation("77", 2, "10.0.0.5"))
    assert argv[:6] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        "--kill-on-bad-exit=1",
    ]
    logs = f"--log-dir={tmp_path / cell_command.TORCHRUN_LOGS}"
    assert argv[6:10] == [sys.executable, "-m", "dpstudy.jobs.torchrun", logs]
    rest = argv[argv.index("--nnodes=2") :]
    assert rest[:3] == ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d"]
    host, port = rest[3].removeprefix("--rdzv-endpoint=").split(":")
    assert host == "10.0.0.5" and 1024 <= int(port) < 65536 and rest[4] == "--rdzv-id=77"
    assert rest[5:7] == ["-m", "dpstudy.engine"]
    assert argv.index(rest[3]) < launch.SHOWN_ARGS  # the launcher's log line shows the rendezvous


def test_a_multi_node_cell_outside_an_allocation_big_enough_runs_alone_to_record_its_skip(tmp_path):
    spec = {**DDP, "nodes": 2}
    assert cell_command.command(spec, "c", tmp_path, 2, None)[0] == sys.executable
    assert cell_command.command(spec, "c", tmp_path, 2, slurm.Allocation("77", 1, "h"))[0] == sys.executable


# ---- how a job ends ---------------------------------------------------------------------------


def start_launcher(
    tmp_path: Path,
    child: str,
    *,
    attempt: int = 1,
    gpus: int = 0,
    env: dict | None = None,
    parent: bool = False,
    spec: dict = SINGLE,
    extra: tuple[str, ...] = (),
    cwd: Path = REPO,
) -> subprocess.Popen:
    """The launcher with `child` (Python source) as its training command. parent=True puts a
    sleeping Python process between the test and the launcher (its pid is printed first)."""
    child_file = tmp_path / "child.py"
    child_file.write_text(textwrap.dedent(child))
    args = [
        "--spec",
        json.dumps(spec),
        "--cell",
        "c",
        "--out",
        str(tmp_path / "cell"),
        "--log",
        str(tmp_path / "cell" / "train.log"),
        "--gpus",
        str(gpus),
        "--cores",
        "1",
        "--attempt",
        str(attempt),
        *extra,
    ]
    cell = str(tmp_path / "cell")
    run = textwrap.dedent(f"""
        import sys
        import dpstudy.jobs.launch as launch
        launch.command = lambda *args: [sys.executable, {str(child_file)!r}, {cell!r}]
        sys.exit(launch.main({args!r}))
    """)
    argv = [sys.executable, "-c", run]
    if parent:
        argv = [
            sys.executable,
            "-c",
            "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:]); "
            "print(p.pid, flush=True); time.sleep(600)",
            *argv,
        ]
    return subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, text=True, cwd=cwd)


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


MARKER = "import sys; open(sys.argv[1] + '/trained', 'w').write('yes')"
# The pid file appears whole (written aside, then renamed): the test reads it as soon as it exists.
SLEEPER = """
    import os, sys, time
    aside = os.path.join(sys.argv[1], ".child.pid.tmp")
    with open(aside, "w") as f:
        f.write(str(os.getpid()))
    os.replace(aside, os.path.join(sys.argv[1], "child.pid"))
    time.sleep(600)
"""


def test_a_child_that_ends_without_a_record_gets_a_failed_one(tmp_path):
    proc = start_launcher(tmp_path, "import sys; print('boom'); sys.exit(3)")
    assert proc.wait(timeout=60) == 0
    rec = record.read(tmp_path / "cell/record.json")
    assert rec["status"] == "failed" and "ended (exit code 3) without writing a record" in rec["reason"]
    assert rec["spec"] == SINGLE and rec["env"]["job"]["scheduler"] == "local"
    assert set(rec["env"]) == set(fallback_environment(1, 1))  # the one fallback env builder's keys
    assert "boom" in (tmp_path / "cell/train.log").read_text()


def test_the_childs_own_record_stands_even_when_it_exits_nonzero(tmp_path):
    ok = record.make(
        "c",
        "failed",
        "rank 0: RuntimeError: x",
        SINGLE,
        {"torch": "t", "python": "p", "hostname": "h", "world_size": 1, "code_version": {}},
    )
    child = f"""
        import sys
        from dpstudy.record import fields as record
        record.write(sys.argv[1] + "/record.json", {ok!r})
        sys.exit(1)
    """
    proc = start_launcher(tmp_path, child)
    assert proc.wait(timeout=60) == 0
    assert record.read(tmp_path / "cell/record.json")["reason"] == "rank 0: RuntimeError: x"


def test_a_stopped_job_stops_its_child_and_leaves_no_record(tmp_path):
    proc = start_launcher(tmp_path, SLEEPER)
    wait_for(tmp_path / "cell/child.pid")
    child = int((tmp_path / "cell/child.pid").read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert not (tmp_path / "cell/record.json").exists()
    time.sleep(0.5)
    assert not alive(child)
    assert "stopped by SIGTERM: no record" in (tmp_path / "cell/train.log").read_text()


PROGRESS = "print('epoch 1/3 train_loss 2.3', flush=True); "
PROGRESSING_SLEEPER = SLEEPER.replace("time.sleep(600)", PROGRESS + "time.sleep(600)")


def test_a_child_past_the_time_limit_is_stopped_and_recorded_failed_with_its_progress(tmp_path):
    started = time.monotonic()
    proc = start_launcher(tmp_path, PROGRESSING_SLEEPER, extra=("--limit-s", "3"))
    assert proc.wait(timeout=30) == 0  # a finished job: the cell has its record, the study goes on
    took = time.monotonic() - started
    rec = record.read(tmp_path / "cell/record.json")
    assert rec["status"] == "failed" and rec["reason"] == (
        "stopped at its time limit of 3 s (resources.runtime_min) after 3 s; last progress: "
        "epoch 1/3 train_loss 2.3; see train.log"
    )
    assert 3 <= took < 3 + 8  # the limit counts from the launcher's start, SIGTERM ends the child
    assert not alive(int((tmp_path / "cell/child.pid").read_text()))


def test_a_packed_cell_keeps_its_own_limit_inside_its_slurm_job_and_its_record_says_how_it_was_planned(tmp_path):
    # The pack's job has the sum of its cells' limits: the launcher stops its own cell at the cell's.
    work = tmp_path / "work"
    work.mkdir()
    with contextlib.chdir(work):
        plan_file.write({"c": {"pack": "pack-1n-3", "estimate_s": 42.0, "source": "setting"}})
    started = time.monotonic()
    proc = start_launcher(tmp_path, PROGRESSING_SLEEPER, extra=("--limit-s", "3"), env={"SLURM_JOB_ID": "77"}, cwd=work)
    assert proc.wait(timeout=30) == 0 and time.monotonic() - started < 3 + 8
    rec = record.read(tmp_path / "cell/record.json")
    assert rec["status"] == "failed" and rec["reason"].startswith("stopped at its time limit of 3 s")
    assert rec["env"]["job"] | {"cuda_visible_devices": None} == {
        "scheduler": "slurm",
        "job_id": "77",
        "cuda_visible_devices": None,
        "pack": "pack-1n-3",
        "estimated_s": 42.0,
    }
    attempt = json.loads((tmp_path / "cell/attempt.json").read_text())
    assert attempt["pack"] == "pack-1n-3" and attempt["job_id"] == "77"


def test_a_cell_of_its_own_leaves_its_limit_to_slurm(tmp_path):
    proc = start_launcher(
        tmp_path, PROGRESSING_SLEEPER, extra=("--limit-s", "1"), env={"SLURM_JOB_ID": "78"}, cwd=tmp_path
    )
    with pytest.raises(subprocess.TimeoutExpired):  # past its limit, still running: SLURM's to stop
        proc.wait(timeout=4)
    proc.terminate()
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM and not (tmp_path / "cell/record.json").exists()


def test_a_record_written_before_the_limit_stands(tmp_path):
    # The child finished its record, then lingered in teardown past the limit: the record is the truth.
    done = record.make(
        "c", "ok", None, SINGLE, {"torch": "t", "python": "p", "hostname": "h", "world_size": 1, "code_version": {}}
    )
    child = f"""
        import sys, time
        from dpstudy.record import fields as record
        record.write(sys.argv[1] + "/record.json", {done!r})
        time.sleep(600)
    """
    proc = start_launcher(tmp_path, child, extra=("--limit-s", "2"))
    assert proc.wait(timeout=30) == 0
    rec = record.read(tmp_path / "cell/record.json")
    assert rec["status"] == "ok" and rec["reason"] is None


def test_under_slurm_the_limit_is_slurms(tmp_path):
    # SLURM stops the job itself and the retry records it (test_a_retry_after_a_time_limit_...):
    # the launcher does not race it.
    child = "import sys, time; time.sleep(2); " + MARKER
    proc = start_launcher(tmp_path, child, extra=("--limit-s", "1"), env={"SLURM_JOB_ID": "4242"})
    assert proc.wait(timeout=30) == 0
    assert (tmp_path / "cell/trained").read_text() == "yes"
    assert "time limit" not in record.read(tmp_path / "cell/record.json")["reason"]


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(monkeypatch):
    monkeypatch.setattr(timelimit, "GRACE_S", 0.5)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "up\n"
    started = time.time()
    assert timelimit.wait(child, 0.5, started) == (-signal.SIGKILL, True)
    assert time.time() - started < 5


@pytest.mark.parametrize(
    "seconds, text", [(3, "3 s"), (60, "1 min"), (65, "1 min 5 s"), (3600, "1 h"), (7390, "2 h 3 min"), (0.4, "0 s")]
)
def test_durations_read_as_people_say_them(seconds, text):
    assert timelimit.duration(seconds) == text


def test_a_killed_parent_takes_the_launcher_and_its_child_along(tmp_path):
    proc = start_launcher(tmp_path, SLEEPER, parent=True)
    launcher = int(proc.stdout.readline())
    wait_for(tmp_path / "cell/child.pid")
    child = int((tmp_path / "cell/child.pid").read_text())
    proc.kill()  # SIGKILL: nothing of the parent runs any more
    proc.wait()
    deadline = time.monotonic() + 10
    while (alive(launcher) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(launcher) and not alive(child)
    assert not (tmp_path / "cell/record.json").exists()


ENV_DUMP = """
    import json, os, sys
    json.dump({"cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}, open(sys.argv[1] + "/env.json", "w"))
"""


def test_a_job_that_reserved_no_gpu_sees_none(tmp_path):
    # dpstudy.jobs.gpus.job_environment's policy (tests/unit/jobs/test_gpus.py pins it for 0 and 2 GPUs)
    proc = start_launcher(tmp_path, ENV_DUMP, gpus=0, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    proc.wait(timeout=60)
    assert json.loads((tmp_path / "cell/env.json").read_text()) == {"cvd": ""}


@pytest.mark.parametrize(
    "spec, reason",
    [
        ({**DDP, "backend": "nccl"}, "backend nccl needs CUDA GPUs; on CPU only gloo runs"),
        ({**SINGLE, "mode": "dp", "gpus": 2}, "mode dp needs CUDA: nn.DataParallel splits batches over GPUs only"),
        ({**SINGLE, "device": "cuda"}, "device 'cuda' was requested but no CUDA device is visible"),
    ],
)
def test_a_cell_needing_cuda_in_a_job_without_gpus_is_skipped_without_starting(tmp_path, spec, reason):
    proc = start_launcher(tmp_path, MARKER, gpus=0, spec=spec)
    assert proc.wait(timeout=60) == 0
    rec = record.read(tmp_path / "cell/record.json")
    assert (rec["status"], rec["reason"], rec["spec"]) == ("skipped", reason, spec)
    assert rec["env"]["world_size"] == (2 if spec["mode"] == "ddp" else 1) and rec["env"]["nodes"] == 1
    assert not (tmp_path / "cell/trained").exists()


@pytest.mark.parametrize("skip", ["predicted 1.00 GiB > 0.5 GiB per device (study memory_budget_gib, memory plan)", ""])
def test_a_cell_the_memory_plan_skips_is_recorded_without_starting(tmp_path, skip):
    plan = tmp_path / "memory.csv"
    plan.write_text(
        "cell,device,params_mb,grads_mb,optimizer_mb,activations_mb,peak_mb,reason,skip\n"
        f'c,0,100,100,200,300,700,,"{skip}"\nc,1,100,100,0,824,1024,,"{skip}"\n'
        "other,0,1,1,1,9000,9003,,predicted 8.79 GiB > 0.5 GiB per device\n"
    )
    proc = start_launcher(tmp_path, MARKER, extra=("--memory-plan", str(plan)))
    assert proc.wait(timeout=60) == 0
    assert (tmp_path / "cell/trained").exists() == (not skip)  # another cell's verdict is not this one's
    if skip:
        rec = record.read(tmp_path / "cell/record.json")
        assert (rec["status"], rec["reason"]) == ("skipped", skip)


def test_gpus_a_scheduler_gave_are_kept(tmp_path):
    proc = start_launcher(tmp_path, ENV_DUMP, gpus=1, env={"CUDA_VISIBLE_DEVICES": "1"})
    proc.wait(timeout=60)
    assert json.loads((tmp_path / "cell/env.json").read_text()) == {"cvd": "1"}


# ---- retries after SLURM stopped a job --------------------------------------------------------


def fake_slurm(tmp_path: Path, sacct_line: str, stdout: str = "/dev/null") -> dict:
    """sacct and scontrol stand-ins on PATH; SLURM_JOB_ID is the retry's own job (43), writing to `stdout`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text(f"#!/bin/sh\necho '{sacct_line}'\n")
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho 'JobId=43 JobState=RUNNING StdOut={stdout}'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "43"}


def previous_attempt(tmp_path: Path, output: str = "") -> None:
    (tmp_path / "cell").mkdir()
    (tmp_path / "slurm-42.out").write_text(output)
    (tmp_path / "cell/attempt.json").write_text(
        json.dumps({"attempt": 1, "scheduler": "slurm", "job_id": "42", "stdout": str(tmp_path / "slurm-42.out")})
    )


def test_a_retry_after_a_time_limit_records_slurms_reason_without_training(tmp_path):
    previous_attempt(tmp_path)
    proc = start_launcher(tmp_path, MARKER, attempt=2, env=fake_slurm(tmp_path, "TIMEOUT|TimeLimit|00:01:26|00:01:00"))
    assert proc.wait(timeout=60) == 0
    rec = record.read(tmp_path / "cell/record.json")
    assert rec["status"] == "failed"
    assert rec["reason"] == (
        "SLURM job 42 was stopped at its time limit of 00:01:00 after 00:01:26 (state TIMEOUT, reason TimeLimit)"
    )
    assert not (tmp_path / "cell/trained").exists()


def test_a_retry_after_a_memory_kill_quotes_slurmstepd(tmp_path):
    previous_attempt(
        tmp_path,
        "epoch 1/3 ...\nslurmstepd-n1: error: StepId=42.0 exceeded memory limit "
        "(608686080 > 209715200), being killed\n",
    )
    proc = start_launcher(
        tmp_path, MARKER, attempt=2, env=fake_slurm(tmp_path, "FAILED|NonZeroExitCode|00:00:05|01:00:00")
    )
    assert proc.wait(timeout=60) == 0
    reason = record.read(tmp_path / "cell/record.json")["reason"]
    assert reason.startswith("SLURM job 42 was stopped at its memory limit (state FAILED, reason NonZeroExitCode)")
    assert "StepId=42.0 exceeded memory limit (608686080 > 209715200)" in reason


def test_a_retry_finds_a_previous_attempt_that_slurm_stopped_before_the_launcher_ran(tmp_path):
    # The executor's folder of this cell's SLURM outputs: an older run's job, then attempt 1, whose
    # batch step went over the memory limit before it started the launcher (so no attempt.json).
    logs = tmp_path / "slurm_logs/rule_train/cell"
    logs.mkdir(parents=True)
    (logs / "9.log").write_text("an older run of this cell\n")
    (logs / "42.log").write_text(
        "slurmstepd-n1: error: StepId=42.batch exceeded memory limit (239439872 > 209715200), being killed\n"
        "slurmstepd-n1: error: Exceeded job memory limit\n"
    )
    (logs / "43.log").write_text("")
    env = fake_slurm(tmp_path, "FAILED|OutOfMemory|00:00:04|00:10:00", stdout=str(logs / "43.log"))
    proc = start_launcher(tmp_path, MARKER, attempt=2, env=env)
    assert proc.wait(timeout=60) == 0
    reason = record.read(tmp_path / "cell/record.json")["reason"]
    assert reason == (
        "SLURM job 42 was stopped at its memory limit (state FAILED, reason OutOfMemory): slurmstepd-n1: error: "
        "StepId=42.batch exceeded memory limit (239439872 > 209715200), being killed"
    )
    assert not (tmp_path / "cell/trained").exists()


def test_a_retry_after_a_cancel_ends_without_a_record(tmp_path):
    previous_attempt(tmp_path)
    proc = start_launcher(
        tmp_path, MARKER, attempt=2, env=fake_slurm(tmp_path, "CANCELLED by 0|None|00:00:20|01:00:00")
    )
    assert proc.wait(timeout=60) == 1
    assert not (tmp_path / "cell/record.json").exists() and not (tmp_path / "cell/trained").exists()


def test_a_retry_after_any_other_ending_trains_again(tmp_path):
    previous_attempt(tmp_path)
    proc = start_launcher(tmp_path, MARKER, attempt=2, env=fake_slurm(tmp_path, "NODE_FAIL|None|00:00:20|01:00:00"))
    proc.wait(timeout=60)
    assert (tmp_path / "cell/trained").read_text() == "yes"
    assert "SLURM job 42 ended (state NODE_FAIL)" in (tmp_path / "cell/train.log").read_text()


@pytest.mark.parametrize(
    "sacct, scontrol, kind",
    [
        (None, "JobId=42 JobState=TIMEOUT Reason=TimeLimit RunTime=00:01:12 TimeLimit=00:01:00", "time"),
        ("OUT_OF_MEMORY|OutOfMemory|00:00:03|01:00:00", "", "memory"),
        ("COMPLETED|None|00:00:03|01:00:00", "", "other"),
    ],
)
def test_verdicts_come_from_sacct_else_from_scontrol(monkeypatch, sacct, scontrol, kind):
    answers = {"sacct": sacct, "scontrol": scontrol}
    monkeypatch.setattr(slurm, "run", lambda *argv: answers[argv[0]])
    assert slurm.verdict("42", None).kind == kind


def test_a_memory_verdict_quotes_the_line_with_the_numbers(monkeypatch, tmp_path):
    # slurmstepd's lines as a killed job's output had them, the numberless one first
    output = tmp_path / "6.log"
    output.write_text(
        "epoch 1/2 ...\nslurmstepd-n2: error: Exceeded job memory limit\n"
        "slurmstepd-n2: error: StepId=6.0 exceeded memory limit (700989440 > 209715200), being killed\n"
        "srun: error: n2: task 0: Killed\n"
    )
    monkeypatch.setattr(
        slurm, "run", lambda *argv: "FAILED|NonZeroExitCode|00:00:09|00:10:00" if argv[0] == "sacct" else ""
    )
    verdict = slurm.verdict("6", str(output))
    assert verdict.kind == "memory"
    assert verdict.text == (
        "SLURM job 6 was stopped at its memory limit (state FAILED, reason NonZeroExitCode): "
        "slurmstepd-n2: error: StepId=6.0 exceeded memory limit (700989440 > 209715200), being killed"
    )
    output.write_text("slurmstepd-n2: error: Exceeded job memory limit\n")
    assert slurm.verdict("6", str(output)).text.endswith(": slurmstepd-n2: error: Exceeded job memory limit")
