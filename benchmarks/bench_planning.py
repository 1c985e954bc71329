"""Planning overhead: `snakemake -n` of waypost's reference workflow vs the
same pipeline in plain Snakemake (benchmarks/plain/Snakefile).

Per size (pairs × 2 experiments, 5 teachers: 20 jobs per experiment × pair):

  (a) empty root: every job to do — the whole DAG is built and printed;
  (b) done root: every output of every stage present (one timestamp, so plain
      Snakemake's mtime rule has nothing to redo either), plus a
      ``_manifest.json`` per stage directory (for the status benchmark, which
      reuses the largest tree; Snakemake never looks at them).

Both workflows run with the same profile (profiles/local), the same config
file, in the same directory, alternately. Before timing, the dry runs are
checked to plan the same jobs (by rule) — the comparison is of equals.

Run alone: ``.venv/bin/python benchmarks/bench_planning.py [PAIRS ...]``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    LOCAL_PROFILE,
    PLAIN_SNAKEFILE,
    PYTHON,
    SNAKEFILE,
    Row,
    Section,
    build_done_tree,
    check,
    expected_jobs,
    interleaved,
    job_counts,
    log,
    median,
    own_time_table,
    paired_ratio,
    profile_table,
    reference_config,
    show,
    timed,
    write_config,
)

TARGET = 1.10
# (pairs per experiment, repetitions). 2 experiments each: 2,003 and 8,003 jobs.
SIZES = [(50, 7), (200, 5)]


def dry_run_cmd(snakefile: Path, workdir: Path) -> list[str]:
    return [PYTHON, "-m", "snakemake", "-s", str(snakefile), "-d", str(workdir),
            "--profile", str(LOCAL_PROFILE), "--configfile", str(workdir / "config.yaml"), "-n"]


def plan_alike(commands: dict[str, list[str]], workdir: Path, what: str,
               resources: bool = False) -> dict[str, dict[str, int]]:
    """One checked dry run of each (also the warm-up): their jobs by rule
    (not ``all``); RuntimeError when they differ (``resources``: or when the
    resources their jobs ask for differ, by rule)."""
    planned, asked = {}, {}
    for name, cmd in commands.items():
        result = check(timed(cmd, cwd=workdir), f"{name} dry run ({what})")
        planned[name] = {rule: n for rule, n in job_counts(result.output).items() if rule != "all"}
        asked[name] = resources_by_rule(result.output)
    if len({json.dumps(p, sort_keys=True) for p in planned.values()}) > 1:
        raise RuntimeError(f"the workflows plan different jobs ({what}): {planned}")
    if resources and len({json.dumps(a, sort_keys=True) for a in asked.values()}) > 1:
        raise RuntimeError(f"the workflows' jobs ask for different resources ({what}): {asked}")
    return planned


def resources_by_rule(output: str) -> dict[str, list[list[str]]]:
    """The different ``resources:`` a dry run prints for each rule's jobs
    (each sorted: the order a rule names them in does not count)."""
    found: dict[str, set] = {}
    rule = None
    for line in output.splitlines():
        if line.startswith(("rule ", "localrule ")) and line.endswith(":"):
            rule = line.split()[1][:-1]
        elif rule and line.strip().startswith("resources:"):
            found.setdefault(rule, set()).add(tuple(sorted(line.split(":", 1)[1].replace(" ", "").split(","))))
    return {name: sorted(map(list, sets)) for name, sets in found.items()}


def alternate(commands: dict[str, list[str]], workdir: Path, repetitions: int) -> dict[str, list[float]]:
    """The dry runs timed back to back, the order flipped every round."""
    def runner(cmd, what):
        return lambda: check(timed(cmd, cwd=workdir, keep_output=False), what).seconds
    return interleaved({name: runner(cmd, f"{name} dry run") for name, cmd in commands.items()},
                       repetitions, warmup=0)


def compare(workdir: Path, label: str, jobs: int, repetitions: int, state: str) -> tuple[Row, dict]:
    """Time waypost's and plain's dry runs alternately; check they plan alike."""
    commands = {"waypost": dry_run_cmd(SNAKEFILE, workdir), "plain": dry_run_cmd(PLAIN_SNAKEFILE, workdir)}

    # One checked run each first (also the warm-up): same jobs by rule.
    # (On the done root waypost's `rule all` has no inputs left, and a rule
    # with neither inputs nor outputs is always "run": a no-op `all` job.
    # Plain Snakemake says "Nothing to be done". Only the real work counts.)
    planned = plan_alike(commands, workdir, f"{label}, {state}")
    want = jobs - 1 if state == "empty" else 0
    if sum(planned["waypost"].values()) != want:
        raise RuntimeError(f"expected {want} jobs ({label}, {state}), planned {planned['waypost']}")

    samples = alternate(commands, workdir, repetitions)
    wp, plain = median(samples["waypost"]), median(samples["plain"])
    ratio = paired_ratio(samples, "waypost", "plain")
    what = "everything to do" if state == "empty" else "everything done"
    row = Row(measure=f"planning `snakemake -n`, {label}, {what}", value=wp, unit="s",
              baseline=plain, baseline_label="plain Snakemake", target=f"ratio ≤ {TARGET:.2f}",
              met=ratio <= TARGET, samples=samples, paired_ratio=ratio,
              note=f"each planned the same {sum(planned['waypost'].values()):,} jobs (+ `all`)"
              if state == "empty" else "no work planned by either (waypost: only its no-op `all`)")
    log(f"planning {label} {state}: waypost {wp:.2f}s plain {plain:.2f}s ratio {ratio:.2f} "
        f"(of the medians {wp / plain:.2f})")
    return row, planned


def profile_waypost(workdir: Path, tmp: Path) -> str:
    """Where waypost's dry run spends its time: one run under cProfile."""
    prof = tmp / "planning.prof"
    cmd = dry_run_cmd(SNAKEFILE, workdir)
    cmd[1:1] = ["-m", "cProfile", "-o", str(prof)]
    check(timed(cmd, cwd=workdir, keep_output=False), "profiled dry run")
    total, ours, table = profile_table(prof, top=15)
    return (f"Under cProfile the run took {total:.1f} s, of which {ours:.1f} s ({100 * ours / total:.0f}%) "
            "inside waypost's code (its helpers and the rules' functions, counted at their entry points; "
            "nested rows overlap):\n\n" + table
            + "\n\nThe same run by the functions with the most time of their own (anyone's code): what the "
              "process is busy with, inside Snakemake included (e.g. how it evaluates each job's callables):\n\n"
            + own_time_table(prof, top=12))


