# dpstudy: a study config -> one training job per cell -> tidy tables -> figures -> HTML report.
# The rules only name files, resources and commands; every decision lives in the dpstudy package.
from snakemake.utils import min_version

min_version("9.0")


# The default study, unless the command line names one (`--configfile STUDY.yaml`): a study is a
# whole config, so nothing of the quickstart (its optimizer, its repeats) leaks into another.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/ext.smk"
include: "rules/train.smk"
include: "rules/microbench.smk"
include: "rules/report.smk"


rule all:
    input:
        # Records are targets themselves: a deleted record reruns its cell even though the
        # report that was made from it still exists.
        STUDY.records,
        outputs.REPORT_HTML,
