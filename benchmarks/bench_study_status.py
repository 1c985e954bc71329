"""Status at a study's scale (issue 31): `waypost status`, `status --failed`
and `status --attempts STAGE` over 8,000 stage directories of a parameter
study, and what `waypost plan` adds to Snakemake's dry run at 8,000 jobs.

The study is examples/param-study's workflow on a 40 × 100 grid (4,000
points: `simulate` and `data_extract` each, and the summary): 8,001 stage
directories, each with its outputs (when done) and a manifest as the runner
writes it, the points' own settings included. Mixed ends, as a real study
has them: of the simulations, 2 % ran out of time after three attempts (a
restart each), 1.5 % failed, 1 % failed and were given up; the extracts over
the given-up points were skipped. So `--failed` names 180 points, and
`--attempts simulate` prints 4,000 lines.

Each command runs in its own process, alternately with the baseline
``find ROOT -name _manifest.json | wc -l``; target ≤ 1 s. For `plan`, the dry
run is Snakemake's (its cost is the planning benchmark's): timed here is
what waypost does with it, in one interpreter — reading the dry run's 8,001
jobs, grouping them by stage and reason, the drift over the 8,000 manifests
and printing the tables.

Run alone: ``.venv/bin/python benchmarks/bench_study_status.py``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    BIN,
    CONTENT,
    CONTENT_SHA256,
    LOCAL_PROFILE,
    PYTHON,
    REPO,
    Row,
    Section,
    check,
    interleaved,
    log,
    median,
    show,
    timed,
)

TARGET_S = 1.0
REPETITIONS = 7
PHASE_REPETITIONS = 3
EXAMPLE = REPO / "examples" / "param-study"
WORKFLOW = EXAMPLE / "workflow"
ALPHAS, CELLS = 40, 100              # 4,000 points
TIMEOUT_EVERY, FAILED_EVERY, GIVEN_UP_EVERY = 50, 67, 100   # 2 %, 1.5 %, 1 %


STAGE_DIRS = 2 * ALPHAS * CELLS + 1   # simulate and data_extract per point, and the summary


def study_config(root: str, alphas: int = ALPHAS, cells: int = CELLS) -> dict:
    """The example's config on an ``alphas`` × ``cells`` grid (the study
    benchmark at scale, bench_study_scale, asks for a bigger one)."""
    config = yaml.safe_load((EXAMPLE / "config" / "config.yaml").read_text())
    config["root"] = root
    config["experiments"] = {"sweep": {"grid": {"alpha": {"from": 0.5, "to": 1.0, "count": alphas},
                                                "cells": {"from": 10, "to": 10 + cells - 1, "count": cells}}}}
    return config


def _attempt(number: int, action: str, state: str, decision: tuple[str, str]) -> dict:
    from waypost.model import manifest
    return {"number": number, "series": 1, "action": action, "state": state,
            "exit_code": 0 if state == "SUCCESS" else (None if state == "TIMEOUT" else 1),
            "signal": 15 if state == "TIMEOUT" else None, "checks": {},
            "decision": {"action": decision[0], "reason": decision[1]}, "start": manifest.now_iso(),
            "end": manifest.now_iso(), "duration_s": 0.3, "runtime_limit_s": 0.3, "host": "bench",
            "scheduler": None, "scheduler_job_id": None, "command": ["true"], "workspace": ".", "log": f"_logs/attempt-{number}.log",
            "why": "a first series"}


def build_study(workdir: Path, config: dict) -> dict[str, int]:
    """The study's stage directories, as its run leaves them (see the module's
    docstring); returns how many points ended in each way."""
    from waypost.model import config as wconfig
    from waypost.model import graph, layout, manifest, records

    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    root = workdir / config["root"]
    here = os.getcwd()
    os.chdir(workdir)            # (the workflow's facts are remembered there, as by any command)
    try:
        facts = graph.facts(str(workdir / "config.yaml"), str(WORKFLOW))
        cfg = graph.load_config(str(WORKFLOW), facts)
    finally:
        os.chdir(here)
    points = list(wconfig.points(cfg, "sweep"))
    settings_of = wconfig.step_settings_of(cfg)   # each point's own, so that nothing drifts
    ends = {"SUCCESS": 0, "TIMEOUT": 0, "FAILED": 0, "given up": 0}

    def write(stage: str, instance: str | None, state: str, attempts: list[dict], files: list[str], **extra):
        stage_dir = Path(layout.stage_dir(str(root), layout.ALL_PAIRS, "sweep", stage, instance))
        stage_dir.mkdir(parents=True, exist_ok=True)
        for name in files:
            (stage_dir / name).write_bytes(CONTENT)
        outputs = [{"path": name, "size": len(CONTENT), "sha256": CONTENT_SHA256} for name in files]
        data = records.manifest(created=manifest.now_iso(), experiment="sweep", pair=layout.ALL_PAIRS, stage=stage, instance=instance,
                              state=state, attempts=attempts, outputs=outputs, inputs=[],
                              settings=settings_of("sweep", layout.ALL_PAIRS, stage, instance),
                              config_hash="0" * 16, code_version="bench")
        data.update(extra)
        (stage_dir / manifest.MANIFEST).write_text(json.dumps(data, indent=2) + "\n")

    done = ("done", "succeeded")
    for n, point in enumerate(points):
        if n % GIVEN_UP_EVERY == 7:
            ends["given up"] += 1
            write("simulate", point, "FAILED", [_attempt(1, "cmd", "FAILED", ("fail", "FAILED and no cue matched"))],
                  [], given_up=True, reason="given up after 1 series (max_series 1)")
            write("data_extract", point, "SKIPPED", [], [], reason="parents not accepted by depends "
                  "(any(parent.SUCCESS, parent.TIMEOUT, parent.FAILED)): simulate is FAILED")
            continue
        if n % TIMEOUT_EVERY == 3:
            ends["TIMEOUT"] += 1
            restart = ("restart", "cue 1 (restart when any(cmd.TIMEOUT, cmd.PREEMPTED))")
            write("simulate", point, "TIMEOUT", [
                _attempt(1, "cmd", "TIMEOUT", restart), _attempt(2, "restart", "TIMEOUT", restart),
                _attempt(3, "restart", "TIMEOUT", ("fail", "cue 1 (restart when any(cmd.TIMEOUT, cmd.PREEMPTED)), "
                                                           "but max_attempts (3) reached"))], [])
        elif n % FAILED_EVERY == 5:
            ends["FAILED"] += 1
            write("simulate", point, "FAILED", [_attempt(1, "cmd", "FAILED", ("fail", "FAILED and no cue matched"))],
                  [])
        else:
            ends["SUCCESS"] += 1
            write("simulate", point, "SUCCESS", [_attempt(1, "cmd", "SUCCESS", done)], ["result.json"])
        write("data_extract", point, "SUCCESS", [_attempt(1, "cmd", "SUCCESS", done)], ["extract.json"])
    write("summary_report", None, "SUCCESS", [_attempt(1, "cmd", "SUCCESS", done)], ["summary.md"])
    return ends


def status_cmd(workdir: Path, *extra: str) -> list[str]:
    return [str(BIN / "waypost"), "status", "--config", str(workdir / "config.yaml"), "--workflow", str(WORKFLOW),
            *extra]


# What `waypost plan` does besides the dry run, phase by phase, in one
# interpreter (waypost's internals: when they change, this part says it is
# unavailable and the rest goes on). argv: config, workflow, the dry run's
# text file and its events file.
PLAN_PHASES = r"""
import contextlib, io, json, sys, time
from waypost.cli import main as cli
from waypost.cli import run as clirun
from waypost.model import events, graph
from waypost.ops import plan
args = cli.build_parser().parse_args(["plan", "--config", sys.argv[1], "--workflow", sys.argv[2]])
# (read as plan reads them: its dry run leaves them so for the next plan, which reads no more)
facts = graph.facts(sys.argv[1], sys.argv[2], args.profile)
cfg = graph.load_config(sys.argv[2], facts)
text = open(sys.argv[3]).read()
t0 = time.perf_counter()
found = events.read(sys.argv[4])
rows = plan.next_run(plan.parse_jobs(found, "point"), cfg)
t1 = time.perf_counter()
drifted, unknown = plan.drift(cfg, graph.code_versions(), facts["funnels"])
groups = plan.collapse(drifted, cfg)
t2 = time.perf_counter()
# the tables, as cmd_plan prints them, over these rows (no second dry run)
plan.dry_run = lambda *a, **kw: (0, text, found)
with contextlib.redirect_stdout(io.StringIO()) as out:
    clirun.cmd_plan(args)
