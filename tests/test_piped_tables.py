"""The CLI's tables piped (a file, a cron log, ``| grep``) with no COLUMNS
(issue 38): no terminal says how wide, and rich took 80 columns, cutting
long stage names to ``…`` and folding cells a few characters a line. Piped,
a table is as wide as it is: a row a line. A real run of a workflow with
long names, a stage with checks that timed out and was restarted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_series import tiny_pipeline

SURVEY = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow, axis="site")


rule download_raw_observations_from_archive:
    output: raw=wp.out("raw.txt")
    shell: "echo {wildcards.site} > {output.raw}"


rule calibrate_instrument_response_per_station:
    input: raw=wp.stage("download_raw_observations_from_archive", "raw.txt")
    output: cal=wp.out("cal.txt")
    shell: "test {wildcards.site} != observatory-east-coast || sleep 30; cat {input.raw} > {output.cal}"


rule summarize_every_station_into_one_catalogue:
    input: cals=wp.each("calibrate_instrument_response_per_station", "cal.txt")
    output: out=wp.out("catalogue.txt", funnel=True)
    shell: "cat {input.cals} > {output.out}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''

SITES = ["observatory-north-ridge", "observatory-south-valley", "observatory-east-coast"]
STAGES = ["download_raw_observations_from_archive", "calibrate_instrument_response_per_station",
          "summarize_every_station_into_one_catalogue"]
CHECKS = "calibration_within_tolerance:FAILED residuals_written:FAILED"
CONFIG = {
    "root": "results",
    "experiments": {"baseline-calibration-2024": {"sites": SITES}},
    "stages": {"calibrate_instrument_response_per_station": {"policy": {
        "max_attempts": 3, "runtime": 0.02, "runtime_growth": 1.0,
        "checks": {"calibration_within_tolerance": 'test -s "$WAYPOST_STAGE_DIR/cal.txt"',
                   "residuals_written": 'test -e "$WAYPOST_STAGE_DIR/residuals.txt"'},
        "cues": [{"action": "restart", "when": "cmd.TIMEOUT"}]}}},
}


@pytest.fixture(scope="module")
def survey(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("survey")
    run = tiny_pipeline(workdir, SURVEY, CONFIG)
    assert run().returncode != 0   # the east coast timed out three times
    return workdir


def piped(workdir: Path, *args: str, columns: str | None = None) -> str:
    """``waypost ARGS`` with stdout a pipe, neither stdin nor stderr a
    terminal (rich would take their width), and COLUMNS only if given."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update({"COLUMNS": columns} if columns else {})
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", *args], cwd=workdir, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def rows(out: str) -> list[str]:
    """A table's lines of cells (its heading's too)."""
    return [line for line in out.splitlines() if line.startswith(("│", "┃"))]


def test_the_status_grid_piped_has_a_line_per_stage_and_every_name_whole(survey):
    out = piped(survey, "status")
    assert "…" not in out
    heading, *cells = rows(out)
    assert all(site in heading for site in SITES), out   # one column a site, its heading on one line
    assert len(cells) == len(STAGES), out
    for stage, line in zip(STAGES, cells):
        assert stage in line, out
    assert "timeout ×3" in cells[1]


def test_the_attempts_piped_have_a_line_each_with_their_checks_whole(survey):
    out = piped(survey, "status", "--attempts", "calibrate_instrument_response_per_station",
                "--site", "observatory-east-coast")
    heading, *attempts = rows(out)
    assert heading.split() == ["┃", "#", "┃", "action", "┃", "state", "┃", "exit", "┃", "checks", "┃", "secs",
                               "┃", "limit", "┃", "next", "┃", "log", "┃"]
    assert len(attempts) == 3, out
    for number, line in enumerate(attempts, 1):
        assert f" {number} " in line and CHECKS in line and f"_logs/attempt-{number}.log" in line, out


def test_the_plan_piped_has_a_line_per_stage(survey):
    out = piped(survey, "plan")
    lines = [line for line in rows(out) if "baseline-calibration-2024" in line]
    assert len(lines) == 2, out
    assert STAGES[1] in lines[0] and "observatory-east-coast" in lines[0], out
    assert STAGES[2] in lines[1], out


def test_columns_still_sets_the_width_when_piped(survey):
    out = piped(survey, "status", "--attempts", "calibrate_instrument_response_per_station",
                "--site", "observatory-east-coast", columns="90")
    assert max(map(len, out.splitlines())) <= 90
    assert CHECKS not in out   # folded to fit, as asked
    # (the grid plans for the room it is given: too narrow for a column a site, it counts them by state)
    assert "3 sites, by state" in piped(survey, "status", columns="90")
