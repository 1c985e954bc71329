"""Planning a parameter study: ``snakemake -n`` of examples/param-study at
BENCH_STUDY_POINTS (default 10,000) grid points, everything to do, against
the same study in plain Snakemake (``benchmarks/plain/study.Snakefile``: the
same grid from the same config, the same rules, commands and paths, and
the same resources per rule: those waypost's local pool gives them).

Both run with the local profile, the same config file, in the same
directory, alternately; before timing, both dry runs are checked to plan the
same jobs by rule. Run alone: ``.venv/bin/python benchmarks/bench_study_planning.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_planning import alternate, dry_run_cmd, plan_alike
from common import (
    BENCH,
    REPO,
    Row,
    Section,
    log,
    median,
    paired_ratio,
    show,
)

POINTS = int(os.environ.get("BENCH_STUDY_POINTS", "10000"))
REPETITIONS = 3
TARGET = 1.10
STUDY = REPO / "examples" / "param-study"
PLAIN = BENCH / "plain" / "study.Snakefile"


def run(ctx: dict) -> Section:
    section = Section("Planning a parameter study (`snakemake -n`)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-study-planning-", dir=ctx.get("tmp")))
    try:
        d = tmp / "study"
        shutil.copytree(STUDY / "workflow", d / "workflow")
        shutil.copytree(STUDY / "scripts", d / "scripts")
        shutil.copy(PLAIN, d / "workflow" / "plain.Snakefile")
        side = round(POINTS ** 0.5)
        cfg = {"root": "results", "experiments": {"sweep": {"grid": {
            "alpha": {"from": 0.5, "to": 1.0, "count": side}, "cells": list(range(5, 5 + side))}}},
            "stages": {"simulate": {"t_end": 0.01}}}
        (d / "config.yaml").write_text(json.dumps(cfg))
        points = side * side

        commands = {"waypost": dry_run_cmd(d / "workflow" / "Snakefile", d),
                    "plain": dry_run_cmd(d / "workflow" / "plain.Snakefile", d)}
        planned = plan_alike(commands, d, "the study", resources=True)
        samples = alternate(commands, d, REPETITIONS)
        wp, plain = median(samples["waypost"]), median(samples["plain"])
        ratio = paired_ratio(samples, "waypost", "plain")
        jobs = sum(planned["waypost"].values())
        log(f"study planning: {points} points, {jobs} jobs: waypost {wp:.2f}s plain {plain:.2f}s ratio {ratio:.2f}")
        section.rows.append(Row(
            measure=f"planning `snakemake -n`, examples/param-study at {points:,} points, everything to do",
            value=wp, unit="s", baseline=plain, baseline_label="the same study in plain Snakemake",
            target=f"ratio ≤ {TARGET:.2f}", met=ratio <= TARGET, samples=samples, paired_ratio=ratio,
            note=f"each planned the same {jobs:,} jobs (+ `all`)"))
        section.notes.append(
            "The plain study (`benchmarks/plain/study.Snakefile`) reads the same grid from the same config and "
            "has the same rules, paths, commands and resources (the dry runs are checked to print the same "
            "resources per rule), with the params looked up per point and `rule all` over "
            "the summary; waypost's is examples/param-study's own Snakefile (its grid from the config, its "
            "settings and policies per point). Rounds alternate, the order flipped every round; the ratio is "
            "the median of the rounds' ratios.")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return section


if __name__ == "__main__":
    show(run({}))
