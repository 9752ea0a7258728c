# One job per cell: dpstudy.jobs.launch starts python (single, dp), torchrun (ddp) or srun torchrun
# (ddp on several nodes) on the GPUs the job reserved, and makes sure of how the job ends.


rule train:
    input:
        # ancient: re-preparing a registry dataset or rebuilding the extension does not rerun
        # the grid; a user's own dataset prepared anew does (cell_dataset).
        data=cell_dataset,
        ext=cell_ext,
        # Only a study with memory_budget_gib waits for the memory plan, whose verdicts it
        # needs. ancient: a new prediction reruns no cell. Caveat (Snakemake 9): a job whose
        # only link to a rerunning job is an ancient input is not checked for its own params,
        # so under a budget a changed setting reruns its cells only with --forcerun.
        plan=cell_memory_plan,
    output:
        outputs.record_path("{cell}"),
    log:
        f"{outputs.cell_dir('{cell}')}/train.log",
    benchmark:
        f"{outputs.cell_dir('{cell}')}/benchmark.tsv"
    priority: cell_priority
    # A run that packs (profiles/slurm) names the cell's pack: its cells are one scheduler job.
    group:
        cell_group
    conda:
        "../envs/train.yaml"
    threads: cell_threads
    resources:
        # Computed per cell by dpstudy.study.resources; None leaves a resource unset.
        gpu=cell_resource("gpu"),
        gres=cell_resource("gres"),
        cpus_per_task=cell_resource("cpus_per_task"),
        cpus_per_gpu=cell_resource("cpus_per_gpu"),
        mem_mb=cell_resource("mem_mb"),
        runtime=cell_resource("runtime"),
        limit_s=cell_resource("limit_s"),
        collective_timeout_s=cell_resource("collective_timeout_s"),
        nodes=cell_resource("nodes"),
        tasks=cell_resource("tasks"),
        tasks_per_gpu=cell_resource("tasks_per_gpu"),
        mpi=cell_resource("mpi"),
        node_gpus=cell_resource("node_gpus"),
        node_cores=cell_resource("node_cores"),
        # one per group job (profiles/slurm: scope local): a pack's cells run one after another
        pack_slot=cell_resource("pack_slot"),
        # A retry (cluster profiles: retries 1) turns the scheduler's verdict on the attempt
        # it stopped into a failed record; see dpstudy.jobs.launch.
        attempt=lambda wc, attempt: attempt,
    params:
        spec=cell_spec,
        plan=lambda wc, input: f"--memory-plan {input.plan}" if input.plan else "",
        # a param, so that another allocator reruns the cells (their numbers change)
        allocator=STUDY.config["allocator"],
        out=lambda wildcards, output: Path(output[0]).parent,
    shell:
        # Every outcome the cell itself reports (ok, skipped, oom, failed) is a record and a
        # finished job; only a stopped job (cancelled, killed) leaves none.
        "exec python -m dpstudy.jobs.launch --spec {params.spec:q} --cell {wildcards.cell}"
        " --out {params.out:q} --log {log:q} --gpus {resources.node_gpus}"
        " --cores {resources.node_cores} --attempt {resources.attempt} --limit-s {resources.limit_s}"
        " --collective-timeout-s {resources.collective_timeout_s}"
        " --allocator {params.allocator} {params.plan}"


# Every cell's peak memory per device, predicted where Snakemake plans (fake tensors; where that
# host has a GPU, cuBLAS's and cuDNN's workspaces measured on it, dpstudy.workflow.workspaces),
# and the cells predicted not to fit the study's memory_budget_gib.
rule memory_plan:
    input:
        study=outputs.STUDY_YAML,
        code=code_files("scripts/memory_plan.py"),
        # a user dataset's shape and classes are its prepared data's
        data=STUDY.user_data_files,
        factories=STUDY.user_model_files,
    output:
        outputs.MEMORY_PLAN,
    log:
        f"{outputs.LOGS_DIR}/memory_plan.log",
    # first among the jobs ready at the start, so that its table usually precedes training
    priority: STUDY.before_cells
    conda:
        "../envs/train.yaml"
    resources:
        # a GPU of its own where it measures the workspaces: never beside a timed cell on it
        gpu=STUDY.memory_plan_gpus,
    params:
        # in the plan, not in the train jobs: a new budget reruns no cell that already ran
        budget=" ".join(STUDY.budget_args("--budget-gib")),
    shell:
        "python -m dpstudy.jobs.gpus --gpus {resources.gpu} --"
        " python scripts/memory_plan.py --study {input.study:q} --out {output:q} {params.budget}"
        " > {log:q} 2>&1"
