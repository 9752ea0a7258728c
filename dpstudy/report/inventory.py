"""The report's bookkeeping: where the study ran, which cells did not finish or are stale, and
the compact listing of every cell. Markdown from the tables of dpstudy.analysis.collect: every string from
a record (hostnames, paths, commits, job ids, nodes, cell ids, reasons) goes through
dpstudy.report.text.text() or code(), so it shows as text."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpstudy.report.text import code, code_block, markdown_table, not_run_lines, plural, seconds, significant, text

RERUN = "snakemake --cores 1 --resources gpu=2 --forcerun $(cat {stale})"


def values(column: pd.Series, empty: str = "unknown", sep: str = ", ") -> str:
    """The distinct values, sorted, as markdown text; whole floats (a CSV column with gaps) shown as integers."""
    distinct = {int(v) if isinstance(v, float) and v.is_integer() else v for v in column.dropna()}
    return sep.join(text(v) for v in sorted(distinct, key=str)) or empty


def gpu_summary(gpu_names: pd.Series) -> str:
    """'2 x NVIDIA H100' from the longest list of visible GPUs ('; '-joined in cells.csv)."""
    lists = [names.split("; ") for names in gpu_names.dropna()]
    if not lists:
        return "none"
    counts = pd.Series(max(lists, key=len)).value_counts(sort=False)
    return ", ".join(f"{n} x {text(name)}" for name, n in counts.items())


def environment(cells: pd.DataFrame, study: str) -> str:
    counts = ", ".join(f"{n} {text(status)}" for status, n in cells["status"].value_counts().items())
    return "\n".join(
        [
            f"- **Study** {code(study)}: {plural(len(cells), 'cell')} ({counts})",
            f"- **PyTorch** {values(cells['torch'])}{torch_origin(cells)}, CUDA {values(cells['cuda'], 'none')}, "
            f"Python {values(cells['python'])}",
            f"- **Host** {values(cells['hostname'])}; CPU: {values(cells['cpu'])}; "
            f"GPUs: {gpu_summary(cells['gpu_names'])}",
            f"- **Ran on** {values(cells['env_device'])}; world sizes {values(cells['world_size'])}; "
            f"threads per process {values(cells['threads_per_process'])}",
            f"- **Allocator** {allocators(cells)}",
            f"- **Training code** git {values(cells['git_commit'])}, source hash {values(cells['source_hash'])}",
            f"- **Jobs** {jobs(cells)}",
        ]
    )


def allocators(cells: pd.DataFrame) -> str:
    """The memory allocator the cells' ranks ran with, or, when they differ, each with its cells:
    throughput under one allocator does not compare with throughput under another."""
    if "allocator" not in cells or cells["allocator"].dropna().empty:
        return "not recorded"
    ran = cells.dropna(subset=["allocator"])
    if ran["allocator"].nunique() == 1:
        return f"{text(ran['allocator'].iloc[0])} in every cell that ran"
    counts = ", ".join(f"{text(a)}: {plural(n, 'cell')}" for a, n in ran["allocator"].value_counts().items())
    return f"**mixed**, so their throughputs do not compare: {counts}"


def torch_origin(cells: pd.DataFrame) -> str:
    """' (the host's, from /opt/torch/...)' when the host provided PyTorch (make setup TORCH=system),
    ' (dpstudy's venv)' when the project's venv installed it; empty for records without the fact."""
    if "torch_provider" not in cells:
        return ""
    host = cells[cells["torch_provider"] == "host"]
    venv = cells[cells["torch_provider"] == "venv"]
    parts = []
    if not host.empty:
        share = "" if venv.empty else f" for {plural(len(host), 'cell')}"
        parts.append(f"the host's{share}, from {values(host['torch_path'])}")
    if not venv.empty:
        parts.append("dpstudy's venv" + ("" if host.empty else f" for {plural(len(venv), 'cell')}"))
    return f" ({'; '.join(parts)})" if parts else ""


def jobs(cells: pd.DataFrame) -> str:
    """How the cells' jobs ran: locally, or as scheduler jobs (in packs or each its own) on which
    nodes; then how the packing's estimates compared with what the cells took."""
    if "scheduler" not in cells or cells["scheduler"].dropna().empty:
        return "unknown (records without job facts)"
    parts = []
    for scheduler, group in cells.groupby(cells["scheduler"].fillna("unknown")):
        if scheduler == "slurm":
            nodes = values(group["rank_nodes"].dropna().astype(str).str.split("; ").explode(), "unknown")
            ids = group["job_id"].astype("string")
            count, packs = slurm_jobs(group)
            about = "; ".join(filter(None, [packs, f"{'id' if ids.nunique() == 1 else 'ids'} {values(ids)}"]))
            parts.append(f"{count} ({about}) on nodes {nodes}")
        else:
            parts.append(f"{plural(len(group), 'cell')} {text(scheduler)}")
    return "; ".join(parts + estimates(cells))


