# dpstudy: a study config -> one training job per cell -> tidy tables -> figures -> HTML report.
# The rules only name files, resources and commands; every decision lives in the dpstudy package.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/ext.smk"
include: "rules/train.smk"
include: "rules/report.smk"


rule all:
    input:
        REPORT_HTML,
