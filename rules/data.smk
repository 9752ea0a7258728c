# Datasets: downloaded and verified, or generated; meta.json is the ready marker.


# Downloads run where Snakemake runs (a cluster's login node): compute nodes often have no
# internet access, and every node reads the prepared files from the shared file system.
localrules:
    prepare_data,


rule prepare_data:
    output:
        f"{DATA_ROOT}/{{dataset}}/meta.json",
    log:
        f"{DATA_ROOT}/{{dataset}}/prepare.log",
    conda:
        "../envs/train.yaml"
    params:
        root=lambda wc, output: Path(output[0]).parent.parent,
        overrides=lambda wc: studies.JsonDict(STUDY["datasets"].get(wc.dataset, {})),
    shell:
        "python scripts/prepare_data.py {wildcards.dataset:q} --root {params.root:q}"
        " --overrides {params.overrides:q} > {log:q} 2>&1"