t3 = time.perf_counter()
print(json.dumps({"jobs": sum(g["count"] for r in rows for g in r["reasons"]), "rows": len(rows),
                  "lines": out.getvalue().count("\n"),
                  "phases": {"read the dry run's jobs, group them (plan.parse_jobs, next_run)": t1 - t0,
                             "drift over the manifests (plan.drift, collapse)": t2 - t1,
                             "all of `waypost plan` but the dry run: the config, the above, the tables (cli/run.py's cmd_plan)": t3 - t2}}))
"""


def plan_part(workdir: Path, config: dict) -> tuple[list[Row], list[str]]:
    """The dry run of the study with nothing done (8,001 jobs), once; then
    waypost's own phases over its text and the done tree's manifests."""
    from waypost.model import events
    from waypost.ops import plan

    fresh = workdir.parent / "fresh"
    fresh.mkdir(exist_ok=True)
    (fresh / "config.yaml").write_text(yaml.safe_dump({**config, "root": str(fresh / "results")}, sort_keys=False))
    log("plan: one dry run of the study with nothing done")
    events_file = workdir.parent / "dry-run-events.jsonl"
    dry = timed([PYTHON, "-m", "snakemake", "-s", str(WORKFLOW / "Snakefile"), "--profile", str(LOCAL_PROFILE),
                 "-n", "--configfile", str(fresh / "config.yaml"), *events.snakemake_args(str(events_file))],
                cwd=fresh, env={**os.environ, events.EVENTS_ENV: str(events_file)})   # (as plan.dry_run)
    check(dry, "snakemake -n")
    text_file = workdir.parent / "dry-run.txt"
    text_file.write_text(dry.output)
    jobs = len(plan.parse_jobs(events.read(str(events_file)), "point"))
    runs = []
    for _ in range(PHASE_REPETITIONS):
        result = timed([PYTHON, "-c", PLAN_PHASES, str(workdir / "config.yaml"), str(WORKFLOW), str(text_file),
                        str(events_file)], cwd=workdir)
        if result.returncode != 0:
            return [], [f"(`waypost plan`'s phases unavailable: {result.output.strip().splitlines()[-1:]})"]
        runs.append(json.loads(result.output.strip().splitlines()[-1]))
    phases = {name: median([r["phases"][name] for r in runs]) for name in runs[0]["phases"]}
    whole = phases["all of `waypost plan` but the dry run: the config, the above, the tables (cli/run.py's cmd_plan)"]
    table = "\n".join(f"| {name} | {1000 * s:.0f} |" for name, s in phases.items())
    note = (f"**`waypost plan` at {jobs:,} jobs**: Snakemake's dry run of the study with nothing done took "
            f"{dry.seconds:.1f} s (once; the planning benchmark measures it). Over its text and the done "
            f"tree's {STAGE_DIRS:,} manifests, waypost's own work (medians of {PHASE_REPETITIONS}, in one "
            f"interpreter after its start) — the tables are {runs[0]['lines']} lines, {runs[0]['rows']} "
            "rows (a row per stage and reason):\n\n| phase | ms |\n| --- | ---: |\n" + table)
    row = Row(measure=f"`waypost plan`: waypost's part over an {jobs:,}-job dry run and {STAGE_DIRS:,} manifests",
              value=whole, unit="s", baseline=dry.seconds, baseline_label="Snakemake's dry run (`snakemake -n`)",
              target=f"≤ {TARGET_S:g} s", met=whole <= TARGET_S,
              note=f"{runs[0]['lines']} lines printed")
    return [row], [note]


def run(ctx: dict) -> Section:
    section = Section("Status at a study's scale")
    tmp = Path(tempfile.mkdtemp(prefix="bench-study-status-", dir=ctx.get("tmp")))
    ctx.setdefault("cleanup", []).append(tmp)
    workdir = tmp / "study"
    workdir.mkdir()
    config = study_config(str(workdir / "results"))
    log(f"building the study's {STAGE_DIRS:,} stage directories")
    ends = build_study(workdir, config)

    # Checked first: the grid sees every directory, and --failed names the ones not done.
    grid = json.loads(check(timed(status_cmd(workdir, "--json"), cwd=workdir), "waypost status --json").output)
    cells = grid["experiments"]["sweep"]["_all"]
    dirs = sum(len(c.get("instances", {})) or 1 for c in cells.values())
    failed = json.loads(check(timed(status_cmd(workdir, "--failed", "--json"), cwd=workdir), "--failed").output)
    want = ends["TIMEOUT"] + ends["FAILED"] + 2 * ends["given up"]
    if dirs != STAGE_DIRS or len(failed["failed"]) != want:
        raise RuntimeError(f"status sees {dirs} stage dirs (want {STAGE_DIRS}), --failed {len(failed['failed'])} "
                           f"(want {want})")
    text = check(timed(status_cmd(workdir), cwd=workdir), "waypost status").output
    root = config["root"]
    find = ["bash", "-c", f"find {root} -name _manifest.json | wc -l"]
    found = check(timed(find, cwd=workdir), "find")
    assert int(found.output.strip()) == STAGE_DIRS, found.output

    def variant(cmd, what):
        return lambda: check(timed(cmd, cwd=workdir, keep_output=False), what).seconds
    commands = {
        "waypost status": status_cmd(workdir),
        "waypost status --failed": status_cmd(workdir, "--failed"),
        "waypost status --failed --json": status_cmd(workdir, "--failed", "--json"),
        "waypost status --attempts simulate": status_cmd(workdir, "--attempts", "simulate"),
    }
    lines = {name: check(timed(cmd, cwd=workdir), name).output.count("\n") for name, cmd in commands.items()}
    samples = interleaved({**{name: variant(cmd, name) for name, cmd in commands.items()},
                           "find | wc -l": variant(find, "find")}, REPETITIONS)
    baseline = median(samples["find | wc -l"])
    for name in commands:
        value = median(samples[name])
        log(f"{name}: {value:.2f}s ({lines[name]} lines) vs find {baseline:.3f}s")
        section.rows.append(Row(measure=f"`{name}`, a study's {STAGE_DIRS:,} stage directories", value=value, unit="s",
                                baseline=baseline, baseline_label="`find -name _manifest.json | wc -l`",
                                target=f"≤ {TARGET_S:g} s", met=value <= TARGET_S,
                                note=f"{lines[name]:,} lines" if "json" not in name else "",
                                samples={name: samples[name], "find | wc -l": samples["find | wc -l"]}))
    cell = next(line for line in text.splitlines() if "simulate" in line)
    section.notes.append(
        f"The study: {ALPHAS} × {CELLS} points of examples/param-study's workflow, every directory with a "
        f"manifest (`records.manifest`) and, when done, its outputs; of the simulations {ends['SUCCESS']:,} "
        f"done, {ends['TIMEOUT']} timed out (three attempts each), {ends['FAILED']} failed and "
        f"{ends['given up']} given up (their extracts skipped). Checked first: `status --json` sees "
        f"{dirs:,} directories and `status --failed --json` names {want}. The grid's cell reads "
        f"`{cell.strip(' │┃').split('│')[-1].strip()}`; each command's output goes to a file (80 columns, as "
        "when piped).")
    rows, notes = plan_part(workdir, config)
    section.rows += rows
    section.notes += notes
    return section


if __name__ == "__main__":
    ctx: dict = {}
    show(run(ctx), ctx)
