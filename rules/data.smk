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
    # every cell waits for its data: first, beside the memory plan and the build (common.smk)
    priority: BEFORE_CELLS
    conda:
        "../envs/train.yaml"
    params:
        root=lambda wc, output: Path(output[0]).parent.parent,
        name=lambda wc: DATASETS_BY_FOLDER.get(wc.dataset, wc.dataset),
        overrides=lambda wc: studies.JsonDict(
            STUDY["datasets"].get(DATASETS_BY_FOLDER.get(wc.dataset, wc.dataset), {})
        ),
        # a user dataset's: what its preparation reads (a changed one prepares it anew)
        fingerprint=lambda wc: USER_DATA_FINGERPRINTS.get(
            DATASETS_BY_FOLDER.get(wc.dataset, wc.dataset), ""
        ),
        code_path=lambda wc: STUDY["code_path"] or "",
    shell:
        "python scripts/prepare_data.py {params.name:q} --root {params.root:q}"
        " --overrides {params.overrides:q} --code-path {params.code_path:q} > {log:q} 2>&1"