def job_count(cells: pd.DataFrame) -> int:
    """The SLURM jobs the cells ran in: their distinct job ids, and a job for each cell without one."""
    return cells["job_id"].nunique() + cells["job_id"].isna().sum()


def slurm_jobs(cells: pd.DataFrame) -> tuple[str, str | None]:
    """How many SLURM jobs ran the cells and, where some shared one (a pack), how many per job:
    ('60 cells as 6 SLURM jobs, 10 cells per job', 'packs of 8-12 cells'); with cells that ran as
    jobs of their own ('63 cells as 9 SLURM jobs: 60 cells in 6 jobs, 10 cells per job (packs of
    8-12 cells), and 3 cells as jobs of their own', None); ('3 cells as 3 SLURM jobs', None) without packs."""
    packed = cells["pack"].notna() if "pack" in cells else pd.Series(False, index=cells.index)
    if not packed.any():
        return f"{plural(len(cells), 'cell')} as {plural(job_count(cells), 'SLURM job')}", None
    inside, own = cells[packed], cells[~packed]
    sizes = inside.groupby(inside["job_id"].fillna(inside["pack"])).size()  # a pack's cells share its job id
    per = f"{round(len(inside) / len(sizes), 1):g}"  # 3, 3.5
    span = str(sizes.min()) if sizes.min() == sizes.max() else f"{sizes.min()}-{sizes.max()}"
    per_job = f"{per} {'cell' if per == '1' else 'cells'} per job"
    packs = f"packs of {span} {'cell' if span == '1' else 'cells'}"
    if own.empty:
        return f"{plural(len(inside), 'cell')} as {plural(len(sizes), 'SLURM job')}, {per_job}", packs
    whole = f"{plural(len(cells), 'cell')} as {plural(len(sizes) + job_count(own), 'SLURM job')}"
    alone = f"{plural(len(own), 'cell')} as {'a job of its own' if len(own) == 1 else 'jobs of their own'}"
    return (
        f"{whole}: {plural(len(inside), 'cell')} in {plural(len(sizes), 'job')}, {per_job} ({packs}), and {alone}",
        None,
    )


def estimates(cells: pd.DataFrame) -> list[str]:
    """How far the packing's estimates were off, measured (summary total_s) over estimated
    (env.job.estimated_s, what the packs were sized by) for the finished cells with both: 'the cells
    took 0.41x their estimated time (median; 0.3-0.62x over 60 finished cells)'; none without."""
    if "estimated_s" not in cells:
        return []
    done = cells[(cells["status"] == "ok") & (cells["estimated_s"] > 0) & cells["total_s"].notna()]
    if done.empty:
        return []
    ratio = done["total_s"] / done["estimated_s"]
    return [
        f"the cells took {significant(ratio.median(), 2)}x their estimated time (median; "
        f"{significant(ratio.min(), 2)}-{significant(ratio.max(), 2)}x over {plural(len(done), 'finished cell')})"
    ]


def not_run(cells: pd.DataFrame) -> str:
    """The cells that did not finish, one line per status and reason."""
    rest = cells[cells["status"] != "ok"]
    if rest.empty:
        return "Every cell finished."
    return "\n".join(f"- {line}" for line in not_run_lines(rest, "cell", lambda r: code(r.cell)))


