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
        gpu=1 if GPU_JOBS else 0,
    shell:
        "OMP_NUM_THREADS={threads} python -m dpstudy.jobs.gpus --gpus {resources.gpu} --"
        f" python scripts/kernel_bench.py --ext {outputs.EXT_DIR} --out {{output.csv:q}} --png {{output.png:q}}"
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
        gpu=comm_bench_gpus(GPU_JOBS, visible_gpu_count()),
    shell:
        "python -m dpstudy.jobs.gpus --gpus {resources.gpu} --"
        " python scripts/comm_bench.py --out {output.csv:q} --png {output.png:q} > {log:q} 2>&1"
