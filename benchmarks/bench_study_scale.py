"""A parameter study at 100,000 points (issue 57 item 5): planning, `waypost
plan`, `waypost status` and `waypost find` at that size, each against plain
Snakemake's planning of the same DAG.

The study is examples/param-study's workflow on a square-ish grid of
BENCH_SCALE_POINTS (default 100,000) points, built as the status benchmark
builds its 4,000 (``bench_study_status.build_study``: every stage directory
with a manifest and, when done, its outputs; mixed ends), so about 200,000
stage directories. Measured, each in its own process, once (at this size
a dry run takes minutes; the cheap ones, status and find, run
BENCH_SCALE_REPETITIONS times, default 3, interleaved):

1. plain Snakemake's ``snakemake -n`` of the same DAG, nothing done
   (``benchmarks/plain/study.Snakefile``): the baseline of every row;
2. waypost's ``snakemake -n`` of the study, nothing done;
3. ``waypost plan`` over the built study, the whole command (its dry run
   included);
4. ``waypost status`` and ``waypost status --failed`` over the built study;
5. ``waypost find``: the catalog's cold build with one query (a fresh
   cache), then the same query with ``--no-refresh``.

Each with its CPU time and peak RSS (of its process tree, from ``wait4``).
Then the two slowest waypost commands run once more under cProfile:
waypost's dry run with nothing done, and `waypost plan` (its dry run, started
as plan starts it, where its time is): where the time goes.

Run alone: ``.venv/bin/python benchmarks/bench_study_scale.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_planning import dry_run_cmd
from bench_study_status import GIVEN_UP_EVERY, WORKFLOW, build_study, status_cmd, study_config
from common import (
    BENCH,
    BIN,
    PYTHON,
    Row,
    Section,
    Timed,
    check,
    interleaved,
    job_counts,
    log,
    median,
    own_time_table,
    profile_table,
    show,
    timed,
    write_config,
)

POINTS = int(os.environ.get("BENCH_SCALE_POINTS", "100000"))
REPETITIONS = int(os.environ.get("BENCH_SCALE_REPETITIONS", "3"))
PLAIN = BENCH / "plain" / "study.Snakefile"
TIMEOUT_S = 3600


def grid_sides(points: int) -> tuple[int, int]:
    """alphas × cells as near a square as gives about ``points``."""
    alphas = round(points ** 0.5)
    return alphas, round(points / alphas)


def measured(cmd: list[str], cwd: Path, what: str, env: dict | None = None) -> Timed:
    """Run ``cmd`` to completion (``common.timed``): its wall time, CPU and
    peak RSS; RuntimeError when it fails."""
    run = check(timed(cmd, cwd=cwd, env=env, timeout=TIMEOUT_S), what)
    log(f"{what}: {run.seconds:.1f}s ({run.cpu_s:.1f} CPU-s), {run.rss_mib:.0f} MiB")
    return run


def find_cmd(workdir: Path, db: Path, *extra: str) -> list[str]:
    return [str(BIN / "waypost"), "find", "--config", str(workdir / "config.yaml"), "--workflow", str(WORKFLOW),
            "--db", str(db), *extra]


def planning(fresh: Path) -> tuple[Timed, Timed, int]:
    """Plain's and waypost's dry runs of the study with nothing done (plain
    first: the baseline); checked to plan the same jobs by rule."""
    runs = {name: measured(dry_run_cmd(snakefile, fresh), fresh, f"{name} snakemake -n")
            for name, snakefile in (("plain", PLAIN), ("waypost", WORKFLOW / "Snakefile"))}
    planned = {name: {rule: n for rule, n in job_counts(m.output).items() if rule != "all"}
               for name, m in runs.items()}
    if planned["plain"] != planned["waypost"]:
        raise RuntimeError(f"the workflows plan different jobs: {planned}")
    return runs["plain"], runs["waypost"], sum(planned["waypost"].values())


# `waypost plan` as a user runs it, in one interpreter, its dry run (the
# Snakemake process it starts) under cProfile; prints the wall time of the
# whole and of the dry run as JSON. argv: the profile's output file, then
# plan's arguments.
PLAN_PROFILED = r"""
import json, subprocess, sys, time
from waypost.cli import main
from waypost.ops import plan
prof, argv, spent = sys.argv[1], sys.argv[2:], []
run = subprocess.run
def profiled(cmd, **kw):
    t = time.perf_counter()
    try:
        return run([cmd[0], "-m", "cProfile", "-o", prof, *cmd[1:]], **kw)
    finally:
        spent.append(time.perf_counter() - t)
