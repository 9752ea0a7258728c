# Side branches: the extension's kernels vs Python loops vs PyTorch, and all-reduce bandwidth.


rule kernel_bench:
    input:
        ext=outputs.EXT_BUILD,
        code=code_files("scripts/kernel_bench.py"),
    output:
        csv=outputs.bench_csv("kernels"),
        png=report(f"{outputs.FIGURES_DIR}/kernels.png", category="Microbenchmarks"),
    log:
        f"{outputs.LOGS_DIR}/kernel_bench.log",
    conda:
        "../envs/train.yaml"
    threads: workflow.cores
    resources:
        gpu=STUDY.kernel_bench_gpus,
    params:
        ext=lambda wildcards, input: Path(input.ext).parent,
    shell:
        "OMP_NUM_THREADS={threads} python -m dpstudy.jobs.gpus --gpus {resources.gpu} --"
        " python scripts/kernel_bench.py --ext {params.ext:q} --out {output.csv:q} --png {output.png:q}"
        " > {log:q} 2>&1"


rule comm_bench:
    input:
        code=code_files("scripts/comm_bench.py"),
    output:
        csv=outputs.bench_csv("comm"),
        png=report(f"{outputs.FIGURES_DIR}/comm.png", category="Microbenchmarks"),
    log:
        f"{outputs.LOGS_DIR}/comm_bench.log",
    conda:
        "../envs/train.yaml"
    threads: workflow.cores
    resources:
        gpu=STUDY.comm_bench_gpus,
    params:
        # a param: a study that runs or forecasts another world size measures again
        world_sizes=" ".join(map(str, STUDY.comm_world_sizes)),
    shell:
        "python -m dpstudy.jobs.gpus --gpus {resources.gpu} --"
        " python scripts/comm_bench.py --out {output.csv:q} --png {output.png:q}"
        " --world-sizes {params.world_sizes} > {log:q} 2>&1"


# The machine's floor (dpstudy.microbench.floor): a reference workload once per repeat round, after
# the round's training cells and before the next round's (its priority is above theirs), taking the
# machine as a one-device cell takes it. A rerun of a round's cells measures its floor again.
rule floor:
    input:
        code=code_files("dpstudy.microbench.floor"),
        cells=floor_round_records,
    output:
        outputs.floor_path("{repeat}"),
    log:
        f"{outputs.LOGS_DIR}/floor_r{{repeat}}.log",
    wildcard_constraints:
        repeat="[0-9]+",
    priority: floor_priority
    conda:
        "../envs/train.yaml"
    threads: floor_threads
    resources:
        gpu=floor_resource("gpu"),
        gres=floor_resource("gres"),
        cpus_per_task=floor_resource("cpus_per_task"),
        cpus_per_gpu=floor_resource("cpus_per_gpu"),
        mem_mb=floor_resource("mem_mb"),
        runtime=floor_resource("runtime"),
    params:
        device=lambda wildcards: STUDY.floor_cell.spec["device"],
        seconds=STUDY.config["bench"]["floor_seconds"],
        cores=floor_resource("node_cores"),
    shell:
        "python -m dpstudy.jobs.gpus --gpus {resources.gpu} --"
        " python -m dpstudy.microbench.floor --repeat {wildcards.repeat} --seconds {params.seconds}"
        " --device {params.device} --cores {params.cores} --out {output:q} > {log:q} 2>&1"
