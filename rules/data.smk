# Datasets: downloaded and verified, or generated; meta.json is the ready marker.


rule prepare_data:
    output:
        f"{DATA_ROOT}/{{dataset}}/meta.json",
    params:
        overrides=lambda wc: studies.JsonDict(STUDY["datasets"].get(wc.dataset, {})),
    log:
        f"{DATA_ROOT}/{{dataset}}/prepare.log",
    conda:
        "../envs/train.yaml"
    shell:
        "python scripts/prepare_data.py {wildcards.dataset} --root {DATA_ROOT:q}"
        " --overrides {params.overrides:q} > {log:q} 2>&1"