plan.subprocess.run = profiled
t = time.perf_counter()
code = main.main(argv)
print(json.dumps({"code": code, "whole": time.perf_counter() - t, "dry_run": sum(spent)}), file=sys.stderr)
"""


def profile_summary(prof: Path, what: str) -> str:
    # (profile_table's sum over entry points counts a waypost function
    # reached through a cached_property inside another one twice: not shown.)
    total, _, ours = profile_table(prof, top=12)
    return (f"In {what} ({total:.0f} s profiled), waypost's functions by cumulative time (a wrapper's includes "
            f"the Snakemake work it wraps):\n\n"
            f"{ours}\n\nEveryone's functions by own time (what the process is busy with):\n\n"
            f"{own_time_table(prof, top=12)}")


def profiled(cmd: list[str], cwd: Path, prof: Path) -> str:
    """``cmd`` (``python -m ...``) once under cProfile: where its time goes."""
    assert cmd[0] == PYTHON and cmd[1] == "-m", cmd
    run = measured([PYTHON, "-m", "cProfile", "-o", str(prof), *cmd[1:]], cwd, "under cProfile")
    return f"It took {run.seconds:.0f} s under the profiler. " + profile_summary(prof, "it")


def profiled_plan(plan_args: list[str], cwd: Path, prof: Path) -> str:
    """`waypost plan` once with its dry run under cProfile: what its dry
    run and its own part take, and where the dry run's time goes."""
    run = measured([PYTHON, "-c", PLAN_PROFILED, str(prof), *plan_args], cwd, "waypost plan, dry run profiled")
    spent = json.loads(run.output.strip().splitlines()[-1])
    return (f"Its dry run took {spent['dry_run']:.1f} s under the profiler; what plan does besides (config, "
            f"reading the dry run's events, the drift over the manifests, the tables), "
            f"{spent['whole'] - spent['dry_run']:.1f} s (not profiled). " + profile_summary(prof, "the dry run"))


