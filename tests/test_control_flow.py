"""Control flow end to end: real failures (a step overrunning its runtime, a
step killed by SIGKILL, non-zero exits) steered by policies, funnels over
failed parents, and the next run rescheduling only what did not succeed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml
from conftest import REPO, SMALL_CONFIG, planned, read_manifest, snakemake, waypost, write_config

EXAMPLE = REPO / "examples" / "param-study"
EXAMPLE_SNAKEFILE = EXAMPLE / "workflow" / "Snakefile"


def study_config(**changes) -> dict:
    # Timing margins are wide so a loaded machine changes nothing: the 40- and
    # 150-cell points take ~0.1 s of their 6 s limit (a machine at load 11
    # once took more than 0.6 s), the 600-cell one ~8 s of its 0.6 s.
    config = yaml.safe_load((EXAMPLE / "config" / "config.yaml").read_text())
    config["experiments"]["sweep"]["grid"] = {"alpha": [1.0], "cells": [40, 150, 600]}
    roomy = {"runtime": 0.1}
    config["experiments"]["sweep"]["per_instance"] = {
        "alpha1.0-cells40": {"simulate": {"bad_node_after": 3, "policy": roomy}},
        "alpha1.0-cells150": {"simulate": {"bad_node_after": 1000, "policy": roomy}}}
    config["stages"]["simulate"]["policy"].update(runtime=0.01, max_attempts=10)
    for key, value in changes.items():
        config["stages"]["simulate"]["policy"][key] = value
    return config


def tree_state(root: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def sim_dir(work: Path, instance: str) -> Path:
    return work / "results" / "_all" / "sweep" / "simulate" / instance


def test_param_study_restarts_reruns_and_funnels(tmp_path):
    write_config(tmp_path, study_config())
    snakemake(tmp_path, snakefile=EXAMPLE_SNAKEFILE)

    # TIMEOUT → restart in place: the step counter continues from the checkpoint.
    slow = read_manifest(sim_dir(tmp_path, "alpha1.0-cells600"))
    assert slow["state"] == "SUCCESS"
    assert slow["attempts"][0]["state"] == "TIMEOUT" and slow["attempts"][0]["signal"] == 15
    assert {a["action"] for a in slow["attempts"][1:]} == {"restart"}
    second_log = (sim_dir(tmp_path, "alpha1.0-cells600") / slow["attempts"][1]["log"]).read_text()
    resumed_at = int(second_log.split("resuming from step ")[1].split("/")[0])
    assert resumed_at > 0
    assert slow["attempts"][1]["runtime_limit_s"] > slow["attempts"][0]["runtime_limit_s"]  # grows

    # HWFAILURE before any checkpoint → the check fails → rerun in a new workspace.
    early = read_manifest(sim_dir(tmp_path, "alpha1.0-cells40"))
    assert [(a["action"], a["state"]) for a in early["attempts"]] == [("cmd", "HWFAILURE"), ("rerun", "SUCCESS")]
    assert early["attempts"][0]["signal"] == 9 and early["attempts"][0]["checks"] == {"has_checkpoint": "FAILED"}
    archived = sim_dir(tmp_path, "alpha1.0-cells40") / ".attempts" / "1"
    assert (archived / "checkpoints").is_dir()  # the failed attempt's workspace, kept
    assert early["attempts"][0]["workspace"] == ".attempts/1"
    # The series' logs stay together in _logs/.
    assert "bad node" in (sim_dir(tmp_path, "alpha1.0-cells40") / early["attempts"][0]["log"]).read_text()

    # HWFAILURE after checkpoints → the check passes → restart from the checkpoint.
    late = read_manifest(sim_dir(tmp_path, "alpha1.0-cells150"))
    assert [(a["action"], a["state"]) for a in late["attempts"]] == [("cmd", "HWFAILURE"), ("restart", "SUCCESS")]
    assert late["attempts"][0]["checks"] == {"has_checkpoint": "SUCCESS"}
    assert "resuming from step 800" in (sim_dir(tmp_path, "alpha1.0-cells150") / "_logs/attempt-2.log").read_text()
    assert not (sim_dir(tmp_path, "alpha1.0-cells150") / ".attempts").exists()

    summary = (tmp_path / "results/_all/sweep/summary_report/summary.md").read_text()
    assert "3/3 instances complete" in summary


def test_param_study_max_attempts_then_funnel_then_next_run(tmp_path):
    config = study_config(max_attempts=2, runtime=0.004, runtime_growth=1)
    config["experiments"]["sweep"]["grid"]["cells"] = [40, 600]
    del config["experiments"]["sweep"]["per_instance"]["alpha1.0-cells150"]   # (not a point now)
    write_config(tmp_path, config)
    snakemake(tmp_path, snakefile=EXAMPLE_SNAKEFILE)  # data_extract accepts the failure: the run goes on

    big = read_manifest(sim_dir(tmp_path, "alpha1.0-cells600"))
    assert big["state"] == "TIMEOUT"
    assert [(a["action"], a["state"]) for a in big["attempts"]] == [("cmd", "TIMEOUT"), ("restart", "TIMEOUT")]
    assert "max_attempts (2) reached" in big["attempts"][-1]["decision"]["reason"]
    extract = json.loads((tmp_path / "results/_all/sweep/data_extract/alpha1.0-cells600/extract.json").read_text())
    assert extract["state"] == "TIMEOUT" and extract["complete"] is False and extract["steps"] > 0
    summary = (tmp_path / "results/_all/sweep/summary_report/summary.md").read_text()
    assert "1/2 instances complete" in summary and "TIMEOUT" in summary

    # The next run redoes exactly the unfinished instance and what read it.
    before = tree_state(tmp_path / "results")
    assert planned(tmp_path, snakefile=EXAMPLE_SNAKEFILE) == {"simulate": 1, "data_extract": 1, "summary_report": 1}
    assert tree_state(tmp_path / "results") == before, "a dry run changed files"

    config = study_config(max_attempts=8, runtime=0.05)
    config["experiments"]["sweep"]["grid"]["cells"] = [40, 600]
    del config["experiments"]["sweep"]["per_instance"]["alpha1.0-cells150"]   # (not a point now)
    write_config(tmp_path, config)
    snakemake(tmp_path, snakefile=EXAMPLE_SNAKEFILE)
    big = read_manifest(sim_dir(tmp_path, "alpha1.0-cells600"))
    assert big["state"] == "SUCCESS"
    assert {a["series"] for a in big["attempts"]} == {1, 2}  # the old series kept in the history
    # The policy decided how series 2 began: its restart cue over series 1's
    # last attempt (TIMEOUT) resumes from the checkpoints in place.
    first = next(a for a in big["attempts"] if a["series"] == 2)
    assert first["action"] == "restart" and "series 1's last attempt (TIMEOUT)" in first["why"], first
    assert "resuming from step" in (sim_dir(tmp_path, "alpha1.0-cells600") / first["log"]).read_text()
    assert not (sim_dir(tmp_path, "alpha1.0-cells600") / ".attempts").exists()
    assert "2/2 instances complete" in (tmp_path / "results/_all/sweep/summary_report/summary.md").read_text()
    assert planned(tmp_path, snakefile=EXAMPLE_SNAKEFILE) == {}


# The reference pipeline: one pair's student never finishes in time.
def failing_student_config() -> dict:
    config = copy.deepcopy(SMALL_CONFIG)
    config["policy"] = {"max_attempts": 1}
    config["stages"]["report"] = {"policy": {"depends": "all_done"}}
    config["stages"]["train_student"]["policy"] = {
        "max_attempts": 3, "cues": [{"action": "restart", "when": "any(cmd.TIMEOUT, cmd.PREEMPTED)"}]}
    # Each attempt runs out of its 0.6 s while writing a checkpoint per epoch
    # (the epochs never end): a loaded machine still reaches one to resume from.
    config["experiments"]["exp1"]["per_pair"] = {"en-xb": {"train_student": {
        "epochs": 1000, "policy": {"runtime": 0.01, "kill_grace": 1}}}}
    return config


def pipeline_stage(work: Path, pair: str, stage: str, instance: str | None = None) -> Path:
    path = work / "results" / pair / "exp1" / stage
    return path / instance if instance else path


def test_reference_funnel_over_a_failed_pair_and_the_next_run(tmp_path):
    write_config(tmp_path, failing_student_config())
    proc = snakemake(tmp_path, check=False)
    # export needs the student and no funnel takes its place: Snakemake reports it.
    assert proc.returncode != 0

    student = read_manifest(pipeline_stage(tmp_path, "en-xb", "train_student"))
    assert student["state"] == "TIMEOUT"
    assert [a["action"] for a in student["attempts"]] == ["cmd", "restart", "restart"]
    logs = [(pipeline_stage(tmp_path, "en-xb", "train_student") / a["log"]).read_text() for a in student["attempts"]]
    assert "resuming from epoch" in logs[1] and "resuming from epoch" in logs[2]

    evaluated = read_manifest(pipeline_stage(tmp_path, "en-xb", "evaluate", "student"))
    assert evaluated["state"] == "SKIPPED" and "train_student is TIMEOUT" in evaluated["reason"]
    assert read_manifest(pipeline_stage(tmp_path, "en-xb", "export"))["state"] == "SKIPPED"
    assert not (pipeline_stage(tmp_path, "en-xb", "export") / "package.tar.gz").exists()
    # en-xa is untouched by en-xb's failure.
    assert read_manifest(pipeline_stage(tmp_path, "en-xa", "export"))["state"] == "SUCCESS"

    report = (tmp_path / "results/_all/exp1/report/report.md").read_text()
    row = next(line for line in report.splitlines() if "en-xb" in line and "student" in line)
    assert "failed: train_student TIMEOUT (3 attempts)" in row
    assert read_manifest(tmp_path / "results/_all/exp1/report")["provisional"] is True

    grid = json.loads(waypost(tmp_path, "status", "--json").stdout)["experiments"]["exp1"]
    assert grid["en-xb"]["train_student"]["state"] == "TIMEOUT"
    assert grid["en-xb"]["evaluate"]["instances"]["student"]["state"] == "SKIPPED"
    attempts = waypost(tmp_path, "status", "--attempts", "train_student", "--pair", "en-xb").stdout
    assert "restart" in attempts and "TIMEOUT" in attempts

    # Next run: only the failed, skipped and provisional stages; a dry run changes nothing.
    before = tree_state(tmp_path / "results")
    assert planned(tmp_path) == {"train_student": 1, "evaluate": 1, "export": 1, "report": 1}
    assert tree_state(tmp_path / "results") == before

    fixed = failing_student_config()
    del fixed["experiments"]["exp1"]["per_pair"]
    write_config(tmp_path, fixed)
    snakemake(tmp_path)
    student = read_manifest(pipeline_stage(tmp_path, "en-xb", "train_student"))
    assert student["state"] == "SUCCESS" and student["attempts"][-1]["series"] == 2
    # Series 2 began as the restart cue says for a TIMEOUT: from series 1's checkpoints, in place.
    resumed = next(a for a in student["attempts"] if a["series"] == 2)
    assert resumed["action"] == "restart" and "series 1's last attempt (TIMEOUT)" in resumed["why"]
    assert "resuming from epoch" in (pipeline_stage(tmp_path, "en-xb", "train_student") / resumed["log"]).read_text()
    assert (pipeline_stage(tmp_path, "en-xb", "train_student") / "_logs/attempt-3.log").exists()
    report = (tmp_path / "results/_all/exp1/report/report.md").read_text()
    assert "failed:" not in report and "0 failed or missing" in report
    assert read_manifest(tmp_path / "results/_all/exp1/report")["provisional"] is False
    assert planned(tmp_path) == {}


def test_bad_condition_fails_before_any_job(tmp_path):
    config = failing_student_config()
    config["stages"]["train_student"]["policy"]["cues"].append({"action": "rerun", "when": "any(cmd.FAILED, fixed.SUCCESS)"})
    write_config(tmp_path, config)
    proc = snakemake(tmp_path, check=False)
    assert proc.returncode != 0
    assert "policy of stage train_student" in proc.stderr and "unknown name 'fixed'" in proc.stderr
    assert not (tmp_path / "results").exists()
