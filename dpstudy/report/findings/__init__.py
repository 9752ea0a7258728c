"""The report's answers to the study's questions (docs/sources.md), from the tables: a module per
question, its section functions re-exported here for the report notebook.

Every section function takes the tables of dpstudy.analysis.collect.summarise (dpstudy.study.outputs.TABLES) and
returns markdown. Repeats of a cell are summarised with 95 % intervals (dpstudy.analysis.stats): a
difference is claimed only when it is larger than its interval, and called "within noise" otherwise; a
single run gets its number and no claim. A question the data cannot answer gets "Not measured in this
study: <why>" instead of silence.

These modules only phrase: every number they state, and every verdict, is a column of a table
(settings: a setting's speedup, its `verdict`, `noise_max_cv` and `effect`; comparisons: settings
against settings; summary: the counts of verdicts, the noise of one device and the machine's
floor, the busy host; data_wait, memory, util_means, scaling_settings). They pick rows, order
them and count the lines they list.
"""

from dpstudy.report.findings.accuracy import accuracy
from dpstudy.report.findings.backends import backends
from dpstudy.report.findings.benchmarks import comm, kernels
from dpstudy.report.findings.forecasts import forecasts
from dpstudy.report.findings.memory import memory
from dpstudy.report.findings.noise import noise
from dpstudy.report.findings.speedup import speedup
from dpstudy.report.findings.strategies import strategies
from dpstudy.report.findings.traces import traces
from dpstudy.report.findings.usage import data_wait, utilisation
from dpstudy.report.findings.why_not_n import why_not_n

__all__ = [
    "accuracy",
    "backends",
    "comm",
    "data_wait",
    "forecasts",
    "kernels",
    "memory",
    "noise",
    "speedup",
    "strategies",
    "traces",
    "utilisation",
    "why_not_n",
]
