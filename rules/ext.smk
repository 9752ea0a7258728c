# The project's C++/CUDA extension, built once for the cells whose model needs it.


rule build_ext:
    input:
        sources=[
            f"dpstudy/ext/{path}"
            for path in glob_wildcards("dpstudy/ext/{path}").path
            if path.endswith((".cpp", ".cu", ".h", ".cuh", ".py"))
            and "__pycache__" not in path
        ],
    output:
        "results/ext/build.json",
    log:
        "results/logs/build_ext.log",
    conda:
        "../envs/train.yaml"
    params:
        cuda_arch=STUDY["ext"].get("cuda_arch"),
    shell:
        "python scripts/build_ext.py --out results/ext"
        " $( [ -n '{params.cuda_arch}' ] && [ '{params.cuda_arch}' != None ] && echo --cuda-arch '{params.cuda_arch}' )"
        " > {log:q} 2>&1"
