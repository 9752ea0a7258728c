# Datasets: downloaded and verified, or generated; meta.json is the ready marker.


# Downloads run where Snakemake runs (a cluster's login node): compute nodes often have no
# internet access, and every node reads the prepared files from the shared file system.
localrules:
    prepare_data,


rule prepare_data:
    output:
        f"{STUDY.data_folder('{dataset}')}/meta.json",
    log:
        f"{STUDY.data_folder('{dataset}')}/prepare.log",
    # every cell waits for its data: first, beside the memory plan and the build (Study.before_cells)
    priority: STUDY.before_cells
    conda:
        "../envs/train.yaml"
    params:
        root=lambda wc, output: Path(output[0]).parent.parent,
        name=dataset_name,
        overrides=dataset_overrides,
        # a user dataset's: what its preparation reads (a changed one prepares it anew)
        fingerprint=dataset_fingerprint,
        code_path=lambda wc: STUDY.config["code_path"] or "",
    shell:
        "python scripts/prepare_data.py {params.name:q} --root {params.root:q}"
        " --overrides {params.overrides:q} --code-path {params.code_path:q} > {log:q} 2>&1"
