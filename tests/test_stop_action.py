"""A ``stop`` cue ends the whole run (issue 56; Merlin's ``STOP_WORKERS`` and
``HARD_FAIL``): the stage's series ends as ``fail`` does, and no new job
starts in this run; the running ones finish. It is recorded
(``stopped_run``) and ``waypost status`` shows it. The next run goes on.
Real Snakemake runs on the local profile, which keeps going past failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import read_manifest
from test_series import tiny_pipeline

from waypost.model import manifest

# A step that exits 105 for its stop point, else sleeps a little and makes
# its field; a funnel that accepts any end of its parents (all_done), so only
# the stop keeps it from running.
SOLVER = r'''#!/bin/bash
case "$1" in
  stop) echo "the node is unusable" >&2; exit 105 ;;
esac
sleep 1
echo "field of $1" > "$2"
'''

SNAKEFILE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


def points(experiment):
    return POINTS


rule relax:
    output: field=wp.out("field.txt", instances=points)
    shell: "bash solver.sh {wildcards.instance} {output.field}"


rule summary:
    input: fields=wp.each("relax", "field.txt")
    output: report=wp.out("summary.txt")
    shell: "echo $(ls {input.fields} | wc -l) fields > {output.report}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''

POLICY = {"relax": {"policy": {"cues": [{"action": "stop", "when": "cmd.exit == 105"}]}},
          "summary": {"policy": {"depends": "all_done"}}}


def study(work: Path, points: list[str]):
    (work / "solver.sh").write_text(SOLVER)
    return tiny_pipeline(work, SNAKEFILE.replace("POINTS", repr(points)),
                         {"root": "results", "experiments": {"e": {}}, "stages": POLICY})


def stage(work: Path, name: str, point: str | None = None) -> Path:
    path = work / "results" / "_all" / "e" / name
    return path / point if point else path


def test_a_stop_cue_ends_the_run_and_the_next_run_goes_on(tmp_path):
    points = ["a1", "stop", "a2", "a3", "a4"]
    run = study(tmp_path, points)
    done = run("--cores", "1")
    assert done.returncode != 0
    stopped = read_manifest(stage(tmp_path, "relax", "stop"))
    assert stopped["state"] == "FAILED" and not stopped.get("given_up")
    assert stopped["stopped_run"] == "cue 1 (stop when cmd.exit == 105)"
    assert stopped["attempts"][-1]["decision"]["action"] == "stop"
    assert "stopped the run" in stopped["reason"]
    assert "e/relax/stop stopped the run (cue 1 (stop when cmd.exit == 105)): no new job starts in this run" \
        in done.stderr, done.stderr[-3000:]
    # No job started after the stop: every point that ran began before the
    # stop point's attempt ended (Snakemake picks the order: the stop point
    # may run last), and the funnel (it accepts failed parents: keep-going
    # alone would have run it) never ran.
    ended = manifest.iso_to_epoch(stopped["attempts"][-1]["end"])
    for point in set(points) - {"stop"}:
        if (stage(tmp_path, "relax", point) / "_manifest.json").exists():
            began = read_manifest(stage(tmp_path, "relax", point))["attempts"][0]["start"]
            assert manifest.iso_to_epoch(began) <= ended, point
    assert not (stage(tmp_path, "summary") / "_manifest.json").exists()

    status = subprocess.run([sys.executable, "-m", "waypost.cli", "status", "--json", "--config",
                             "config/config.yaml", "--workflow", "workflow"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    failed = subprocess.run([sys.executable, "-m", "waypost.cli", "status", "--failed", "--config",
                             "config/config.yaml", "--workflow", "workflow"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert "stopped the run" in failed.stdout, failed.stdout
    assert json.loads(status.stdout)

    # The next run (the step fixed) goes on with the rest.
    (tmp_path / "solver.sh").write_text(SOLVER.replace("exit 105", "true"))
    again = run("--cores", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_manifest(stage(tmp_path, "summary"))["state"] == "SUCCESS"
    assert all(read_manifest(stage(tmp_path, "relax", p))["state"] == "SUCCESS" for p in points)
