"""A study over the config's grid, run by Snakemake (examples/param-study on
a small grid): each point runs with its own settings (grid values and
per-instance overrides, policies included), a per-point edit is drift that
`waypost plan` names and `rerun --instance` redoes, and every command takes
several instances and shell patterns, naming an unknown one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import LOCAL_PROFILE, REPO, planned, read_manifest, snakemake, write_config

EXAMPLE = REPO / "examples" / "param-study"
SNAKEFILE = EXAMPLE / "workflow" / "Snakefile"
POINTS = ["alpha1.0-cells20", "alpha1.0-cells30", "alpha1.0-cells40"]
BROKEN = "alpha1.0-cells40"   # its node dies at once, and its own policy allows one attempt


def study_config() -> dict:
    config = yaml.safe_load((EXAMPLE / "config" / "config.yaml").read_text())
    config["experiments"]["sweep"]["grid"] = {"alpha": [1.0], "cells": {"from": 20, "to": 40, "count": 3}}
    config["experiments"]["sweep"]["per_instance"] = {
        BROKEN: {"simulate": {"bad_node_after": 1, "policy": {"max_attempts": 1}}}}
    config["stages"]["simulate"]["t_end"] = 0.02
    config["stages"]["simulate"]["policy"]["runtime"] = 1   # minutes: no point runs out of time
    return config


def cli(work: Path, *args: str, config: str = "config.yaml", check: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "waypost.cli", args[0], "--config", str(work / config),
               "--workflow", str(EXAMPLE / "workflow"), *args[1:]]
    if args[0] == "plan" or "--drifted" in args:
        command[6:6] = ["--profile", str(LOCAL_PROFILE)]
    proc = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"waypost {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def stage_dir(work: Path, stage: str, instance: str | None = None) -> Path:
    path = work / "results" / "_all" / "sweep" / stage
    return path / instance if instance else path


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """The small study, run once; tests read it or copy it."""
    work = tmp_path_factory.mktemp("study")
    write_config(work, study_config())
    snakemake(work, snakefile=SNAKEFILE, check=False)   # (the broken point's extract is skipped)
    return work


@pytest.fixture
def study_copy(study, tmp_path) -> Path:
    target = tmp_path / "study"
    shutil.copytree(study, target, symlinks=True, copy_function=shutil.copy2)
    return target


def test_each_point_runs_with_its_own_settings(study):
    assert sorted(p.name for p in stage_dir(study, "simulate").iterdir()) == POINTS
    records = {point: read_manifest(stage_dir(study, "simulate", point)) for point in POINTS}
    assert records["alpha1.0-cells30"]["settings"] == {"alpha": 1.0, "cells": 30, "t_end": 0.02,
                                                       "checkpoint_every": 400, "bad_node_after": 0}
    assert "--alpha 1.0 --cells 30 --t-end 0.02" in records["alpha1.0-cells30"]["attempts"][0]["command"]
    assert len({r["config_hash"] for r in records.values()}) == 3   # a point's values are in its hash
    # the broken point's own settings and policy: one attempt, no rerun despite the cue
    broken = records[BROKEN]
    assert broken["settings"]["bad_node_after"] == 1
    assert [(a["action"], a["state"]) for a in broken["attempts"]] == [("cmd", "HWFAILURE")]
    assert "max_attempts (1) reached" in broken["attempts"][0]["decision"]["reason"]
    # data_extract takes SUCCESS, TIMEOUT and FAILED parents, not a HWFAILURE; the summary takes all
    assert read_manifest(stage_dir(study, "data_extract", BROKEN))["state"] == "SKIPPED"
    assert read_manifest(stage_dir(study, "data_extract", "alpha1.0-cells20"))["settings"] == {
        "alpha": 1.0, "cells": 20}
    assert "2/3 instances complete" in (stage_dir(study, "summary_report") / "summary.md").read_text()


def test_a_per_point_edit_is_drift_until_rerun_redoes_those_points(study_copy):
    work = study_copy
    before = planned(work, snakefile=SNAKEFILE)      # the broken point is rescheduled: that is all
    assert before == {"simulate": 1, "data_extract": 1, "summary_report": 1}
    config = study_config()
    config["experiments"]["sweep"]["per_instance"]["alpha1.0-cells[23]0"] = {"simulate": {"t_end": 0.01}}
    write_config(work, config)
    assert planned(work, snakefile=SNAKEFILE) == before   # presence mode: a done point stays done

    data = json.loads(cli(work, "plan", "--json").stdout)
    assert sorted((r["stage"], r["instance"], tuple(r["what"])) for r in data["drift"]) == [
        ("simulate", point, ("settings: t_end: 0.02 → 0.01",)) for point in POINTS[:2]]
    (group,) = data["drift_groups"]
    assert group["count"] == 2 and group["instances"] and group["pairs"] == ["_all"]
    text = cli(work, "plan", "--width", "200").stdout
    assert "simulate [alpha1.0-cells20, alpha1.0-cells30] ×2" in text and "settings: t_end: 0.02 → 0.01" in text
    only = json.loads(cli(work, "plan", "--json", "--instance", "alpha1.0-cells30").stdout)
    assert [r["instance"] for r in only["drift"]] == ["alpha1.0-cells30"]
    assert only["next_run"] == []   # the broken point's jobs are not this one's

    out = cli(work, "rerun", "simulate", "--instance", "alpha1.0-cells[23]0", "--downstream").stdout
    assert "5 stage(s) will be redone" in out   # two simulations, their extracts, the summary
    snakemake(work, snakefile=SNAKEFILE, check=False)
    for point in POINTS[:2]:
        record = read_manifest(stage_dir(work, "simulate", point))
        assert record["state"] == "SUCCESS" and record["settings"]["t_end"] == 0.01
        archived = json.loads((stage_dir(work, "simulate", point) / ".attempts/1/_manifest.json").read_text())
        assert archived["settings"]["t_end"] == 0.02   # the run before the edit, kept
    assert json.loads(cli(work, "plan", "--json").stdout)["drift"] == []


def test_rerun_drifted_redoes_what_plan_reports_and_only_that(study_copy):
    """Issue 56: ``waypost rerun --drifted`` archives the done stages that
    ``plan`` reports drifted (``-n``: lists them, with why, and changes
    nothing); the next run redoes them, and then nothing has drifted."""
    work = study_copy
    config = study_config()
    config["experiments"]["sweep"]["per_instance"]["alpha1.0-cells[23]0"] = {"simulate": {"t_end": 0.01}}
    write_config(work, config)

    listed = cli(work, "rerun", "--drifted", "-n").stdout
    for point in POINTS[:2]:
        assert f"results/_all/sweep/simulate/{point}: would be archived (drifted: settings: t_end: 0.02 → 0.01)" \
            in listed, listed
    assert "2 stage(s) would be redone" in listed and "cells40" not in listed
    assert not any(stage_dir(work, "simulate", p).joinpath(".attempts").exists() for p in POINTS)
    assert "nothing drifted" in cli(work, "rerun", "data_extract", "--drifted").stdout   # (of that stage)

    out = cli(work, "rerun", "--drifted", "--downstream").stdout
    assert "5 stage(s) will be redone" in out, out   # two simulations, their extracts, the summary
    snakemake(work, snakefile=SNAKEFILE, check=False)
    for point in POINTS[:2]:
        assert read_manifest(stage_dir(work, "simulate", point))["settings"]["t_end"] == 0.01
    assert json.loads(cli(work, "plan", "--json").stdout)["drift"] == []
    assert "nothing drifted" in cli(work, "rerun", "--drifted").stdout


def test_every_command_takes_several_instances_and_patterns(study):
    grid = json.loads(cli(study, "status", "--json", "--instance", "alpha1.0-cells20",
                          "--instance", "alpha1.0-cells4*").stdout)["experiments"]["sweep"]["_all"]
    assert set(grid) == {"simulate", "data_extract"}     # the funnel has no instances
    assert set(grid["simulate"]["instances"]) == {"alpha1.0-cells20", BROKEN}
    assert grid["simulate"]["state"] == "HWFAILURE" and grid["data_extract"]["state"] == "SKIPPED"
    attempts = cli(study, "status", "--attempts", "simulate", "--instance", BROKEN).stdout
    assert BROKEN in attempts and "alpha1.0-cells20" not in attempts

    rows = json.loads(cli(study, "find", "--json", "--no-archived", "--instance", "alpha1.0-cells20",
                          "--instance", "alpha1.0-cells30").stdout)
    assert sorted((r["stage"], r["instance"]) for r in rows) == sorted(
        (stage, point) for stage in ("simulate", "data_extract") for point in POINTS[:2])
    assert all(r["differs"] == [] for r in rows)   # compared with each point's own settings
    (row,) = json.loads(cli(study, "find", "--json", "--stage", "simulate/alpha1.0-cells30").stdout)
    assert (row["stage"], row["instance"]) == ("simulate", "alpha1.0-cells30")

    plan = json.loads(cli(study, "plan", "--json", "--instance", "alpha1.0-cells4?").stdout)
    assert sorted((r["stage"], tuple(r["instances"])) for r in plan["next_run"]) == [
        ("data_extract", (BROKEN,)), ("simulate", (BROKEN,))]

    out = cli(study, "rerun", "simulate", "-n", "--instance", "alpha1.0-cells20", "--instance", "alpha1.0-cells30").stdout
    assert "2 stage(s) would be redone" in out and BROKEN not in out
    out = cli(study, "retry", "simulate", "-n", "--instance", "alpha1.0-*").stdout
    assert f"{BROKEN}: HWFAILURE; would get a new count of series" in out and "1 stage(s) would be tried again" in out


@pytest.mark.parametrize("command", [("status",), ("find",), ("plan",), ("rerun", "simulate", "-n"),
                                     ("retry", "simulate", "-n")])
def test_an_unknown_instance_is_one_line_and_exit_2(study, command):
    proc = cli(study, *command, "--instance", "alpha1.0-cells20", "--instance", "alpha2.0-cells20", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # Each stage's own instances: those of the stage a command names, else of every stage that has some.
    points = "alpha1.0-cells20, alpha1.0-cells30, alpha1.0-cells40"
    listed = [f"simulate's instances: {points}"] + ([] if "simulate" in command
                                                     else [f"data_extract's instances: {points}"])
    assert proc.stderr.strip().startswith("waypost: unknown instance 'alpha2.0-cells20': not an instance of "
                                          f"experiment sweep ({'; '.join(listed)}; or a shell pattern, "
                                          "quoted)"), proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    # a pattern matching nothing is no error
    assert cli(study, *command, "--instance", "alpha2.0-*", check=False).returncode in (0, 1)
