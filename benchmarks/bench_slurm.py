"""Slurm: thousands of short stages on the local Slurm cluster
(``scripts/slurm-dev-cluster.sh``), from Snakemake's start to its exit.

0. **As a user gets it**: BENCH_SLURM_BIG (default 2,000) trivial stages with
   ``--profile profiles/onprem`` and no other flag (no ``--jobs``,
   ``--latency-wait`` or status-check tuning), the ``cpu`` class with the keys
   docs/workers.md advises for short stages (``runtime: 2, bundle: 25``),
   against plain Snakemake's local executor on the same jobs
   (``--cores`` the machine's cores), side by side in the same run, with the
   machine's speed probe just before.
1. **Trivial stages, tuned flags**, BENCH_SLURM_JOBS (default 300): waypost
   (``benchmarks/slurm/waypost/Snakefile``, one stage per pair, one Slurm job
   each, ``--profile profiles/onprem``) against plain Snakemake
   (``benchmarks/slurm/plain/Snakefile``: the same paths and jobs, ``touch``,
   ``--profile benchmarks/slurm/plain-profile``, Snakemake's Slurm plugin),
   both with ``--<plugin>-init-seconds-before-status-checks 2 --latency-wait 5
   --<plugin>-no-account``; then waypost with the class packed (``pack: 50``).
   Each job's CPU time on the node is sacct's ``TotalCPU``.
2. **At scale**: waypost alone, BENCH_SLURM_BIG (default 2,000) stages, packed.
3. **Dependent hops**: the reference pipeline (one pair, one teacher: 12 jobs
   in a chain of 10) on the onprem profile, against the same with
   Snakemake's Slurm plugin (a Snakemake in every job, the status checks
   starting at 10 s: how the onprem profile ran before), and locally. The
   hops come from sacct: a job's start after the end of the job before it.
4. **A parameter study**: ``examples/param-study`` on a grid of
   BENCH_SLURM_POINTS (default 1,000) points, packed, with a few expensive
   points that run out of their 1-minute Slurm limit and restart from their
   checkpoints, and the funnel over all of them.
5. **A big study**: the same example at BENCH_SLURM_STUDY_POINTS (default
   10,000) points of small meshes, bundled (``bundle: 25``), on
   ``profiles/onprem`` as shipped (no other flag), the speed probe just before.

6. **Several nodes** (``run_several_nodes``, its own section: ``--only
   slurm_nodes``): BENCH_SLURM_BIG trivial stages bundled, then packed, on
   the cluster's three compute nodes beside the same on the one node.

Skipped with BENCH_SLURM=0, or when ``sinfo`` shows no idle node (start one
as root: ``scripts/slurm-dev-cluster.sh start``). Run alone:
``.venv/bin/python benchmarks/bench_slurm.py``, or ``benchmarks/run.py --only
slurm`` to update the report's Slurm rows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_local_profile import check_outputs, plain_local_cmd, trivial_workdir
from common import (
    BENCH,
    ONPREM_PROFILE,
    PYTHON,
    REPO,
    Row,
    Section,
    check,
    interleaved,
    log,
    machine_speed_ms,
    median,
    paired_ratio,
    reference_config,
    run_parts,
    show,
    timed,
    write_config,
)

JOBS = int(os.environ.get("BENCH_SLURM_JOBS", "300"))
BIG = int(os.environ.get("BENCH_SLURM_BIG", "2000"))
POINTS = int(os.environ.get("BENCH_SLURM_POINTS", "1000"))
STUDY_POINTS = int(os.environ.get("BENCH_SLURM_STUDY_POINTS", "10000"))
PACK = 50
BUNDLE = 25
STAGES_PER_S_TARGET = 30
SPEEDUP_TARGET = 5.0
CPU_TARGET_S = 0.3
TIMEOUT_S = 1800
WAYPOST_SNAKEFILE = BENCH / "slurm" / "waypost" / "Snakefile"
PLAIN_SNAKEFILE = BENCH / "slurm" / "plain" / "Snakefile"
PLAIN_PROFILE = BENCH / "slurm" / "plain-profile"
PARAM_STUDY = REPO / "examples" / "param-study"
FAST = ["--latency-wait", "5"]
# How the rows measured with the flags above (not the shipped profile's) say so.
TUNED = "tuned flags: `--latency-wait 5`, `--<plugin>-no-account`, status checks from 2 s"


def unavailable() -> str | None:
    """Why the benchmark can't run here, or None."""
    if os.environ.get("BENCH_SLURM", "1") == "0":
        return "skipped: BENCH_SLURM=0"
    if not shutil.which("sinfo") or not shutil.which("sbatch"):
        return "skipped: no Slurm here (no `sinfo`/`sbatch`)"
    try:
        out = subprocess.run(["sinfo", "-h", "-p", "cpu", "-o", "%t"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"skipped: `sinfo` failed ({exc})"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.startswith(("idle", "mix")) for s in states):
        return (f"skipped: no idle node in partition `cpu` (sinfo: {' '.join(states) or out.stderr.strip()!r}); "
                "start the local cluster as root with `scripts/slurm-dev-cluster.sh start`")
    return None


def _seconds(text: str) -> float:
    """sacct's ``[DD-][HH:]MM:SS[.mmm]`` as seconds."""
    days, _, clock = text.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part or 0)
    return seconds + 86400 * int(days or 0)


