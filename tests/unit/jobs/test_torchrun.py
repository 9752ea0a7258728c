"""dpstudy.jobs.torchrun: torchrun's agent, as the launcher starts it, ends as torchrun ends."""

import subprocess

import pytest

from dpstudy.jobs import cell_command, exits
from dpstudy.jobs.torchrun import exit_code


def agent(tmp_path, script: str) -> subprocess.CompletedProcess:
    path = tmp_path / "rank.py"
    path.write_text(script)
    cmd = [*cell_command.torchrun(tmp_path / "logs"), "--standalone", "--nproc-per-node=1", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_a_rank_that_ends_well_ends_the_agent_with_0(tmp_path):
    proc = agent(tmp_path, "print('rank done', flush=True)\n")
    assert proc.returncode == 0, proc.stderr
    assert "rank done" in proc.stdout


def test_a_failed_rank_ends_it_with_1_and_torchruns_root_cause(tmp_path):
    proc = agent(tmp_path, "import sys\nsys.exit(3)\n")
    assert proc.returncode == 1
    assert "ChildFailedError" in proc.stderr  # the traceback Python prints for it
    assert exits.first_failure(proc.stderr) == (0, 3), proc.stderr[-2000:]


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (5, 5), ("usage: torchrun ...", 1)])
def test_system_exit_gives_pythons_status(code, status, capsys):
    assert exit_code(SystemExit(code)) == status
    assert capsys.readouterr().err == ("usage: torchrun ...\n" if isinstance(code, str) else "")
