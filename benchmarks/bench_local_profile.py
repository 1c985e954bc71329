"""The local profile as a user gets it (issues 42, 57): BENCH_LOCAL_JOBS
(default 200) trivial stages (``touch``) with ``--profile profiles/local``
and nothing else (``benchmarks/slurm/waypost/Snakefile``) against plain
Snakemake's local executor on the same jobs and paths
(``benchmarks/slurm/plain/Snakefile``, ``--cores`` the machine's cores, as
the profile's ``cores: all``), twice: with Snakemake's defaults (its ILP
scheduler) and with the profile's scheduler (``--scheduler greedy``), the
baseline the targets are against.

Rounds alternate, the order flipped every round; the ratios are the medians of
the rounds' ratios: wall time, and CPU per job (``getrusage`` of the run's
processes: Snakemake and every job it ran). The machine's speed probe is
taken just before the rounds. Every waypost stage's manifest is checked
SUCCESS after each run.

Run alone: ``.venv/bin/python benchmarks/bench_local_profile.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    BENCH,
    LOCAL_PROFILE,
    PYTHON,
    Row,
    Section,
    check,
    interleaved,
    log,
    machine_speed_ms,
    median,
    paired_ratio,
    run_parts,
    show,
    timed,
)

JOBS = int(os.environ.get("BENCH_LOCAL_JOBS", "200"))
ROUNDS = 3
PACE_TARGET = 0.95       # issue 57, item 3: ≥ 0.95× plain's pace (greedy)
CPU_TARGET = 1.10        # issue 57, item 2: ≤ 1.1× plain's CPU per job (greedy)
WAYPOST_SNAKEFILE = BENCH / "slurm" / "waypost" / "Snakefile"
PLAIN_SNAKEFILE = BENCH / "slurm" / "plain" / "Snakefile"
TIMEOUT_S = 1800


def trivial_workdir(directory: Path, stages: int, workers: Path | None = None) -> Path:
    """A work directory whose config asks for ``stages`` trivial stages (one
    experiment, one pair each), read by both trivial Snakefiles."""
    directory.mkdir(parents=True)
    cfg: dict = {"root": "results", "experiments": {"slurm": {"pairs": [f"p{i:05d}" for i in range(stages)]}}}
    if workers:
        cfg["workers"] = str(workers)
    (directory / "config.yaml").write_text(json.dumps(cfg))
    return directory


def plain_local_cmd(workdir: Path, greedy: bool = False) -> list[str]:
    """Plain Snakemake's local executor on a trivial work directory, on every
    core; with its default scheduler (ILP), or with ``greedy`` (the local profile's)."""
    return [PYTHON, "-m", "snakemake", "-s", str(PLAIN_SNAKEFILE), "-d", str(workdir), "--configfile",
            str(workdir / "config.yaml"), "--cores", str(os.cpu_count()), "-q",
            *(["--scheduler", "greedy"] if greedy else [])]


def check_outputs(workdir: Path, manifests: bool) -> None:
    """Every trivial stage's output there (and with ``manifests``, its SUCCESS manifest)."""
    pairs = json.loads((workdir / "config.yaml").read_text())["experiments"]["slurm"]["pairs"]
    for pair in pairs:
        stage = workdir / "results" / pair / "slurm" / "noop"
        if not (stage / "done.txt").exists():
            raise RuntimeError(f"{stage}/done.txt missing after the run")
        if manifests and json.loads((stage / "_manifest.json").read_text())["state"] != "SUCCESS":
            raise RuntimeError(f"{stage}: manifest not SUCCESS")


def local_profile(tmp: Path) -> tuple[list[Row], list[str]]:
    fresh = itertools.count()
    names = ("waypost", "plain-greedy", "plain")
    cpu: dict[str, list[float]] = {name: [] for name in names}

    def run(name: str, stages: int = JOBS, record: bool = True):
        def once() -> float:
            d = trivial_workdir(tmp / f"local-{name}-{next(fresh)}", stages)
            cmd = plain_local_cmd(d, greedy=name == "plain-greedy") if name != "waypost" else \
                [PYTHON, "-m", "snakemake", "-s", str(WAYPOST_SNAKEFILE), "-d", str(d), "--profile",
                 str(LOCAL_PROFILE), "--configfile", str(d / "config.yaml")]
            result = check(timed(cmd, cwd=d, timeout=TIMEOUT_S), f"{name}, local")
            check_outputs(d, manifests=name == "waypost")
            if record:
                cpu[name].append(result.cpu_s)
                log(f"local {name}: {stages} stages in {result.seconds:.1f} s, "
                    f"{1000 * result.cpu_s / stages:.0f} ms CPU per job")
            shutil.rmtree(d, ignore_errors=True)
            return result.seconds
        return once

    for name in names:      # warm the page cache and the bytecode, a few jobs each
        run(name, 5, record=False)()
    speed = machine_speed_ms()
    samples = interleaved({name: run(name) for name in names}, ROUNDS, warmup=0)
    wp = median(samples["waypost"])
    cores = os.cpu_count()
    rows = []
    for base, label in (("plain-greedy", f"plain Snakemake `--cores {cores} --scheduler greedy` (the profile's "
                                         "scheduler)"),
                        ("plain", f"plain Snakemake `--cores {cores}` (its defaults: the ILP scheduler)")):
        wall, cpu_ratio = paired_ratio(samples, "waypost", base), paired_ratio(cpu, "waypost", base)
        same = base == "plain-greedy"
        rows += [
            Row(measure=f"local profile: {JOBS} trivial stages, `--profile profiles/local` as shipped", value=wp,
                unit="s", baseline=median(samples[base]), baseline_label=label,
                target=f"pace ≥ {PACE_TARGET:.2f}× plain" if same else "",
                met=(1 / wall >= PACE_TARGET) if same else None, samples={k: samples[k] for k in ("waypost", base)},
                paired_ratio=wall, note=f"{JOBS / wp:.1f} vs {JOBS / median(samples[base]):.1f} stages/s (pace "
                                        f"{1 / wall:.2f}×); {ROUNDS} rounds, paired; speed probe {speed:.0f} ms"),
            Row(measure="local profile: CPU per job (Snakemake and its jobs, `getrusage`)",
                value=1000 * median(cpu["waypost"]) / JOBS, unit="ms", baseline=1000 * median(cpu[base]) / JOBS,
                baseline_label=label, target=f"≤ {CPU_TARGET:.2f}× plain" if same else "",
                met=(cpu_ratio <= CPU_TARGET) if same else None, paired_ratio=cpu_ratio,
                samples={f"{k} (CPU-s per run)": cpu[k] for k in ("waypost", base)},
                note=f"the same runs; speed probe {speed:.0f} ms"),
        ]
    return rows, []


def run(ctx: dict) -> Section:
    return run_parts("Local profile", ctx, (local_profile,))


if __name__ == "__main__":
    show(run({}))