def run(ctx: dict, sizes=SIZES) -> Section:
    section = Section("Planning overhead (`snakemake -n`)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-planning-", dir=ctx.get("tmp")))
    missed = False
    for index, (pairs, repetitions) in enumerate(sizes):
        config = reference_config(pairs)
        jobs = expected_jobs(config)
        label = f"{pairs} pairs × 2 experiments ({jobs:,} jobs)"
        workdir = tmp / f"pairs-{pairs}"
        write_config(workdir, config)

        row, _ = compare(workdir, label, jobs, repetitions, "empty")
        section.rows.append(row)
        missed = missed or not row.met
        # A missed target: profile the largest size's everything-to-do run.
        if index == len(sizes) - 1 and (missed or os.environ.get("BENCH_PROFILE") == "1"):
            log(f"profiling waypost's dry run at {pairs} pairs")
            profile = profile_waypost(workdir, tmp)
        else:
            profile = None

        log(f"building the done tree of {label}")
        stage_dirs = build_done_tree(workdir, config)
        row, _ = compare(workdir, label, jobs, repetitions, "done")
        section.rows.append(row)
        # The status benchmark reuses the largest done tree.
        ctx["done_tree"] = {"workdir": workdir, "config": config, "stage_dirs": stage_dirs, "jobs": jobs}

    section.notes.append(
        "Both workflows: same rules, wildcards, stage paths, inputs and outputs, same config file and profile "
        "(`profiles/local`), same directory, same step commands; the plain one (`benchmarks/plain/Snakefile`) "
        "has literal paths, static params and resources, `rule all` over every output and runs each step "
        "program directly, without the step runner in front. The two run back to back in each round (the "
        "order flipped every round); the ratio is the median of the rounds' ratios, so a drift of this "
        "machine's speed between rounds moves neither side alone (the medians of each side are in the table "
        "too). Each dry run "
        "was first checked to plan exactly the same jobs by rule as the other. On the done root, waypost's "
        "`rule all` asks only for missing outputs (presence mode), so its DAG is empty, while plain Snakemake "
        "builds the whole DAG to compare timestamps.")
    if profile:
        section.notes.append(f"**Where the time goes** (waypost, {sizes[-1][0]} pairs, everything to do). "
                             + profile)
    ctx.setdefault("cleanup", []).append(tmp)
    return section


if __name__ == "__main__":
    ctx: dict = {}
    show(run(ctx, [(int(p), 3) for p in sys.argv[1:]] or SIZES), ctx)
