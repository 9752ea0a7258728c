# Records -> tidy tables -> figures -> the executed report notebook and its HTML page.
from dpstudy.plots import FIGURES
from dpstudy.provenance import training_files

TABLES = [
    f"results/tables/{name}"
    for name in ("cells.csv", "epochs.csv", "ranks.csv", "util.csv", "stale.txt")
]
FIGURE_FILES = [f"results/figures/{name}" for name in FIGURES]
REPORT_HTML = "results/report/report.html"
# The microbenchmarks the study asks for (config `bench`), shown in the report.
BENCH_FILES = [
    path
    for path, wanted in (
        ("results/bench/kernels.csv", STUDY["bench"]["kernels"]),
        ("results/bench/comm.csv", STUDY["bench"]["comm"]),
    )
    if wanted
]
STUDY_YAML = "results/report/study.yaml"


rule collect:
    input:
        records=RECORDS,
        code=["dpstudy/collect.py", "scripts/collect.py"],
        # Training code is an input of collect, not of train: editing it reruns no cell, but
        # the tables and the report are redone and flag the cells made with older code.
        training_code=training_files(),
    output:
        TABLES,
    log:
        "results/logs/collect.log",
    conda:
        "../envs/report.yaml"
    shell:
        "python scripts/collect.py --records {input.records:q} --out-dir results/tables > {log:q} 2>&1"


rule figures:
    input:
        tables=TABLES,
        code=["dpstudy/plots.py", "scripts/figures.py"],
    output:
        [
            report(path, category="Figures", caption="../notebooks/figure_caption.rst")
            for path in FIGURE_FILES
        ],
    log:
        "results/logs/figures.log",
    conda:
        "../envs/report.yaml"
    shell:
        "python scripts/figures.py --tables results/tables --out results/figures > {log:q} 2>&1"


# Short jobs that read and write a few files run where Snakemake runs, also under a cluster
# profile: submitting them would cost more than running them.
localrules:
    collect,
    figures,
    study_config,
    report,


rule study_config:
    output:
        STUDY_YAML,
    log:
        "results/logs/study_config.log",
    params:
        study=studies.JsonDict(STUDY),
    run:
        # The study as it ran (every default filled in), shown at the end of the report.
        studies.write_yaml(STUDY, output[0])


rule report:
    input:
        notebook="notebooks/report.ipynb",
        study=STUDY_YAML,
        tables=TABLES,
        figures=FIGURE_FILES,
        bench=BENCH_FILES,
        code=["dpstudy/findings.py", "scripts/report.py"],
    output:
        notebook="results/report/report.ipynb",
        html=REPORT_HTML,
    log:
        "results/logs/report.log",
    conda:
        "../envs/report.yaml"
    params:
        study=STUDY["study"],
    shell:
        "python scripts/report.py --notebook {input.notebook} --out-dir results/report"
        " --study {params.study} --config {input.study} --tables results/tables"
        " --figures results/figures --bench results/bench > {log:q} 2>&1"