def run(ctx: dict) -> Section:
    section = Section("A parameter study at 100,000 points")
    tmp = Path(tempfile.mkdtemp(prefix="bench-study-scale-", dir=ctx.get("tmp")))
    ctx.setdefault("cleanup", []).append(tmp)
    alphas, cells = grid_sides(POINTS)
    points = alphas * cells
    config = study_config("results", alphas, cells)

    fresh = tmp / "fresh"
    write_config(fresh, config)
    log(f"study at scale: {points:,} points ({alphas} × {cells}); dry runs with nothing done")
    plain, planned, jobs = planning(fresh)

    built = tmp / "built"
    built.mkdir()
    started = time.perf_counter()
    ends = build_study(built, config)
    dirs = 2 * points + 1
    log(f"built {dirs:,} stage directories in {time.perf_counter() - started:.0f}s: {ends}")
    built_s = time.perf_counter() - started

    plan_cmd = [str(BIN / "waypost"), "plan", "--config", str(built / "config.yaml"), "--workflow", str(WORKFLOW)]
    plan = measured(plan_cmd, built, "waypost plan")
    once = {"waypost plan (the whole command)": plan}

    db = tmp / "catalog.sqlite"
    query = ("--stage", "simulate", "--state", "FAILED", "--json")
    cold = measured(find_cmd(built, db, *query), built, "waypost find, cold")
    found = len(json.loads(cold.output[cold.output.index("["):]))
    once["waypost find, cold (a new catalog, one query)"] = cold

    cheap = {"waypost status": status_cmd(built), "waypost status --failed": status_cmd(built, "--failed"),
             "waypost find --no-refresh (the same query)": find_cmd(built, db, "--no-refresh", *query)}
    last: dict[str, Timed] = {}

    def variant(name):
        def once_more() -> float:
            last[name] = measured(cheap[name], built, name)
            return last[name].seconds
        return once_more
    samples = interleaved({name: variant(name) for name in cheap}, REPETITIONS, warmup=0)
    failed_lines = last["waypost status --failed"].output.count("\n")
    find_dirs = subprocess.run(["bash", "-c", "find results -name _manifest.json | wc -l"], cwd=built,
                               capture_output=True, text=True, check=True).stdout.strip()
    if int(find_dirs) != dirs:
        raise RuntimeError(f"built {find_dirs} manifests, want {dirs}")

    base = plain.seconds

    def row(measure: str, m: Timed, seconds: float, note: str, sampled: dict | None = None) -> Row:
        return Row(measure=f"{measure}, {points:,}-point study", value=seconds, unit="s", baseline=base,
                   baseline_label="plain Snakemake's `snakemake -n` of the same DAG",
                   target="(informational)", samples=sampled or {},
                   note=f"{m.cpu_s:.1f} CPU-s; peak RSS {m.rss_mib:,.0f} MiB"
                   + (f"; {note}" if note else ""))

    section.rows.append(row("plain Snakemake `snakemake -n`, nothing done", plain, plain.seconds,
                            f"{jobs:,} jobs (+ `all`)"))
    section.rows.append(row("waypost `snakemake -n`, nothing done", planned, planned.seconds,
                            "the same jobs by rule"))
    section.rows.append(row(f"`waypost plan` over the built study ({dirs:,} stage directories)", plan,
                            plan.seconds, f"its dry run included; `{plan.output.splitlines()[0].strip()}`"))
    for name in ("waypost status", "waypost status --failed"):
        section.rows.append(row(f"`{name}` over {dirs:,} stage directories", last[name],
                                median(samples[name]), f"{last[name].output.count(chr(10)):,} lines",
                                {name: samples[name]}))
    section.rows.append(row(f"`waypost find`, cold catalog build + one query ({dirs:,} manifests)", cold,
                            cold.seconds, f"{found:,} rows (`--stage simulate --state FAILED`)"))
    name = "waypost find --no-refresh (the same query)"
    section.rows.append(row("`waypost find --no-refresh`, the same query after", last[name], median(samples[name]),
                            "", {name: samples[name]}))

    section.notes.append(
        f"The study: examples/param-study's workflow on a {alphas} × {cells} grid ({points:,} points), built by "
        f"the status benchmark's builder ({dirs:,} stage directories, each with a manifest and, when done, its "
        f"outputs; written in {built_s:.0f} s): of the simulations {ends['SUCCESS']:,} done, "
        f"{ends['TIMEOUT']:,} timed out, {ends['FAILED']:,} failed and {ends['given up']:,} given up (one in "
        f"{GIVEN_UP_EVERY}; their extracts skipped); `status --failed` printed {failed_lines:,} lines. The two "
        f"dry runs (nothing done, in a directory of their own) planned the same {jobs:,} jobs by rule; plain "
        f"Snakemake's is `benchmarks/plain/study.Snakefile` on the same config. Each command ran in its own "
        f"process, the dry runs, `plan` and the cold `find` once, status and the warm `find` "
        f"{'once' if REPETITIONS == 1 else f'{REPETITIONS} times interleaved (medians)'}; the "
        "ratio is each row's seconds over plain's dry run. Peak RSS: the largest process of the command's tree "
        f"(`wait4`).")

    # Where the time goes: the slowest waypost command, its dry run of the
    # study with nothing done, and `waypost plan`, nearly all dry run too
    # (its dry run profiled as plan starts it).
    log("profiling waypost's snakemake -n, nothing done")
    section.notes.append("**Where the time goes: waypost's `snakemake -n`, nothing done**, once more under "
                         "cProfile. " + profiled(dry_run_cmd(WORKFLOW / "Snakefile", fresh), fresh,
                                                  tmp / "planning.prof"))
    log("profiling waypost plan's dry run")
    section.notes.append("**Where the time goes: `waypost plan`**, once more with its dry run under cProfile. "
                         + profiled_plan(plan_cmd[1:], built, tmp / "plan.prof"))
    return section


if __name__ == "__main__":
    ctx: dict = {}
    show(run(ctx), ctx)