def not_learned(cells: pd.DataFrame) -> str:
    """The finished cells that did not learn (dpstudy.record.learning), each with why: their
    throughput stands, but they are no candidate for the fastest strategy nor party to accuracy."""
    flat = cells[(cells["status"] == "ok") & (cells["learned"].astype("boolean") == False)]  # noqa: E712
    if flat.empty:
        return "Every finished cell learned: no loss went non-finite or rose, no accuracy stayed at chance."
    lines = [
        f"- {code(r.cell)}: {text(r.learned_reason)}"
        + ("" if pd.isna(r.stopped_early) else " (stopped there: stop_on_divergence)")
        for r in flat.itertuples()
    ]
    return (
        f"**{len(flat)} finished {'cell' if len(flat) == 1 else 'cells'} did not learn.** Their throughput is "
        "measured as any other's, but the accuracy comparisons leave them out and no strategy that "
        "did not learn is called the fastest.\n\n" + "\n".join(lines)
    )


def stale(cells: pd.DataFrame, stale_file: str) -> str:
    old = cells[cells["stale"].astype(bool)]
    if old.empty:
        return "Every cell was made with the current training code."
    shown = 10  # the rest are in the stale file the rerun command reads
    names = ", ".join(code(c) for c in old["cell"].head(shown)) + (
        f" and {len(old) - shown} more" if len(old) > shown else ""
    )
    count = "1 cell was" if len(old) == 1 else f"{len(old)} cells were"
    return f"**{count} made with older training code (stale):** {names}. Rerun with\n\n" + code_block(
        RERUN.format(stale=stale_file)
    )


def unreadable(unreadable_file: str) -> str:
    """The records collect left out under `snakemake --keep-going` (unreadable.txt), each with
    what was wrong and the command that reruns it; empty when there were none."""
    path = Path(unreadable_file)
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not lines:
        return ""
    return (
        f"**{plural(len(lines), 'record')} could not be read** and {'is' if len(lines) == 1 else 'are'} "
        "left out of every table and figure (collected with `--keep-going`):\n\n"
        + "\n".join(f"- {text(line)}" for line in lines)
    )


LISTING = {
    "samples_per_s": ("samples/s", significant),
    "speedup": ("speedup", lambda v: f"{v:.2f}x"),
    "efficiency": ("efficiency", lambda v: f"{v * 100:.0f} %"),
    "final_test_acc": ("test acc", lambda v: f"{v * 100:.1f} %"),
    "median_epoch_s": ("epoch", seconds),
    "total_s": ("job", seconds),
}


LISTING_LIMIT = 40  # rows; a larger study's cells are in cells.csv, its settings summarised above


def cell_listing(cells: pd.DataFrame, limit: int = LISTING_LIMIT) -> str:
    """Every finished cell with its numbers rounded for reading (the first `limit`, and where the
    rest are); the others are listed above."""
    ok = cells[cells["status"] == "ok"]
    if ok.empty:
        return "No cell finished."
    more = len(ok) - limit
    ok = ok.head(limit)
    # object dtype: a str column may store the Safe values of code() as plain str, escaped again
    table = pd.DataFrame({"cell": pd.Series([code(c) for c in ok["cell"]], index=ok.index, dtype=object)})
    for column, (title, form) in LISTING.items():
        table[title] = ok[column].map(lambda v, form=form: "" if pd.isna(v) else form(v))
    table["stale"] = ok["stale"].map({True: "yes", False: ""})
    rest = (
        f"\n\n... and {plural(more, 'more finished cell')}: `results/tables/cells.csv` has every cell."
        if more > 0
        else ""
    )
    return markdown_table(table) + rest


def configuration(path: str | Path) -> str:
    """The report's last section: the study's config file (`path`, which exists) shown as it is."""
    return f"## Configuration\n\n{code(path)}:\n\n" + code_block(Path(path).read_text(encoding="utf-8"), "yaml")
