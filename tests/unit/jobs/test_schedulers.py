"""profiles/cluster-generic's commands: a job's resources -> PBS, SGE, LSF and SLURM submissions,
and each scheduler's answer -> running | success | failed. (test_cluster runs the SLURM one.)"""

import json

import pytest

from dpstudy.jobs import schedulers
from dpstudy.study.resources import train_resources
from dpstudy.study.spec import complete

SPEC = complete(
    {
        "dataset": "synthetic",
        "model": "lenet",
        "mode": "ddp",
        "gpus": 2,
        "backend": "nccl",
        "workers": 1,
        "loader": "torch",
    }
)


def properties(spec=SPEC, gpus=True, **extra) -> dict:
    """What Snakemake writes into a job script for a train job of `spec` (None resources dropped)."""
    job = {"mem_mb_per_process": 3000, "mem_mb_per_job": 0, "runtime_min": 90, "collective_timeout_min": 5}
    res = {k: v for k, v in train_resources(spec, job, gpus).items() if v is not None}
    return {"rule": "train", "wildcards": {"cell": "c1"}, "threads": 4, "resources": {**res, **extra}}


def test_job_properties_are_read_from_the_job_script(tmp_path):
    script = tmp_path / "snakejob.train.1.sh"
    script.write_text(f"#!/bin/sh\n# properties = {json.dumps(properties())}\nexec snakemake\n")
    assert schedulers.read_properties(script) == properties()
    (tmp_path / "other.sh").write_text("#!/bin/sh\n")
    with pytest.raises(ValueError, match="no '# properties = ' line"):
        schedulers.read_properties(tmp_path / "other.sh")


def test_the_request_follows_the_cells_resources():
    r = schedulers.request_of(properties(queue="gpuq", account="proj"))
    assert (r.nodes, r.cpus, r.gpus, r.mem_mb, r.runtime_min, r.queue, r.account) == (1, 4, 2, 6000, 90, "gpuq", "proj")
    multi = schedulers.request_of(properties({**SPEC, "nodes": 2}))
    assert (multi.nodes, multi.cpus, multi.gpus) == (2, 4, 2)  # per node, from gres gpu:2
    cpu = schedulers.request_of(properties(gpus=False))
    assert (cpu.cpus, cpu.gpus) == (4, 0)


@pytest.mark.parametrize(
    "scheduler, expected",
    [
        (
            "pbs",
            [
                "qsub",
                "-N",
                "dpstudy.train.c",
                "-l",
                "select=1:ncpus=4:mem=6000mb:ngpus=2",
                "-l",
                "walltime=01:30:00",
                "-j",
                "oe",
                "-o",
                ".snakemake/cluster_logs/",
                "-V",
                "-q",
                "gpuq",
                "-A",
                "proj",
                "job.sh",
            ],
        ),
        (
            "sge",
            [
                "qsub",
                "-terse",
                "-cwd",
                "-V",
                "-N",
                "dpstudy.train.c1",
                "-pe",
                "smp",
                "4",
                "-l",
                "h_rt=01:30:00,h_vmem=1500M,gpu=2",
                "-j",
                "y",
                "-o",
                ".snakemake/cluster_logs/dpstudy.train.c1.$JOB_ID.log",
                "-q",
                "gpuq",
                "-P",
                "proj",
                "job.sh",
            ],
        ),
        (
            "lsf",
            [
                "bsub",
                "-J",
                "dpstudy.train.c1",
                "-n",
                "4",
                "-R",
                "span[ptile=4] rusage[mem=1500]",
                "-W",
                "90",
                "-o",
                ".snakemake/cluster_logs/dpstudy.train.c1.%J.log",
                "-gpu",
                "num=2",
                "-q",
                "gpuq",
                "-P",
                "proj",
            ],
        ),
        (
            "slurm",
            [
                "sbatch",
                "--parsable",
                "-J",
                "dpstudy.train.c1",
                "--nodes=1",
                "--ntasks-per-node=1",
                "--cpus-per-task=4",
                "--mem=6000",
                "--time=90",
                "-o",
                ".snakemake/cluster_logs/dpstudy.train.c1.%j.log",
                "--gres=gpu:2",
                "-p",
                "gpuq",
                "-A",
                "proj",
                "job.sh",
            ],
        ),
    ],
)
def test_submissions(scheduler, expected):
    r = schedulers.request_of(properties(queue="gpuq", account="proj"))
    assert schedulers.submit_command(scheduler, r, "job.sh") == expected


@pytest.mark.parametrize(
    "scheduler, out, job",
    [
        ("pbs", "1234.pbsserver\n", "1234.pbsserver"),
        ("sge", "5678\n", "5678"),
        ("lsf", "Job <91011> is submitted to queue <gpu>.\n", "91011"),
        ("slurm", "42\n", "42"),
    ],
)
def test_job_ids_are_read_from_the_submission(scheduler, out, job):
    assert schedulers.parse_job_id(scheduler, out) == job


def answers(mapping):
    return lambda *argv: mapping.get(argv[0])


@pytest.mark.parametrize(
    "scheduler, replies, status",
    [
        ("pbs", {"qstat": json.dumps({"Jobs": {"1.s": {"job_state": "R"}}})}, "running"),
        ("pbs", {"qstat": json.dumps({"Jobs": {"1.s": {"job_state": "F", "Exit_status": 0}}})}, "success"),
        ("pbs", {"qstat": json.dumps({"Jobs": {"1.s": {"job_state": "F", "Exit_status": 271}}})}, "failed"),
        ("sge", {"qstat": "job_number: 5"}, "running"),
        ("sge", {"qacct": "failed       0\nexit_status  0\n"}, "success"),
        ("sge", {"qacct": "failed       37  : qmaster enforced h_rt limit\nexit_status  137\n"}, "failed"),
        ("lsf", {"bjobs": "RUN\n"}, "running"),
        ("lsf", {"bjobs": "DONE\n"}, "success"),
        ("lsf", {"bjobs": "EXIT\n"}, "failed"),
        ("slurm", {"sacct": "RUNNING\n"}, "running"),
        ("slurm", {"squeue": "COMPLETED\n"}, "success"),
        ("slurm", {"sacct": "TIMEOUT\n"}, "failed"),
        ("slurm", {"sacct": "OUT_OF_MEMORY\n"}, "failed"),
    ],
)
def test_statuses(scheduler, replies, status):
    assert schedulers.status_of(scheduler, "1", run=answers(replies)) == status


def test_an_unknown_scheduler_is_named():
    with pytest.raises(ValueError, match="scheduler 'htcondor' is not one of pbs, sge, lsf, slurm"):
        schedulers.submit_command("htcondor", schedulers.request_of(properties()), "job.sh")
