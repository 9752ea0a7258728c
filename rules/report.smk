# Records -> tidy tables -> figures -> the executed report notebook and its HTML page.
import json
import os

from dpstudy.study import predict

TABLES = outputs.table_files()
FIGURE_FILES = outputs.figure_files()
# The microbenchmarks the study asks for (config `bench`), shown in the report.
BENCH_FILES = [
    outputs.bench_csv(name) for name in outputs.BENCHMARKS if STUDY["bench"][name]
]


# `--keep-going` (profiles/default sets it): collect, a local rule that inherits this, lists an
# unreadable record and collects the rest, so the report is still made; without it collect stops
# at that record. Read when the run starts (the settings are not known while the Snakefile is
# parsed); an environment variable, not a param, so flipping the flag reruns nothing.
onstart:
    os.environ["DPSTUDY_KEEP_GOING"] = (
        "1" if workflow.execution_settings.keep_going else "0"
    )


rule collect:
    input:
        records=RECORDS,
        # the all-reduce bandwidth of the scaling model, when the study measures it
        comm=[path for path in BENCH_FILES if path == outputs.bench_csv("comm")],
        # every cell's predicted memory, beside what the records measured
        plan=outputs.MEMORY_PLAN,
        # the machine's floor runs, the noise no cell can go below
        floor=FLOOR_FILES,
        # The collect script and everything it imports, the training code included (collect
        # flags the cells made with older training code): editing training code reruns no
        # cell, but the tables and the report are redone. The same for the user's factories.
        code=code_files("scripts/collect.py"),
        factories=USER_MODEL_FILES,
    output:
        TABLES,
    log:
        f"{outputs.LOGS_DIR}/collect.log",
    conda:
        "../envs/report.yaml"
    params:
        comm=lambda wildcards, input: ["--comm", *input.comm] if input.comm else [],
        floor=lambda wildcards, input: ["--floor", *input.floor] if input.floor else [],
        # the study's predict: block, as the forecasts to make (a new one reruns collect alone)
        predict=json.dumps(predict.requests(STUDY), sort_keys=True),
        # what a forecast must fit in: the study's budget (a new one reruns collect alone)
        budget=(
            ["--memory-budget-gib", str(STUDY["memory_budget_gib"])]
            if STUDY["memory_budget_gib"]
            else []
        ),
    shell:
        f"python scripts/collect.py --records {{input.records:q}} --out-dir {outputs.TABLES_DIR}"
        " {params.comm:q} --memory-plan {input.plan:q} {params.floor:q} --predict {params.predict:q}"
        " {params.budget:q}"
        " > {log:q} 2>&1"


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
        f"{outputs.LOGS_DIR}/figures.log",
    conda:
        "../envs/report.yaml"
    shell:
        f"python scripts/figures.py --tables {outputs.TABLES_DIR} --out {outputs.FIGURES_DIR} > {{log:q}} 2>&1"


# Short jobs that read and write a few files run where Snakemake runs, also under a cluster
# profile: submitting them would cost more than running them.
localrules:
    collect,
    memory_plan,
    figures,
    study_config,
    report,


rule study_config:
    output:
        outputs.STUDY_YAML,
    log:
        f"{outputs.LOGS_DIR}/study_config.log",
    # the memory plan's input: first, with it (common.smk)
    priority: BEFORE_CELLS
    params:
        study=studies.JsonDict(STUDY),
    run:
        # The study as it ran (every default filled in), shown at the end of the report.
        studies.write_yaml(STUDY, output[0])


rule report:
    input:
        notebook="notebooks/report.ipynb",
        study=outputs.STUDY_YAML,
        tables=TABLES,
        figures=FIGURE_FILES,
        bench=BENCH_FILES,
        # The notebook's imports too: the report's prose is code of dpstudy.report.
        code=[
            *code_files("scripts/report.py", "notebooks/report.ipynb"),
            "notebooks/templates/offline/index.html.j2",
        ],
    output:
        notebook=outputs.REPORT_NOTEBOOK,
        html=outputs.REPORT_HTML,
    log:
        f"{outputs.LOGS_DIR}/report.log",
    conda:
        "../envs/report.yaml"
    params:
        study=STUDY["study"],
    shell:
        f"python scripts/report.py --notebook {{input.notebook:q}} --out-dir {outputs.REPORT_DIR}"
        f" --study {{params.study:q}} --config {{input.study:q}} --tables {outputs.TABLES_DIR}"
        f" --figures {outputs.FIGURES_DIR} --bench {outputs.BENCH_DIR} > {{log:q}} 2>&1"
