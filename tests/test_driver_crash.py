"""A driver crash is not the step's failure (issue 41, point 5): a real
Snakemake driver on the local profile, SIGKILLed as a process group mid-step
(a terminal closed, the OOM killer, a node restarted), leaves an attempt whose
runner vanished. The next run goes on with the same series in place, from
the step's checkpoints, and never counts it. A real cancel (Ctrl-C: SIGINT to
the driver's process group, which the runner passes to the step and
records) still ends the series as the policy says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LOCAL_PROFILE, read_manifest, step_input
from test_cron import cron

from waypost.model import manifest

# A relaxation that writes a checkpoint per sweep and resumes from the
# latest one; it says where it began, and its place in the series.
ANNEALER = r'''
import glob, os, sys, time
result, sweeps = sys.argv[1], int(sys.argv[2])
saves = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.environ["WAYPOST_STAGE_DIR"], "saves")
os.makedirs(saves, exist_ok=True)
found = sorted(int(p.rsplit("-", 1)[1]) for p in glob.glob(os.path.join(saves, "sweep-*")))
first = found[-1] if found else 0
print(f"begins at sweep {first}; series attempt {os.environ['WAYPOST_SERIES_ATTEMPT']}", flush=True)
for sweep in range(first + 1, sweeps + 1):
    time.sleep(0.15)
    with open(os.path.join(saves, f"sweep-{sweep}"), "w") as f:
        f.write(f"{sweep}\n")
with open(result, "w") as f:
    f.write(f"annealed in {sweeps} sweeps\n")
'''

SNAKEFILE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule anneal:
    output: energy=wp.out("energy.txt")
    shell: "{python} {annealer} {{output.energy}} 60"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def study(work: Path, policy: dict) -> Path:
    (work / "annealer.py").write_text(ANNEALER)
    (work / "flow").mkdir()
    (work / "flow" / "Snakefile").write_text(SNAKEFILE.format(python=sys.executable, annealer=work / "annealer.py"))
    (work / "config.yaml").write_text(json.dumps({"root": "out", "experiments": {"lattice": {}},
                                                  "stages": {"anneal": {"policy": policy}}}))
    return work / "out" / "_all" / "lattice" / "anneal"


def drive_until_saved(work: Path, stage: Path, sweeps: int = 6) -> subprocess.Popen:
    """A driver, in a session of its own (as a terminal starts one), once
    its step has saved ``sweeps`` checkpoints."""
    driver = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "-s", str(work / "flow" / "Snakefile"), "-d", str(work),
         "--profile", str(LOCAL_PROFILE), "--configfile", str(work / "config.yaml")],
        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while len(list((stage / "saves").glob("sweep-*"))) < sweeps:
        if time.time() > deadline or driver.poll() is not None:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
            raise AssertionError("the step never saved its checkpoints")
        time.sleep(0.05)
    return driver


def next_run(work: Path) -> subprocess.CompletedProcess:
    out = cron(work, snakefile=work / "flow" / "Snakefile", workflow=work / "flow")
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_a_killed_driver_leaves_its_series_to_go_on_in_place_from_the_checkpoints(tmp_path):
    # One series only: before, the next run found it spent and gave the stage up.
    stage = study(tmp_path, {"max_series": 1})
    driver = drive_until_saved(tmp_path, stage)
    os.killpg(driver.pid, signal.SIGKILL)   # Snakemake and the runner at once
    driver.wait(timeout=30)
    saved = len(list((stage / "saves").glob("sweep-*")))

    next_run(tmp_path)
    record = read_manifest(stage)
    assert record["state"] == "SUCCESS" and not record.get("given_up")
    first, second = record["attempts"]
    assert (first["series"], first["action"], first["state"], first["interrupted_by"]) == \
        (1, "cmd", "CANCELLED", "runner gone")
    assert first["decision"]["action"] == "restart" and "goes on in place" in first["decision"]["reason"]
    # How long it ran: until its last sign of work (its checkpoints, ~0.15 s apart), not 0.
    assert first["duration_s"] >= 0.15 * (saved - 1) and first["end"] <= second["start"], first
    assert (second["series"], second["action"], second["state"]) == (1, "restart", "SUCCESS")
    # It went on from its checkpoints, in place (nothing archived), and the
    # vanished attempt was not counted: this is the series' first.
    log = (stage / second["log"]).read_text()
    began = int(log.split("begins at sweep ")[1].split(";")[0])
    assert began >= saved - 1 and began >= 5, log
    assert "series attempt 1" in log
    assert not (stage / ".attempts").exists()
    assert (stage / "energy.txt").read_text() == "annealed in 60 sweeps\n"


def test_a_cancel_keeps_the_work_and_the_next_run_goes_on_in_place(tmp_path):
    """Issue 56: Ctrl-C (SIGINT to the driver's process group, which the
    runner passes to the step and records) is not the step's failure. The
    stage is recorded CANCELLED, never given up for it, even with
    ``max_series: 1``; the next run goes on with the same series in place,
    from the step's checkpoints, that attempt not counted."""
    stage = study(tmp_path, {"max_series": 1})
    driver = drive_until_saved(tmp_path, stage)
    os.killpg(driver.pid, signal.SIGINT)   # Ctrl-C in the driver's terminal
    assert driver.wait(timeout=60) != 0
    record = read_manifest(stage)   # the runner recorded the cancel itself
    saved = len(list((stage / "saves").glob("sweep-*")))
    assert record["state"] == "CANCELLED" and not record.get("given_up"), record
    assert record["attempts"][0]["interrupted_by"] == "cancelled"
    assert record["goes_on"]["series"] == 1 and "not the step's failure" in record["goes_on"]["reason"]

    next_run(tmp_path)
    record = read_manifest(stage)
    assert record["state"] == "SUCCESS" and "goes_on" not in record
    assert [(a["series"], a["action"], a["state"]) for a in record["attempts"]] == [
        (1, "cmd", "CANCELLED"), (1, "restart", "SUCCESS")]
    log = (stage / record["attempts"][1]["log"]).read_text()
    assert int(log.split("begins at sweep ")[1].split(";")[0]) >= saved - 1 and "series attempt 1" in log
    assert not (stage / ".attempts").exists()


