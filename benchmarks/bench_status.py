"""`waypost status` on the state of a finished ~8,000-job run.

Reuses the planning benchmark's largest done tree (every output present and a
minimal valid SUCCESS ``_manifest.json`` in every stage directory), or builds
it when run alone. Times ``waypost status`` (the rich tables, output to a
file: 80 columns, as when piped, where 200 pairs show as per-stage counts)
and ``waypost status --json``, alternately
with the baseline ``find ROOT -name _manifest.json | wc -l`` — the least any
reader of every manifest must do. Target: ≤ 1 s.

Run alone: ``.venv/bin/python benchmarks/bench_status.py``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    BIN,
    PYTHON,
    REPO,
    Row,
    Section,
    build_done_tree,
    check,
    expected_jobs,
    interleaved,
    log,
    median,
    own_time_table,
    profile_table,
    reference_config,
    show,
    timed,
    write_config,
)

TARGET_S = 1.0
REPETITIONS = 7
BREAKDOWN_REPETITIONS = 3

# The phases of `waypost status`, timed inside one fresh interpreter. Uses
# waypost's internals (clistatus.render_status, status.collect, config.load): when
# those change, the breakdown says it is unavailable and the rest goes on.
PHASES = r"""
import contextlib, json, os, sys, time
t0 = time.perf_counter()
from waypost import cli, clistatus, graph, status
t1 = time.perf_counter()
facts = graph.facts(sys.argv[1], sys.argv[2])
cfg = graph.load_config(sys.argv[1], sys.argv[2], facts)
t2 = time.perf_counter()
grid = status.collect(cfg, facts["funnels"])
t3 = time.perf_counter()
with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
    clistatus.render_status(grid)
t4 = time.perf_counter()
with open(os.devnull, "w") as null:
    null.write(json.dumps(grid))
t5 = time.perf_counter()
print(json.dumps({"import waypost.cli.main (+ config, status)": t1 - t0, "load the config (its validation remembered)": t2 - t1,
                  "read the stage directories (status.collect)": t3 - t2,
                  "render the tables (rich, incl. its import)": t4 - t3, "write the JSON (--json)": t5 - t4}))
"""


def status_cmd(workdir: Path, *extra: str) -> list[str]:
    return [str(BIN / "waypost"), "status", "--config", str(workdir / "config.yaml"),
            "--workflow", str(REPO / "workflow"), *extra]


def breakdown(workdir: Path, table: float, as_json: float) -> str:
    """Where `waypost status`'s time goes, phase by phase (medians)."""
    runs = []
    for _ in range(BREAKDOWN_REPETITIONS):
        result = timed([PYTHON, "-c", PHASES, str(workdir / "config.yaml"), str(REPO / "workflow")], cwd=workdir)
        if result.returncode != 0:
            return f"(Phase breakdown unavailable: {result.output.strip().splitlines()[-1:]})"
        runs.append(json.loads(result.output.strip().splitlines()[-1]))
    phases = {name: median([r[name] for r in runs]) for name in runs[0]}
    rows = "\n".join(f"| {name} | {1000 * seconds:.0f} |" for name, seconds in phases.items())
    # The tables' run is every phase but the JSON; the rest is the interpreter.
    in_process = sum(seconds for name, seconds in phases.items() if "JSON" not in name)
    return (f"Phases of `waypost status`, timed inside one interpreter (medians of {BREAKDOWN_REPETITIONS}). "
            f"Of the {1000 * table:.0f} ms of `waypost status` (tables), these phases take {1000 * in_process:.0f} "
            f"ms; the rest is the interpreter's start and exit. `--json` ({1000 * as_json:.0f} ms) swaps the "
            "tables for the JSON:\n\n| phase | ms |\n| --- | ---: |\n" + rows)


