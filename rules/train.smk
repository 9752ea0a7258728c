# One job per cell: python for single and dp, torchrun for ddp, on GPUs of its own.


rule train:
    input:
        # ancient: re-preparing a dataset or rebuilding the extension does not rerun the grid.
        data=lambda wc: ancient(cell_dataset(wc)),
        ext=lambda wc: [ancient(path) for path in cell_ext(wc)],
    output:
        "results/cells/{cell}/record.json",
    log:
        "results/cells/{cell}/train.log",
    benchmark:
        "results/cells/{cell}/benchmark.tsv"
    conda:
        "../envs/train.yaml"
    threads: cell_threads
    resources:
        gpu=cell_gpus,
        cell_cores=cell_cores,
    params:
        spec=cell_spec,
    shell:
        # A failed cell still leaves its record (status failed, with the error) for the report;
        # only a run that wrote no valid record fails the job.
        """
        if [ {params.spec[mode]} = ddp ]; then
            launch="torchrun --standalone --nproc-per-node={params.spec[gpus]}"
        else
            launch=python
        fi
        python -m dpstudy.gpus --gpus {resources.gpu} -- $launch scripts/train.py \\
        --spec {params.spec:q} --out results/cells/{wildcards.cell} --cell {wildcards.cell} \\
        --cores {resources.cell_cores} >{log:q} 2>&1 \
            || python -m dpstudy.record --status failed {output:q} >>{log:q} 2>&1
        """