def test_a_cancel_ends_the_series_when_the_policy_says_so(tmp_path):
    stage = study(tmp_path, {"max_series": 2, "cancelled": "end"})
    driver = drive_until_saved(tmp_path, stage)
    os.killpg(driver.pid, signal.SIGINT)
    assert driver.wait(timeout=60) != 0
    record = read_manifest(stage)
    assert record["state"] == "CANCELLED" and "interrupted_by" not in record["attempts"][0]

    next_run(tmp_path)
    record = read_manifest(stage)
    assert record["state"] == "SUCCESS"
    assert [(a["series"], a["action"], a["state"]) for a in record["attempts"]] == [
        (1, "cmd", "CANCELLED"), (2, "restart", "SUCCESS")]
    # A cancel is not the step's failure: with no cue, the next series
    # resumes its work in place (a new workspace is what a cue asks for).
    assert "resumes in place" in record["attempts"][1]["why"]
    assert not (stage / ".attempts").exists()
    assert "begins at sweep 0" not in (stage / record["attempts"][1]["log"]).read_text()


def test_runner_gone_cancel_keeps_the_old_way(tmp_path):
    stage = study(tmp_path, {"max_series": 2, "runner_gone": "cancel"})
    driver = drive_until_saved(tmp_path, stage)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)

    next_run(tmp_path)
    record = read_manifest(stage)
    # The vanished runner's series ends CANCELLED (counted), and the next
    # series resumes its work in place.
    assert [(a["series"], a["action"], a["state"]) for a in record["attempts"]] == [
        (1, "cmd", "CANCELLED"), (2, "restart", "SUCCESS")]
    assert "interrupted_by" not in record["attempts"][0]
    assert not (stage / ".attempts").exists()


def vanished_runner_marker(stage: Path, attempts: list[dict]) -> None:
    """The ``_running.json`` a runner leaves that was SIGKILLed mid-attempt:
    its pid long gone (this test's own child, reaped)."""
    pid = subprocess.Popen(["true"])
    pid.wait()
    stage.mkdir(parents=True, exist_ok=True)
    (stage / "_running.json").write_text(json.dumps({
        "schema": 1, "pid": pid.pid, "host": manifest.hostname(), "run": "an-earlier-run", "series": 1,
        "series_base": 0, "outputs": ["energy.txt"], "slurm_job_id": None, "attempts": attempts}))


def attempt(number: int, state: str | None, **extra) -> dict:
    return {"number": number, "series": 1, "action": "cmd" if number == 1 else "restart", "state": state,
            "exit_code": None, "signal": None, "checks": {}, "decision": None, "start": manifest.now_iso(),
            "end": None, "duration_s": None, "host": manifest.hostname(), "run": "an-earlier-run",
            "slurm_job_id": None, "runtime_limit_s": None, "command": "anneal", "workspace": ".",
            "log": f"_logs/attempt-{number}.log", "worker": {"pool": None, "class": None}, **extra}


def run_step(stage: Path, policy: dict) -> subprocess.CompletedProcess:
    data = step_input(stage, f"echo done > {stage}/energy.txt", outputs=[stage / "energy.txt"], policy=policy)
    return subprocess.run([sys.executable, "-m", "waypost.runner"], input=data, capture_output=True, cwd=stage,
                          env={**os.environ, "WAYPOST_RUN_ID": "a-later-run"})