def jobs_of(workdir: Path, expected: int = 0) -> list[dict]:
    """The Slurm jobs (array tasks one by one) a run in ``workdir`` made, as
    sacct accounts them, once it has them all (accounting lags a moment)."""
    fields = ("JobIDRaw", "JobID", "WorkDir", "State", "Submit", "Start", "End", "TotalCPU", "Comment", "NodeList")
    deadline = time.time() + 90
    while True:
        # Not -X: with it, sacct leaves the steps' CPU out of the job's line.
        out = subprocess.run(["sacct", "-a", "-n", "-P", "-S", "now-3hours", "-o", ",".join(fields)],
                             capture_output=True, text=True, timeout=120).stdout
        rows = [dict(zip(fields, line.split("|"))) for line in out.splitlines()]
        jobs = [r for r in rows if "." not in r["JobIDRaw"] and r.get("WorkDir") == str(workdir)]
        settled = all(r["End"] not in ("Unknown", "") and _seconds_or_none(r["TotalCPU"]) for r in jobs)
        if (len(jobs) >= expected and settled) or time.time() > deadline:
            return jobs
        time.sleep(2)


def _seconds_or_none(text: str) -> float | None:
    try:
        return _seconds(text)
    except ValueError:
        return None


def cpu_per_job(jobs: list[dict]) -> float:
    return sum(_seconds(j["TotalCPU"]) for j in jobs) / max(1, len(jobs))


def workers_file(directory: Path, pack: int, bundle: int = 1, **classes) -> Path:
    """The repo's pools with the onprem classes changed (``pack`` or
    ``bundle`` on each)."""
    pools = yaml.safe_load((REPO / "config" / "workers.yaml").read_text())
    onprem = pools["pools"]["onprem"]["classes"]
    for name, spec in classes.items():
        onprem[name] = {**onprem.get(name, {}), **spec}
    for spec in onprem.values():
        if pack > 1:
            spec["pack"] = pack
        if bundle > 1:
            spec["bundle"] = bundle
    path = directory / "workers.yaml"
    path.write_text(yaml.safe_dump(pools))
    return path


def snakemake(snakefile: Path, workdir: Path, profile: Path, plugin: str, *extra: str) -> list[str]:
    return [PYTHON, "-m", "snakemake", "-s", str(snakefile), "-d", str(workdir), "--profile", str(profile),
            "--configfile", str(workdir / "config.yaml"), f"--{plugin}-init-seconds-before-status-checks", "2",
            f"--{plugin}-no-account", *FAST, *extra]


# --- 1 and 2: trivial stages --------------------------------------------------

