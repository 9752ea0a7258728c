# The project's C++/CUDA extension, built once for the cells whose model needs it.


rule build_ext:
    input:
        code=code_files("scripts/build_ext.py"),
        sources=native_files(),
    output:
        outputs.EXT_BUILD,
    log:
        f"{outputs.LOGS_DIR}/build_ext.log",
    # beside the memory plan, before the timed cells (Study.before_cells)
    priority: STUDY.before_cells
    conda:
        "../envs/train.yaml"
    params:
        # dpstudy.ext.arch.build_args: the architectures, and --require-cuda when cells will
        # run on CUDA. :q quotes each argument: no config value reaches the shell as code.
        args=STUDY.ext_build_args,
        # The library links against one torch: another torch (make setup TORCH=system, a new
        # lock) reruns the build. Read from torch's version file, without importing torch.
        torch=torch_version(),
        out=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "python scripts/build_ext.py --out {params.out:q} {params.args:q} > {log:q} 2>&1"