def test_a_step_whose_runner_keeps_vanishing_ends_its_series_after_three(tmp_path):
    """Runners that vanish again and again (a step that kills its own): the
    series goes on after three in a row, and the fourth ends it as a cancel."""
    stage = tmp_path / "anneal"
    (stage / "saves").mkdir(parents=True)
    gone = {"interrupted_by": "runner gone", "error": "the runner was killed during this attempt",
            "decision": {"action": "restart", "reason": "its runner was gone"}}
    vanished_runner_marker(stage, [attempt(1, "CANCELLED", **gone), attempt(2, "CANCELLED", **gone),
                                   attempt(3, "CANCELLED", **gone), attempt(4, None)])
    done = run_step(stage, {"max_series": 1})
    assert done.returncode != 0
    record = read_manifest(stage)
    assert record["state"] == "CANCELLED" and record["given_up"]
    assert "interrupted_by" not in record["attempts"][-1] and len(record["attempts"]) == 4

    # Two in a row: the series goes on, with a restart over what is there.
    stage = tmp_path / "again"
    (stage / "saves").mkdir(parents=True)
    vanished_runner_marker(stage, [attempt(1, "CANCELLED", **gone), attempt(2, None)])
    done = run_step(stage, {"max_series": 1})
    assert done.returncode == 0, done.stderr
    record = read_manifest(stage)
    assert [(a["action"], a["state"], a.get("interrupted_by")) for a in record["attempts"]] == [
        ("cmd", "CANCELLED", "runner gone"), ("restart", "CANCELLED", "runner gone"),
        ("restart", "SUCCESS", None)]

    # Nothing of the step's in the workspace: the step's command, not a restart.
    stage = tmp_path / "bare"
    vanished_runner_marker(stage, [attempt(1, None)])
    done = run_step(stage, {"max_series": 1, "restart": "false"})
    assert done.returncode == 0, done.stderr
    assert [a["action"] for a in read_manifest(stage)["attempts"]] == ["cmd", "cmd"]


OWN_SNAKEFILE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule anneal:
    output: "energy.txt"
    shell: "{python} {annealer} {{output}} 60 saves"

wp.finish()
'''


def own_layout_study(work: Path) -> Path:
    """The same step in a rule of its own layout: its output in the working
    directory, its checkpoints beside it; the record's directory is returned."""
    (work / "annealer.py").write_text(ANNEALER)
    (work / "flow").mkdir()
    (work / "flow" / "Snakefile").write_text(OWN_SNAKEFILE.format(python=sys.executable,
                                                                 annealer=work / "annealer.py"))
    (work / "config.yaml").write_text("{}\n")   # (no waypost key: the records under .waypost/)
    return work / ".waypost" / "records" / "_all" / "default" / "anneal"


def orphaned_success(work: Path, own_layout: bool) -> tuple[Path, Path]:
    """The driver alone killed (the OOM killer's shape) mid-step: its runner
    lives on and records SUCCESS, and Snakemake's incomplete marker for the
    job stays. The job's record directory and its output."""
    record = own_layout_study(work) if own_layout else study(work, {"max_series": 1})
    driver = drive_until_saved(work, work if own_layout else record, sweeps=2)
    os.kill(driver.pid, signal.SIGKILL)   # the driver alone: the runner goes on
    driver.wait(timeout=30)
    deadline = time.time() + 120
    while not (record / "_manifest.json").exists() or read_manifest(record)["state"] != "SUCCESS":
        assert time.time() < deadline, "the orphaned runner never finished"
        time.sleep(0.1)
    assert list((work / ".snakemake" / "incomplete").iterdir()), "Snakemake's marker is there"
    return record, work / "energy.txt" if own_layout else record / "energy.txt"


@pytest.mark.parametrize("own_layout", [False, True], ids=["stage", "own-layout"])
def test_a_success_its_orphaned_runner_recorded_is_taken_not_redone(tmp_path, own_layout):
    """Issue 56: the next run (``rerun-incomplete``) would force the job
    Snakemake marked incomplete; its SUCCESS, recorded after the mark, is
    true and is taken as it is: not archived, not redone, its record and
    outputs untouched."""
    record, made = orphaned_success(tmp_path, own_layout)
    done, output = read_manifest(record), made.stat()

    next_run(tmp_path)
    assert read_manifest(record) == done
    assert not (record / ".attempts").exists()
    assert made.read_text() == "annealed in 60 sweeps\n" and made.stat().st_mtime_ns == output.st_mtime_ns


def test_a_job_marked_incomplete_after_its_record_is_redone(tmp_path):
    """The other side: a SUCCESS whose series began before Snakemake marked
    the job incomplete (a later run started the job again and died with it,
    before its step began) is not the end of that job: the next run redoes
    it, as plain Snakemake does. (The mark's time, as Snakemake reads it,
    moved past the record's.)"""
    record, made = orphaned_success(tmp_path, own_layout=False)
    later = time.time() + 5
    for mark in (tmp_path / ".snakemake" / "incomplete").rglob("*"):
        if mark.is_file():
            os.utime(mark, (later, later))
    done = read_manifest(record)

    next_run(tmp_path)
    again = read_manifest(record)
    assert again["state"] == "SUCCESS" and again["created"] != done["created"]
    assert [a["series"] for a in again["attempts"]][-1] == 2
    assert made.read_text() == "annealed in 60 sweeps\n"
