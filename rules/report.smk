# Records -> tidy tables -> figures -> the executed report notebook and its HTML page.
from dpstudy.analysis.collect import STALE_FILE, TABLES as TABLE_NAMES
from dpstudy.report.figures import FIGURES

TABLES = [f"results/tables/{name}.csv" for name in TABLE_NAMES] + [
    f"results/tables/{STALE_FILE}"
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
        # the all-reduce bandwidth of the scaling model, when the study measures it
        comm=[path for path in BENCH_FILES if path.endswith("comm.csv")],
        # The collect script and everything it imports, the training code included (collect
        # flags the cells made with older training code): editing training code reruns no
        # cell, but the tables and the report are redone.
        code=code_files("scripts/collect.py"),
    output:
        TABLES,
    log:
        "results/logs/collect.log",
    conda:
        "../envs/report.yaml"
    params:
        comm=lambda wildcards, input: ["--comm", *input.comm] if input.comm else [],
    shell:
        "python scripts/collect.py --records {input.records:q} --out-dir results/tables"
        " {params.comm:q} > {log:q} 2>&1"


rule figures:
    input:
        tables=TABLES,
        code=code_files("scripts/figures.py"),
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
        # The notebook's imports too: the report's prose is code of dpstudy.report.
        code=[
            *code_files("scripts/report.py", "notebooks/report.ipynb"),
            "notebooks/templates/offline/index.html.j2",
        ],
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
        "python scripts/report.py --notebook {input.notebook:q} --out-dir results/report"
        " --study {params.study:q} --config {input.study:q} --tables results/tables"
        " --figures results/figures --bench results/bench > {log:q} 2>&1"