def run(ctx: dict) -> Section:
    section = Section("`waypost status`")
    tree = ctx.get("done_tree")
    if tree is None:                      # run alone: build the 200-pair tree
        tmp = Path(tempfile.mkdtemp(prefix="bench-status-", dir=ctx.get("tmp")))
        ctx.setdefault("cleanup", []).append(tmp)
        config = reference_config(200)
        workdir = tmp / "pairs-200"
        write_config(workdir, config)
        log("building the done tree")
        tree = {"workdir": workdir, "config": config, "stage_dirs": build_done_tree(workdir, config),
                "jobs": expected_jobs(config)}
    workdir = tree["workdir"]
    root = tree["config"]["root"]

    # Checked first: every stage is done, and find sees every manifest.
    grid = json.loads(check(timed(status_cmd(workdir, "--json"), cwd=workdir), "waypost status --json").output)
    cells = [cell for exp in grid["experiments"].values() for pair in exp.values() for cell in pair.values()]
    instances = sum(len(c.get("instances", {})) or 1 for c in cells)
    not_done = [c["path"] for c in cells if c["state"] != "SUCCESS"]
    if not_done or instances != tree["stage_dirs"]:
        raise RuntimeError(f"status sees {instances} stage dirs (want {tree['stage_dirs']}); "
                           f"not done: {not_done[:5]}")
    found = check(timed(["bash", "-c", f"find {root} -name _manifest.json | wc -l"], cwd=workdir), "find")
    assert int(found.output.strip()) == tree["stage_dirs"], found.output

    def variant(cmd, what):
        return lambda: check(timed(cmd, cwd=workdir, keep_output=False), what).seconds
    samples = interleaved({
        "waypost status": variant(status_cmd(workdir), "waypost status"),
        "waypost status --json": variant(status_cmd(workdir, "--json"), "waypost status --json"),
        "find | wc -l": variant(["bash", "-c", f"find {root} -name _manifest.json | wc -l"], "find"),
    }, REPETITIONS)
    table, as_json, baseline = (median(samples[k]) for k in ("waypost status", "waypost status --json",
                                                             "find | wc -l"))
    log(f"status: {table:.2f}s (--json {as_json:.2f}s) vs find {baseline:.3f}s")
    label = f"{tree['jobs']:,}-job done state, {tree['stage_dirs']:,} manifests"
    section.rows += [
        Row(measure=f"`waypost status`, {label}", value=table, unit="s", baseline=baseline,
            baseline_label="`find -name _manifest.json | wc -l`", target=f"≤ {TARGET_S:g} s",
            met=table <= TARGET_S, samples={k: samples[k] for k in ("waypost status", "find | wc -l")}),
        Row(measure=f"`waypost status --json`, {label}", value=as_json, unit="s", baseline=baseline,
            baseline_label="`find -name _manifest.json | wc -l`", target=f"≤ {TARGET_S:g} s",
            met=as_json <= TARGET_S, samples={k: samples[k] for k in ("waypost status --json", "find | wc -l")}),
    ]
    section.notes.append(f"Every stage directory holds its outputs and a minimal valid SUCCESS manifest "
                         f"(`records.manifest`); checked first: `waypost status --json` reports all "
                         f"{instances:,} stage directories done and `find` counts as many manifests. That "
                         "first run also remembers that the config passed validation, as any first command "
                         "over a config does; the timed runs load it without the schema check.")
    section.notes.append(breakdown(workdir, table, as_json))
    if max(table, as_json) > TARGET_S or os.environ.get("BENCH_PROFILE") == "1":
        prof = workdir.parent / "status.prof"
        slower = status_cmd(workdir) if table >= as_json else status_cmd(workdir, "--json")
        cmd = [PYTHON, "-m", "cProfile", "-o", str(prof), "-m", "waypost.cli", *slower[1:]]
        check(timed(cmd, cwd=workdir, keep_output=False), "profiled waypost status")
        total, _, ptable = profile_table(prof, top=12, ours=(str(REPO / "src" / "waypost") + "/",))
        section.notes.append(f"**Where the time goes** (`{' '.join(['waypost', *slower[1:2]] + slower[6:])}` "
                             f"under cProfile: {total:.1f} s; the profiler inflates Python-heavy code). "
                             "waypost's functions by cumulative time (nested rows overlap):\n\n" + ptable
                             + "\n\nBy time of their own (anyone's code):\n\n" + own_time_table(prof, top=10))
    return section


if __name__ == "__main__":
    ctx: dict = {}
    show(run(ctx), ctx)
