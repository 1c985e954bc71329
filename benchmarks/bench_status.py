"""`waypost status` on the state of a finished ~8,000-job run.

Reuses the planning benchmark's largest done tree (every output present and a
minimal valid SUCCESS ``_manifest.json`` in every stage directory), or builds
it when run alone. Times ``waypost status`` (the rich tables, output to a
file: 80 columns, as when piped) and ``waypost status --json``, alternately
with the baseline ``find ROOT -name _manifest.json | wc -l`` — the least any
reader of every manifest must do. Target: ≤ 1 s.

Run alone: ``.venv/bin/python benchmarks/bench_status.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BIN, PYTHON, REPO, Row, Section, build_done_tree, check, expected_jobs, interleaved,  # noqa: E402
                    log, median, profile_table, reference_config, timed, write_config)

TARGET_S = 1.0
REPETITIONS = 7


def status_cmd(workdir: Path, *extra: str) -> list[str]:
    return [str(BIN / "waypost"), "status", "--config", str(workdir / "config.yaml"),
            "--workflow", str(REPO / "workflow"), *extra]


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
                         f"(`manifest.build`); checked first: `waypost status --json` reports all "
                         f"{instances:,} stage directories done and `find` counts as many manifests.")
    if max(table, as_json) > TARGET_S or os.environ.get("BENCH_PROFILE") == "1":
        prof = workdir.parent / "status.prof"
        slower = status_cmd(workdir) if table >= as_json else status_cmd(workdir, "--json")
        cmd = [PYTHON, "-m", "cProfile", "-o", str(prof), "-m", "waypost.cli", *slower[1:]]
        check(timed(cmd, cwd=workdir, keep_output=False), "profiled waypost status")
        total, ours, ptable = profile_table(prof, top=12, ours=(str(REPO / "src" / "waypost") + "/",))
        section.notes.append(f"**Where the time goes** (`{' '.join(['waypost', *slower[1:2]] + slower[6:])}`, "
                             f"under cProfile: {total:.1f} s, {ours:.1f} s under waypost's entry points; "
                             f"the rest is interpreter start and imports):\n\n" + ptable)
    return section


if __name__ == "__main__":
    from common import fmt
    ctx: dict = {}
    result = run(ctx)
    for r in result.rows:
        print(f"{r.measure}: {fmt(r.value, r.unit)} vs {fmt(r.baseline, r.unit)}")
    for note in result.notes:
        print("\n" + note)
    for path in ctx.get("cleanup", []):
        shutil.rmtree(path, ignore_errors=True)
