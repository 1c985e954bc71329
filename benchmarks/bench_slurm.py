"""Slurm throughput: BENCH_SLURM_JOBS (default 200) trivial jobs on the local
Slurm cluster, waypost vs plain Snakemake with the same plugin settings.

- waypost: ``benchmarks/slurm/waypost/Snakefile`` (one stage per pair, written
  like the reference rules: stage paths, presence-aware inputs, worker-class
  resources, the step runner) with ``--profile profiles/onprem
  --waypost-init-seconds-before-status-checks 2 --latency-wait 5
  --waypost-no-account``;
- plain: ``benchmarks/slurm/plain/Snakefile`` (same paths and jobs, the
  onprem ``cpu`` class written out, ``touch`` as the command) with
  ``--profile benchmarks/slurm/plain-profile`` (profiles/onprem's settings on
  ``executor: slurm``) ``--slurm-init-seconds-before-status-checks 2
  --latency-wait 5 --slurm-no-account``.

Each run starts from an empty root and is timed until Snakemake exits; every
output (and for waypost every SUCCESS manifest) is checked afterwards. Runs
take minutes, so BENCH_SLURM_REPS defaults to 1 per side (alternated when
more). Skipped with BENCH_SLURM=0, or when ``sinfo`` shows no idle node
(start one as root: ``scripts/slurm-dev-cluster.sh start``). Target: ratio
≤ 1.05.

Run alone: ``.venv/bin/python benchmarks/bench_slurm.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BENCH, ONPREM_PROFILE, PYTHON, REPO, Row, Section, check, interleaved, log, median, show, timed

TARGET = 1.05
JOBS = int(os.environ.get("BENCH_SLURM_JOBS", "200"))
REPETITIONS = int(os.environ.get("BENCH_SLURM_REPS", "1"))
TIMEOUT_S = 1200
WAYPOST_SNAKEFILE = BENCH / "slurm" / "waypost" / "Snakefile"
PLAIN_SNAKEFILE = BENCH / "slurm" / "plain" / "Snakefile"
PLAIN_PROFILE = BENCH / "slurm" / "plain-profile"


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


def config(jobs: int) -> dict:
    return {"root": "results", "experiments": {"slurm": {"pairs": [f"p{i:04d}" for i in range(jobs)]}},
            "workers": str(REPO / "config" / "workers.yaml")}


def run(ctx: dict) -> Section:
    section = Section("Slurm throughput")
    reason = unavailable()
    if reason:
        section.skipped = reason
        log(f"slurm: {reason}")
        return section
    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-", dir=ctx.get("tmp")))
    fresh = itertools.count()
    cfg = config(JOBS)

    def workdir() -> Path:
        d = tmp / f"run-{next(fresh)}"
        d.mkdir()
        (d / "config.yaml").write_text(json.dumps(cfg))      # JSON is YAML
        return d

    def outputs_ok(d: Path, manifests: bool) -> None:
        for pair in cfg["experiments"]["slurm"]["pairs"]:
            stage = d / "results" / pair / "slurm" / "noop"
            if not (stage / "done.txt").exists():
                raise RuntimeError(f"{stage}/done.txt missing after the run")
            if manifests and json.loads((stage / "_manifest.json").read_text())["state"] != "SUCCESS":
                raise RuntimeError(f"{stage}: manifest not SUCCESS")

    job_cpu: dict[str, list[float]] = {"waypost": [], "plain": []}   # CPU seconds per job, per run

    def jobs_cpu(d: Path) -> float:
        """CPU seconds per job that Slurm accounted to the run's jobs (their
        ``TotalCPU``: user + system of every step, the inner Snakemake and the
        step runner included). Unlike wall time, other work on the machine
        hardly changes it."""
        deadline = time.time() + 60
        while True:   # accounting lags the job's end by a moment
            # Not -X: with it, sacct leaves the steps' CPU out of the job's line.
            out = subprocess.run(["sacct", "-a", "-n", "-P", "-S", "now-2hours", "-o", "JobIDRaw,WorkDir,TotalCPU"],
                                 capture_output=True, text=True, timeout=60).stdout
            cpu = [_seconds(total) for job, workdir_, total in (line.split("|") for line in out.splitlines())
                   if "." not in job and workdir_ == str(d)]
            if (len(cpu) >= JOBS and all(cpu)) or time.time() > deadline:
                return sum(cpu) / max(1, len(cpu))
            time.sleep(2)

    def one_run(name: str, snakefile: Path, profile: Path, plugin: str):
        """A whole run of one workflow on Slurm; its wall time (the CPU per job kept aside)."""
        def run_it() -> float:
            d = workdir()
            cmd = [PYTHON, "-m", "snakemake", "-s", str(snakefile), "-d", str(d), "--profile", str(profile),
                   "--configfile", str(d / "config.yaml"), f"--{plugin}-init-seconds-before-status-checks", "2",
                   "--latency-wait", "5", f"--{plugin}-no-account"]
            seconds = check(timed(cmd, cwd=d, timeout=TIMEOUT_S), f"{name} on Slurm").seconds
            outputs_ok(d, manifests=name == "waypost")
            job_cpu[name].append(jobs_cpu(d))
            log(f"slurm {name}: {seconds:.1f}s, {job_cpu[name][-1]:.2f} CPU-s per job")
            return seconds
        return run_it

    try:
        samples = interleaved({"waypost": one_run("waypost", WAYPOST_SNAKEFILE, ONPREM_PROFILE, "waypost"),
                               "plain": one_run("plain", PLAIN_SNAKEFILE, PLAIN_PROFILE, "slurm")},
                              REPETITIONS, warmup=0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wp, base = median(samples["waypost"]), median(samples["plain"])
    section.rows.append(Row(
        measure=f"Slurm: {JOBS} trivial jobs, onprem profile, start to finish", value=wp, unit="s",
        baseline=base, baseline_label="plain Snakemake, same plugin settings", target=f"ratio ≤ {TARGET:.2f}",
        met=wp / base <= TARGET, samples=samples,
        note=f"{REPETITIONS} run{'s' if REPETITIONS > 1 else ''} each"
             + (" (each takes minutes)" if REPETITIONS == 1 else "")
             + f"; {JOBS / wp:.2f} vs {JOBS / base:.2f} jobs/s"))
    cpu_wp, cpu_base = median(job_cpu["waypost"]), median(job_cpu["plain"])
    section.rows.append(Row(
        measure="Slurm: CPU time per job (sacct `TotalCPU`)", value=cpu_wp, unit="s", baseline=cpu_base,
        baseline_label="plain Snakemake", target="(informational)",
        samples={"waypost (CPU-s per job)": job_cpu["waypost"], "plain (CPU-s per job)": job_cpu["plain"]},
        note=f"{1000 * (cpu_wp - cpu_base):+.0f} ms per job: what the node spends on waypost; "
             "hardly changed by other work on the machine"))
    section.notes.append(
        "Both on the local single-node cluster (`scripts/slurm-dev-cluster.sh`), partition `cpu`, "
        "1 CPU and 1000 MB per job (the onprem pool's `cpu` class), `jobs: 100`; Slurm runs as many at once "
        "as the node's CPUs and memory allow. Every job's output (and for waypost its SUCCESS manifest) "
        "was checked after each run.")
    return section


if __name__ == "__main__":
    show(run({}))
