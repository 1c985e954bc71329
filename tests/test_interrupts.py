"""Kills in the middle of a step: nothing looks done that isn't, the next run
redoes the work, and the interrupted workspace is archived, not deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import LOCAL_PROFILE, SNAKEFILE, planned, snakemake, waypost, write_config

# One pair, a backward model that trains for long enough to be killed.
LONG = {
    "experiments": {"exp1": {"pairs": ["en-xa"], "teachers": 1}},
    "stages": {"fetch_corpus": {"sentences": 3000, "mono": 100, "test": 50},
               "train_backward": {"epochs": 400}},
}


def start_run(workdir: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), "--profile",
           str(LOCAL_PROFILE), "--configfile", str(workdir / "config.yaml"), "--until", "train_backward"]
    return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def wait_for_checkpoint(stage: Path, timeout: float = 120) -> dict:
    """Wait until the step has written a checkpoint; return its _running.json."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list((stage / "checkpoints").glob("epoch-*.json")) and (stage / "_running.json").exists():
            return json.loads((stage / "_running.json").read_text())
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint in {stage} after {timeout}s")


def children(pid: int) -> list[int]:
    """The runner's children: its step's shell (not its watchdog, which is
    no part of the step)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    watchdogs = subprocess.run(["pgrep", "-P", str(pid), "-x", "waypost-watch"], capture_output=True,
                               text=True).stdout
    return [int(x) for x in out.split() if x not in watchdogs.split()]


def finish_quickly(workdir: Path, **policy) -> None:
    config = json.loads(json.dumps(LONG))
    config["stages"]["train_backward"]["epochs"] = 2
    if policy:
        config["stages"]["train_backward"]["policy"] = policy
    write_config(workdir, config)


def test_sigkill_of_the_step_is_recorded_and_resumed_in_place(tmp_path):
    write_config(tmp_path, LONG)
    stage = tmp_path / "results/en-xa/exp1/train_backward"
    run = start_run(tmp_path)
    try:
        running = wait_for_checkpoint(stage)
        (step,) = children(running["pid"])
        os.kill(step, signal.SIGKILL)
        assert run.wait(timeout=120) != 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    record = json.loads((stage / "_manifest.json").read_text())
    assert record["state"] == "HWFAILURE" and record["attempts"][-1]["signal"] == signal.SIGKILL
    assert not (stage / "model.json").exists()

    finish_quickly(tmp_path)
    assert planned(tmp_path, "--until", "train_backward") == {"train_backward": 1}
    snakemake(tmp_path, "--until", "train_backward")
    record = json.loads((stage / "_manifest.json").read_text())
    assert record["state"] == "SUCCESS"
    # The step was killed, it did not fail: the next series resumes it in
    # place from its checkpoints (a new workspace is what a policy asks for).
    assert [(a["action"], a["state"]) for a in record["attempts"]] == [("cmd", "HWFAILURE"), ("restart", "SUCCESS")]
    assert not (stage / ".attempts").exists()
    assert list((stage / "checkpoints").glob("epoch-*.json")), "the checkpoints stay where the step left them"
    assert "resum" in (stage / "_logs" / "attempt-2.log").read_text()


def test_sigkill_of_snakemake_itself_leaves_nothing_that_looks_done(tmp_path):
    # The series a vanished runner left ends (runner_gone: cancel; going on
    # in the same series, the default: test_driver_crash), and the next
    # resumes its work in place.
    config = json.loads(json.dumps(LONG))
    config["stages"]["train_backward"]["policy"] = {"runner_gone": "cancel"}
    write_config(tmp_path, config)
    stage = tmp_path / "results/en-xa/exp1/train_backward"
    run = start_run(tmp_path)
    try:
        running = wait_for_checkpoint(stage)
        step = children(running["pid"])
        os.killpg(run.pid, signal.SIGKILL)  # snakemake and the runner, at once
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    # The step dies with its runner; it must not go on to write the model.
    deadline = time.time() + 10
    while step and any(Path(f"/proc/{p}").exists() for p in step) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert not (stage / "model.json").exists()
    assert not (stage / "_manifest.json").exists()
    cell = json.loads(waypost(tmp_path, "status", "--json").stdout)["experiments"]["exp1"]["en-xa"]
    assert cell["train_backward"]["state"] == "interrupted"

    finish_quickly(tmp_path, runner_gone="cancel")
    # Snakemake's own lock outlives a SIGKILL (`waypost cron` clears it when
    # its owner is dead); by hand it is `--unlock`. Its incomplete markers are
    # handled by the profile's rerun-incomplete.
    snakemake(tmp_path, "--unlock")
    assert planned(tmp_path, "--until", "train_backward") == {"train_backward": 1}
    snakemake(tmp_path, "--until", "train_backward")
    record = json.loads((stage / "_manifest.json").read_text())
    assert record["state"] == "SUCCESS"
    # The cancelled series ended, counted; the next resumes in place (a
    # cancel keeps the work: a new workspace is what a cue asks for).
    assert [(a["series"], a["action"], a["state"]) for a in record["attempts"]] == [
        (1, "cmd", "CANCELLED"), (2, "restart", "SUCCESS")]
    assert not (stage / ".attempts").exists()
    assert list((stage / "checkpoints").glob("epoch-*.json"))