def trivial(tmp: Path) -> tuple[list[Row], list[str]]:
    runs = iter(range(10**6))
    cpu: dict[str, list[float]] = {}
    submissions: dict[str, int] = {}

    def run(name: str, stages: int, pack: int = 1, bundle: int = 1):
        def once() -> float:
            d = tmp / f"{name}-{next(runs)}"
            d.mkdir()
            plain = name == "plain"
            cfg = {"root": "results", "experiments": {"slurm": {"pairs": [f"p{i:05d}" for i in range(stages)]}}}
            if not plain:   # a bundle's time limit is its stages' together: 2 minutes each here
                cfg["workers"] = str(workers_file(d, pack, bundle, **({"cpu": {"runtime": 2}} if bundle > 1 else {})))
            (d / "config.yaml").write_text(json.dumps(cfg))
            # bundles count their stages in the jobs in flight: room for 16 of them
            extra = ["--jobs", str(BUNDLE * 16)] if bundle > 1 else []
            cmd = snakemake(PLAIN_SNAKEFILE, d, PLAIN_PROFILE, "slurm") if plain else \
                snakemake(WAYPOST_SNAKEFILE, d, ONPREM_PROFILE, "waypost", *extra)
            seconds = check(timed(cmd, cwd=d, timeout=TIMEOUT_S), f"{name} on Slurm").seconds
            for pair in cfg["experiments"]["slurm"]["pairs"]:
                stage = d / "results" / pair / "slurm" / "noop"
                if not (stage / "done.txt").exists():
                    raise RuntimeError(f"{stage}/done.txt missing after the run")
                if not plain and json.loads((stage / "_manifest.json").read_text())["state"] != "SUCCESS":
                    raise RuntimeError(f"{stage}: manifest not SUCCESS")
            jobs = jobs_of(d, -(-stages // bundle))   # a bundle: at least this many jobs
            cpu.setdefault(name, []).append(cpu_per_job(jobs))
            submissions[name] = len({j["JobID"].split("_")[0] for j in jobs})
            log(f"slurm {name}: {stages} stages in {seconds:.1f}s, {cpu[name][-1]:.3f} CPU-s per job, "
                f"{submissions[name]} submissions")
            shutil.rmtree(d, ignore_errors=True)
            return seconds
        return once

    samples = interleaved({"waypost": run("waypost", JOBS), "plain": run("plain", JOBS)}, 1, warmup=0)
    packed = run("packed", JOBS, PACK)()
    big = run("big", BIG, PACK)()
    bundled = run("bundled", BIG, bundle=BUNDLE)()
    local = plain_local(tmp, BIG)
    wp, base = median(samples["waypost"]), median(samples["plain"])
    rows = [
        Row(measure=f"Slurm: {JOBS} trivial stages, one job each, start to finish ({TUNED})", value=wp, unit="s",
            baseline=base, baseline_label="plain Snakemake, same plugin settings",
            target=f"≥ {SPEEDUP_TARGET:g}× faster (ratio ≤ {1 / SPEEDUP_TARGET:.2f})",
            met=base / wp >= SPEEDUP_TARGET, samples=samples,
            note=f"{base / wp:.1f}× faster; {JOBS / wp:.2f} vs {JOBS / base:.2f} jobs/s; 1 run each"),
        Row(measure=f"Slurm: {JOBS} trivial stages, the class packed (`pack: {PACK}`)", value=packed, unit="s",
            baseline=base, baseline_label="plain Snakemake, one job each", target="(informational)",
            samples={"packed": [packed]},
            note=f"{base / packed:.1f}× faster; {submissions['packed']} sbatch submissions (job arrays) "
                 f"for {JOBS} stages"),
        Row(measure=f"Slurm: {BIG:,} trivial stages, packed (`pack: {PACK}`), waypost alone", value=big, unit="s",
            target="(informational)", samples={"waypost": [big]},
            note=f"{BIG / big:.1f} stages/s; {submissions['big']} submissions; every manifest SUCCESS"),
        Row(measure=f"Slurm: {BIG:,} trivial stages, bundled (`bundle: {BUNDLE}`; {TUNED}, `--jobs {BUNDLE * 16}`)",
            value=bundled,
            unit="s", baseline=local, baseline_label="plain Snakemake's local executor, the same jobs (`touch`)",
            target=f"≥ {STAGES_PER_S_TARGET} stages/s", met=BIG / bundled >= STAGES_PER_S_TARGET,
            samples={"waypost": [bundled], "plain local": [local]},
            note=f"{BIG / bundled:.1f} stages/s ({BIG / big:.1f} packed; plain Snakemake locally "
                 f"{BIG / local:.1f}/s); {submissions['bundled']} Slurm jobs for {BIG:,} stages; every manifest "
                 "SUCCESS"),
        Row(measure="Slurm: CPU time per job on the node (sacct `TotalCPU`)", value=median(cpu["waypost"]),
            unit="s", baseline=median(cpu["plain"]), baseline_label="plain Snakemake (Snakemake in each job)",
            target=f"≤ {CPU_TARGET_S} s", met=median(cpu["waypost"]) <= CPU_TARGET_S,
            samples={f"{k} (CPU-s per job)": v for k, v in cpu.items()},
            note=f"packed: {median(cpu['packed']):.3f} s, {BIG:,} stages: {median(cpu['big']):.3f} s; "
                 "the step runner and its step, no Snakemake in the job"),
    ]
    notes = [
        "Slurm: the local single-node cluster (`scripts/slurm-dev-cluster.sh`: 8 CPUs declared on this "
        "2-core machine), partition `cpu`, 1 CPU and 1000 MB per job (the onprem pool's `cpu` class), "
        "`jobs: 100`. Every output (and for waypost every SUCCESS manifest) was checked after each run."]
    return rows, notes


def plain_local(tmp: Path, stages: int) -> float:
    """Plain Snakemake's local executor on the same trivial jobs, every core."""
    d = trivial_workdir(tmp / "plain-local", stages)
    seconds = check(timed(plain_local_cmd(d), cwd=d, timeout=TIMEOUT_S), "plain Snakemake locally").seconds
    log(f"slurm plain local: {stages} jobs in {seconds:.1f}s")
    shutil.rmtree(d, ignore_errors=True)
    return seconds


# --- 0: the shipped profile ---------------------------------------------------

def shipped(tmp: Path) -> tuple[list[Row], list[str]]:
    """BIG trivial stages on ``profiles/onprem`` as shipped, the class bundled
    as docs/workers.md advises, against plain Snakemake locally, paired."""
    runs = iter(range(10**6))
    slurm_jobs: list[int] = []

    def waypost() -> float:
        d = trivial_workdir(tmp / f"shipped-{next(runs)}", BIG)
        workers = workers_file(d, 1, BUNDLE, cpu={"runtime": 2})
        cfg = json.loads((d / "config.yaml").read_text())
        (d / "config.yaml").write_text(json.dumps({**cfg, "workers": str(workers)}))
        cmd = [PYTHON, "-m", "snakemake", "-s", str(WAYPOST_SNAKEFILE), "-d", str(d), "--profile",
               str(ONPREM_PROFILE), "--configfile", str(d / "config.yaml")]
        seconds = check(timed(cmd, cwd=d, timeout=TIMEOUT_S), "waypost, shipped onprem profile").seconds
        check_outputs(d, manifests=True)
        slurm_jobs.append(len(jobs_of(d, -(-BIG // BUNDLE))))
        log(f"slurm shipped: {BIG} stages in {seconds:.1f}s ({BIG / seconds:.1f}/s), {slurm_jobs[-1]} Slurm jobs")
        shutil.rmtree(d, ignore_errors=True)
        return seconds

    def plain(greedy: bool):
        def once() -> float:
            d = trivial_workdir(tmp / f"shipped-plain-{next(runs)}", BIG)
            seconds = check(timed(plain_local_cmd(d, greedy), cwd=d, timeout=TIMEOUT_S),
                            "plain Snakemake locally").seconds
            check_outputs(d, manifests=False)
            log(f"slurm shipped, plain local{' greedy' if greedy else ''}: {BIG} jobs in {seconds:.1f}s "
                f"({BIG / seconds:.1f}/s)")
            shutil.rmtree(d, ignore_errors=True)
            return seconds
        return once

    speed = machine_speed_ms()
    samples = interleaved({"waypost": waypost, "plain local greedy": plain(True), "plain local": plain(False)}, 1,
                          warmup=0)
    wp = median(samples["waypost"])
    rate = BIG / wp
    rows = [
        Row(measure=f"Slurm, shipped `profiles/onprem`: {BIG:,} trivial stages (`bundle: {BUNDLE}`, `runtime: 2`, "
                    "no other flag), stages/s", value=rate, unit="stages/s", target=f"≥ {STAGES_PER_S_TARGET}/s",
            met=rate >= STAGES_PER_S_TARGET, samples=samples,
            note=f"{wp:.1f} s; {median(slurm_jobs):.0f} Slurm jobs; every manifest SUCCESS; speed probe {speed:.0f} ms"),
    ]
    for name, label in (("plain local greedy", f"plain Snakemake, local executor, `--cores {os.cpu_count()} "
                                               "--scheduler greedy`"),
                        ("plain local", f"plain Snakemake, local executor, `--cores {os.cpu_count()}` (its "
                                        "defaults: the ILP scheduler)")):
        base = median(samples[name])
        speedup = 1 / paired_ratio(samples, "waypost", name)
        same = "greedy" in name
        rows.append(Row(
            measure="Slurm, shipped `profiles/onprem`: stages/s over plain Snakemake's local executor, same jobs, "
                    "same run", value=rate, unit="stages/s", baseline=BIG / base, baseline_label=label,
            target="≥ 1.0× plain" if same else "", met=(speedup >= 1.0) if same else None, paired_ratio=speedup,
            note=f"ratio = waypost's stages/s over plain's; {wp:.1f} s vs {base:.1f} s; 1 run each, back to back; "
                 f"speed probe {speed:.0f} ms"))
    return rows, []


# --- 3: dependent hops in the reference pipeline ---------------------------------

def hops(jobs: list[dict]) -> tuple[list[float], list[float]]:
    """For each job after the first: seconds from the end of the last job
    that ended before it was submitted to its start; and each job's run."""
    def at(text: str) -> float:
        return datetime.fromisoformat(text).timestamp()
    ordered = sorted(jobs, key=lambda j: at(j["Submit"]))
    gaps = []
    for job in ordered:
        before = [at(j["End"]) for j in ordered if at(j["End"]) <= at(job["Submit"])]
        if before:
            gaps.append(at(job["Start"]) - max(before))
    return gaps, [at(j["End"]) - at(j["Start"]) for j in ordered]


def reference(tmp: Path) -> tuple[list[Row], list[str]]:
    cfg = reference_config(1, experiments=1, teachers=1)
    runs = iter(range(100))
    found: dict[str, dict] = {}

    def run(name: str):
        def once() -> float:
            d = tmp / f"ref-{name}-{next(runs)}"
            write_config(d, cfg)
            if name == "local":
                cmd = [PYTHON, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "-d", str(d),
                       "--profile", str(REPO / "profiles" / "local"), "--configfile", str(d / "config.yaml")]
            elif name == "waypost":
                cmd = snakemake(REPO / "workflow" / "Snakefile", d, ONPREM_PROFILE, "waypost")
            else:      # as before: Snakemake's Slurm plugin, a Snakemake in each job, checks from 10 s
                cmd = [PYTHON, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "-d", str(d),
                       "--profile", str(ONPREM_PROFILE), "--configfile", str(d / "config.yaml"),
                       "--executor", "slurm", "--slurm-init-seconds-before-status-checks", "10",
                       "--slurm-no-account", *FAST]
            seconds = check(timed(cmd, cwd=d, timeout=TIMEOUT_S), f"reference pipeline, {name}").seconds
            if name != "local":
                jobs = jobs_of(d, 12)
                gaps, inside = hops(jobs)
                found[name] = {"jobs": len(jobs), "hop": median(gaps), "inside": median(inside),
                               "cpu": cpu_per_job(jobs)}
                log(f"reference {name}: {seconds:.1f}s, {len(jobs)} jobs, hop {found[name]['hop']:.1f}s, "
                    f"in the job {found[name]['inside']:.1f}s, {found[name]['cpu']:.2f} CPU-s per job")
            else:
                log(f"reference local: {seconds:.1f}s")
            shutil.rmtree(d, ignore_errors=True)
            return seconds
        return once

    samples = interleaved({"waypost": run("waypost"), "before": run("before"), "local": run("local")}, 1,
                          warmup=0)
    wp, before, local = (median(samples[k]) for k in ("waypost", "before", "local"))
    w, b = found["waypost"], found["before"]
    rows = [
        Row(measure="Slurm: the reference pipeline, one pair and one teacher (12 jobs), onprem profile",
            value=wp, unit="s", baseline=before,
            baseline_label="Snakemake's Slurm plugin: a Snakemake in each job, checks from 10 s (as before)",
            target="at least halved (ratio ≤ 0.50)", met=wp / before <= 0.5, samples=samples,
            note=f"the local profile: {local:.1f} s"),
        Row(measure="Slurm: a dependent hop (a job's end to the next job's start, median; sacct)",
            value=w["hop"], unit="s", baseline=b["hop"], baseline_label="as before",
            target="(informational)",
            note=f"in the job (start to end, median): {w['inside']:.0f} s vs {b['inside']:.0f} s; "
                 f"CPU per job {w['cpu']:.2f} s vs {b['cpu']:.2f} s; sacct times are whole seconds"),
    ]
    return rows, []


# --- 4: a parameter study at scale ---------------------------------------------

def param_study(tmp: Path) -> tuple[list[Row], list[str]]:
    d = tmp / "param-study"
    shutil.copytree(PARAM_STUDY / "workflow", d / "workflow")
    shutil.copytree(PARAM_STUDY / "scripts", d / "scripts")
    heavy = 5                                    # one expensive mesh per alpha: those run out of time
    # ~0.04·alpha·cells³ cell updates at ~8 million/s: ~80 s alone for the
    # 2,500-cell meshes, more than their 1-minute limit among the others.
    cells = list(range(5, 5 + POINTS // heavy - 1)) + [2500]
    workers = workers_file(d, PACK, **{"cpu-large": {"cpus": 1, "mem_mb": 500, "runtime": 1},
                                       "cpu": {"cpus": 1, "mem_mb": 500, "runtime": 5}})
    cfg = {"root": "results", "workers": str(workers),
           "experiments": {"sweep": {"grid": {"alpha": {"from": 0.8, "to": 1.0, "count": heavy}, "cells": cells}}},
           "stages": {"simulate": {"t_end": 0.02, "checkpoint_every": 5000, "bad_node_after": 0, "policy": {
               "max_attempts": 6, "runtime": 1, "runtime_growth": 1.5,
               "cues": [{"action": "restart", "when": "any(cmd.TIMEOUT, cmd.PREEMPTED)"}]}},
               "data_extract": {"policy": {"depends": "all_done"}},
               "summary_report": {"policy": {"depends": "all_done"}}}}
    (d / "config.yaml").write_text(json.dumps(cfg))
    cmd = snakemake(d / "workflow" / "Snakefile", d, ONPREM_PROFILE, "waypost")
    seconds = check(timed(cmd, cwd=d, timeout=TIMEOUT_S), "the parameter study on Slurm").seconds
    sweep = d / "results" / "_all" / "sweep"
    points = sorted(p.name for p in (sweep / "simulate").iterdir() if p.is_dir())
    records = {p: json.loads((sweep / "simulate" / p / "_manifest.json").read_text()) for p in points}
    restarted = {p: [a["state"] for a in r["attempts"]] for p, r in records.items() if len(r["attempts"]) > 1}
    extracts = sum((sweep / "data_extract" / p / "_manifest.json").exists() for p in points)
    if len(points) != POINTS or extracts != POINTS or not (sweep / "summary_report" / "summary.md").exists():
        raise RuntimeError(f"{len(points)} points, {extracts} extracts, summary: "
                           f"{(sweep / 'summary_report' / 'summary.md').exists()}")
    success = sum(r["state"] == "SUCCESS" for r in records.values())
    jobs = jobs_of(d, 2 * POINTS)
    arrays = len({j["JobID"].split("_")[0] for j in jobs})
    log(f"param study: {POINTS} points in {seconds:.1f}s, {success} SUCCESS, restarted {restarted}, "
        f"{len(jobs)} Slurm jobs in {arrays} submissions")
    timeouts = sum(states.count("TIMEOUT") for states in restarted.values())
    row = Row(measure=f"Slurm: examples/param-study, {POINTS:,} points (simulate, data_extract, a summary), "
                      f"packed (`pack: {PACK}`)", value=seconds, unit="s", target="(informational)",
              samples={"waypost": [seconds]},
              note=f"{success:,} of {POINTS:,} simulations SUCCESS; {len(restarted)} expensive points ran out of "
                   f"their Slurm time limit ({timeouts} TIMEOUTs) and restarted from their checkpoints; "
                   f"{len(jobs):,} Slurm jobs in {arrays} submissions; {cpu_per_job(jobs):.2f} CPU-s per job "
                   "(the simulation included)")
    shutil.rmtree(d, ignore_errors=True)
    return [row], []


def big_study(tmp: Path) -> tuple[list[Row], list[str]]:
    """examples/param-study at STUDY_POINTS points of small meshes (each a
    fraction of a second), bundled: a simulate and a data_extract per point
    and the summary over all of them, start to finish."""
    d = tmp / "big-study"
    shutil.copytree(PARAM_STUDY / "workflow", d / "workflow")
    shutil.copytree(PARAM_STUDY / "scripts", d / "scripts")
    side = round(STUDY_POINTS ** 0.5)
    workers = workers_file(d, 1, BUNDLE, cpu={"cpus": 1, "mem_mb": 500, "runtime": 2},
                           **{"cpu-large": {"cpus": 1, "mem_mb": 500, "runtime": 2}})
    cfg = {"root": "results", "workers": str(workers),
           "experiments": {"sweep": {"grid": {"alpha": {"from": 0.5, "to": 1.0, "count": side},
                                              "cells": list(range(5, 5 + side))}}},
           "stages": {"simulate": {"t_end": 0.01, "checkpoint_every": 400, "bad_node_after": 0,
                                        "policy": {"max_attempts": 2}},
                      "data_extract": {"policy": {"depends": "all_done"}},
                      "summary_report": {"policy": {"depends": "all_done"}}}}
    (d / "config.yaml").write_text(json.dumps(cfg))
    points = side * side
    # (the shipped profile as it is: no --jobs, no other flag)
    cmd = [PYTHON, "-m", "snakemake", "-s", str(d / "workflow" / "Snakefile"), "-d", str(d), "--profile",
           str(ONPREM_PROFILE), "--configfile", str(d / "config.yaml")]
    speed = machine_speed_ms()
    run = check(timed(cmd, cwd=d, timeout=3 * TIMEOUT_S), "the big parameter study on Slurm")
    seconds = run.seconds
    sweep = d / "results" / "_all" / "sweep"
    states = {p.name: json.loads((p / "_manifest.json").read_text())["state"]
              for p in (sweep / "simulate").iterdir() if p.is_dir()}
    extracts = sum((sweep / "data_extract" / p / "_manifest.json").exists() for p in states)
    success = sum(s == "SUCCESS" for s in states.values())
    if len(states) != points or extracts != points or not (sweep / "summary_report" / "summary.md").exists() \
            or success != points:
        raise RuntimeError(f"{len(states)} points, {success} SUCCESS, {extracts} extracts")
    jobs = jobs_of(d, -(-2 * points // BUNDLE))
    stages = 2 * points + 1
    # The CPU the run needed: Snakemake's main process and what it started
    # (sbatch, sacct), and every Slurm job's (the stages' commands and their
    # runners); over the node's real cores, the least wall it could take.
    node_cpu = sum(_seconds(j["TotalCPU"]) for j in jobs)
    cores = os.cpu_count() or 1
    budget = (f"CPU: main process and its children {run.cpu_s:,.0f} s, Slurm jobs {node_cpu:,.0f} s "
              f"({1000 * node_cpu / stages:.0f} ms a stage); {(run.cpu_s + node_cpu) / cores:,.0f} s of "
              f"wall at the least on this machine's {cores} cores")
    log(f"big study: {points} points ({stages} stages) in {seconds:.1f}s, {success} SUCCESS, {len(jobs)} Slurm jobs; "
        + budget)
    row = Row(measure=f"Slurm: examples/param-study, {points:,} points (simulate, data_extract, a summary), "
                      f"bundled (`bundle: {BUNDLE}`), shipped `profiles/onprem`", value=seconds, unit="s",
              target="(informational)", samples={"waypost": [seconds]},
              note=f"{stages / seconds:.1f} stages/s; {success:,} of {points:,} simulations SUCCESS; "
                   f"{len(jobs):,} Slurm jobs for {stages:,} stages; {budget}; speed probe {speed:.0f} ms")
    shutil.rmtree(d, ignore_errors=True)
    return [row], []


# --- 6: several nodes ----------------------------------------------------------

def several_nodes(tmp: Path) -> tuple[list[Row], list[str]]:
    """BIG trivial stages, bundled and packed, on the three compute nodes
    (partition `compute`, 4 CPUs each) beside the same on the one node
    (`cpu`, 8 CPUs), back to back; each job's node from sacct."""
    runs = iter(range(10**6))
    rows: list[Row] = []
    for how, pack, bundle in (("bundled", 1, BUNDLE), ("packed", PACK, 1)):
        seconds: dict[str, float] = {}
        spread: dict[str, dict[str, int]] = {}
        for partition in ("compute", "cpu"):
            d = trivial_workdir(tmp / f"nodes-{next(runs)}", BIG)
            cpu = {"partition": partition, **({"runtime": 2} if bundle > 1 else {})}
            cfg = json.loads((d / "config.yaml").read_text())
            (d / "config.yaml").write_text(json.dumps({**cfg, "workers": str(workers_file(d, pack, bundle, cpu=cpu))}))
            extra = ["--jobs", str(BUNDLE * 16)] if bundle > 1 else []
            cmd = snakemake(WAYPOST_SNAKEFILE, d, ONPREM_PROFILE, "waypost", *extra)
            seconds[partition] = check(timed(cmd, cwd=d, timeout=TIMEOUT_S), f"{how} on {partition}").seconds
            check_outputs(d, manifests=True)
            jobs = jobs_of(d, -(-BIG // bundle))
            spread[partition] = dict(Counter(job["NodeList"] for job in jobs))
            log(f"slurm nodes: {how}, {BIG} stages on {partition} in {seconds[partition]:.1f}s, "
                f"{len(jobs)} Slurm jobs, per node {spread[partition]}")
            shutil.rmtree(d, ignore_errors=True)
        per_node = ", ".join(f"{n} {c}" for n, c in sorted(spread["compute"].items()))
        rows.append(Row(
            measure=f"Slurm, 3 compute nodes: {BIG:,} trivial stages, {how} "
                    f"(`{'bundle' if bundle > 1 else 'pack'}: {bundle if bundle > 1 else pack}`; {TUNED}), stages/s",
            value=BIG / seconds["compute"], unit="stages/s", baseline=BIG / seconds["cpu"],
            baseline_label="the same on the one node (partition `cpu`), same run", target="(informational)",
            samples={"3 nodes": [seconds["compute"]], "1 node": [seconds["cpu"]]},
            note=f"{seconds['compute']:.1f} s against {seconds['cpu']:.1f} s; Slurm jobs per node: {per_node}; "
                 "every manifest SUCCESS"))
    notes = ["Several nodes: the local cluster's compute nodes `wp-n1`..`wp-n3` (each in namespaces of its own, "
             "its own slurmd; 4 CPUs declared each) against the machine's own node (8 CPUs declared). All of them "
             "share this machine's 2 cores, so more nodes bring no more CPU: these rows measure what Slurm and "
             "waypost do with several nodes (jobs spread over them, one slurmd each), not more compute."]
    return rows, notes


def run_several_nodes(ctx: dict) -> Section:
    reason = unavailable()
    if not reason and not subprocess.run(["sinfo", "-h", "-p", "compute", "-o", "%N"], capture_output=True,
                                         text=True).stdout.strip():
        reason = "skipped: the local cluster has no compute nodes here (no namespaces)"
    if reason:
        log(f"slurm nodes: {reason}")
        return Section("Slurm throughput on several nodes", skipped=reason)
    return run_parts("Slurm throughput on several nodes", ctx, [several_nodes])


def run(ctx: dict) -> Section:
    reason = unavailable()
    if reason:
        log(f"slurm: {reason}")
        return Section("Slurm throughput", skipped=reason)
    parts = [shipped, trivial, reference, param_study, big_study]
    only = os.environ.get("BENCH_SLURM_PARTS")        # e.g. "shipped,reference" for a spot check
    if only:
        parts = [p for p in parts if p.__name__ in only.split(",")]
    return run_parts("Slurm throughput", ctx, parts)


if __name__ == "__main__":
    show(run({}))
