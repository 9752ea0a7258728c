# Records -> tidy tables -> figures -> the executed report notebook and its HTML page.
TABLES = outputs.table_files()
FIGURE_FILES = outputs.figure_files()


# `--keep-going` (profiles/default sets it): collect, a local rule that inherits this, lists an
# unreadable record and collects the rest, so the report is still made; without it collect stops
# at that record. Read when the run starts (onstart, rules/common.smk: the settings are not known while the Snakefile is
# parsed); an environment variable, not a param, so flipping the flag reruns nothing.
rule collect:
    input:
        records=STUDY.records,
        # comm_bench's table, whose fits price the step model's collectives, when the study measures it
        comm=STUDY.comm_files,
        # every cell's predicted memory, beside what the records measured
        plan=outputs.MEMORY_PLAN,
        # the machine's floor runs, the noise no cell can go below
        floor=STUDY.floor_files,
        # The collect script and everything it imports, the training code included (collect
        # flags the cells made with older training code): editing training code reruns no
        # cell, but the tables and the report are redone. The same for the user's factories.
        code=code_files("scripts/collect.py"),
        factories=STUDY.user_model_files,
    output:
        TABLES,
    log:
        f"{outputs.LOGS_DIR}/collect.log",
    conda:
        "../envs/report.yaml"
    params:
        comm=lambda wildcards, input: ["--comm", *input.comm] if input.comm else [],
        floor=lambda wildcards, input: ["--floor", *input.floor] if input.floor else [],
        # the study's forecast: block, as the forecasts to make (a new one reruns collect alone)
        forecast=STUDY.forecast_requests,
        # what a forecast must fit in: the study's budget (a new one reruns collect alone)
        budget=STUDY.budget_args("--memory-budget-gib"),
        out_dir=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "python scripts/collect.py --records {input.records:q} --out-dir {params.out_dir:q}"
        " {params.comm:q} --memory-plan {input.plan:q} {params.floor:q} --forecast {params.forecast:q}"
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
    params:
        tables=lambda wildcards, input: Path(input.tables[0]).parent,
        out=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "python scripts/figures.py --tables {params.tables:q} --out {params.out:q} > {log:q} 2>&1"


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
    # the memory plan's input: first, with it (Study.before_cells)
    priority: STUDY.before_cells
    params:
        study=sweeps.JsonDict(STUDY.config),
    run:
        # The study as it ran (every default filled in), shown at the end of the report.
        sweeps.write_yaml(STUDY.config, output[0])


rule report:
    input:
        notebook="notebooks/report.ipynb",
        study=outputs.STUDY_YAML,
        tables=TABLES,
        figures=FIGURE_FILES,
        bench=STUDY.bench_files,
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
        study=STUDY.config["study"],
        out_dir=lambda wildcards, output: Path(output.html).parent,
        tables=lambda wildcards, input: Path(input.tables[0]).parent,
        figures=lambda wildcards, input: Path(input.figures[0]).parent,
        bench=bench_folder,
    shell:
        "python scripts/report.py --notebook {input.notebook:q} --out-dir {params.out_dir:q}"
        " --study {params.study:q} --config {input.study:q} --tables {params.tables:q}"
        " --figures {params.figures:q} --bench {params.bench:q} > {log:q} 2>&1"
