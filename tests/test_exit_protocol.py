"""A Merlin-style exit-code protocol, end to end with real Snakemake runs:
cues on `cmd.exit` and `CHECK.exit`, a restart command with the job's
placeholders, a workspace per cue (`rerun:`), and a wait before the next
attempt (`delay:`, `attempt_delay`), held by the runner with its heartbeat."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RUNNER, read_manifest, step_input
from test_series import tiny_pipeline

from waypost.model import config as wconfig
from waypost.model import manifest

# A solver that says by its exit status what comes next (Merlin's way):
# 100 restart from its checkpoint, 101 retry from a clean workspace, 104 a
# bad node (a new workspace), 102 a soft failure, 103 a hard one.
SOLVER = r'''#!/bin/bash
point=$1; grid=$2; out=$3; ws=$WAYPOST_STAGE_DIR
echo "attempt $WAYPOST_ATTEMPT ($WAYPOST_ACTION) of $point"
case "$point:$WAYPOST_ATTEMPT" in
  p3:1) echo torn > "$ws/torn.ckpt"; exit 101 ;;
  p3:2) test ! -e "$ws/torn.ckpt" || exit 9; echo sound > "$ws/sound.ckpt"; exit 100 ;;
  p5:1) echo half > "$ws/half.ckpt"; exit 104 ;;
  p7:*) exit 102 ;;
  p8:*) exit 103 ;;
esac
cat "$grid" > "$out"
'''

SNAKEFILE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


def points(experiment):
    return POINTS


rule relax:
    input: mesh="meshes/base.txt"
    output: field=wp.out("field.txt", instances=points)
    params: tol="5e-4"
    threads: 3
    shell: "bash solver.sh {wildcards.instance} {input.mesh} {output.field}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''

# The restart command: the job's placeholders, as the rule's command has them.
RESTART = ("printf '%s\\n' {input.mesh} {output.field} {wildcards.instance} {params.tol} {threads} "
           "> $WAYPOST_STAGE_DIR/restart-args.txt && test -e $WAYPOST_STAGE_DIR/sound.ckpt "
           "&& cat {input.mesh} > {output.field}")


def protocol_policy(**more) -> dict:
    return {
        "max_attempts": 4, "max_series": 1, "rerun": "dirty", "attempt_delay": 1, "restart": RESTART,
        "checks": {"probe": 'test -e "$WAYPOST_STAGE_DIR/sound.ckpt"'},
        "cues": [
            {"action": "restart", "when": "all(cmd.exit == 100, probe.exit == 0)"},
            {"action": "rerun", "when": "cmd.exit == 101", "rerun": "clean", "delay": 3},
            {"action": "rerun", "when": "any(cmd.exit == 104, cmd.HWFAILURE)", "rerun": "new"},
            {"action": "fail", "when": "cmd.exit == 102"},
            {"action": "give_up", "when": "cmd.exit == 103"},
        ], **more}


def study(work: Path, points: list[str], policy: dict | None = None):
    (work / "meshes").mkdir()
    (work / "meshes" / "base.txt").write_text("mesh 64x64\n")
    (work / "solver.sh").write_text(SOLVER)
    return tiny_pipeline(work, SNAKEFILE.replace("POINTS", repr(points)), {"root": "results", "experiments": {"e": {}},
                                           "stages": {"relax": {"policy": policy or protocol_policy()}}})


def point_dir(work: Path, point: str) -> Path:
    return work / "results" / "_all" / "e" / "relax" / point


def gap(earlier: dict, later: dict) -> float:
    return manifest.iso_to_epoch(later["start"]) - manifest.iso_to_epoch(earlier["end"])


def test_a_merlin_style_step_steered_by_its_exit_codes(tmp_path):
    run = study(tmp_path, ["p3", "p5"])
    done = run("--cores", "3")
    assert done.returncode == 0, done.stderr[-4000:]

    # p3: RETRY (101) → a rerun in a clean workspace after 3 s; RESTART (100)
    # with a checkpoint (probe.exit == 0) → the restart command, after the
    # policy's 1 s; then SUCCESS with its result.
    p3 = read_manifest(point_dir(tmp_path, "p3"))
    attempts = p3["attempts"]
    assert p3["state"] == "SUCCESS"
    assert [(a["action"], a["state"], a["exit_code"]) for a in attempts] == [
        ("cmd", "FAILED", 101), ("rerun", "FAILED", 100), ("restart", "SUCCESS", 0)]
    assert [a["check_exit_codes"] for a in attempts] == [{"probe": 1}, {"probe": 0}, {"probe": 0}]
    assert attempts[0]["decision"] == {"action": "rerun", "reason": "cue 2 (rerun when cmd.exit == 101)",
                                       "rerun": "clean", "delay_s": 3}
    assert attempts[1]["decision"] == {"action": "restart",
                                       "reason": "cue 1 (restart when all(cmd.exit == 100, probe.exit == 0))",
                                       "delay_s": 1}
    assert gap(attempts[0], attempts[1]) >= 3 and gap(attempts[1], attempts[2]) >= 1
    stage = point_dir(tmp_path, "p3")
    assert not (stage / "torn.ckpt").exists() and (stage / "sound.ckpt").exists()   # cleaned, then kept
    assert not (stage / ".attempts").exists()
    # The restart command ran with the job's values.
    field = "results/_all/e/relax/p3/field.txt"
    assert (stage / "restart-args.txt").read_text().split("\n") == ["meshes/base.txt", field, "p3", "5e-4", "3", ""]
    assert (stage / "field.txt").read_text() == "mesh 64x64\n"
    assert "{" not in (stage / attempts[2]["script"]).read_text()
    assert attempts[2]["command"].startswith("printf '%s\\n' meshes/base.txt " + field + " p3 5e-4 3 >")

    # p5: a bad node (104) → a rerun in a new workspace: the old one archived.
    p5 = read_manifest(point_dir(tmp_path, "p5"))
    assert [(a["action"], a["state"], a["exit_code"]) for a in p5["attempts"]] == [
        ("cmd", "FAILED", 104), ("rerun", "SUCCESS", 0)]
    assert p5["attempts"][0]["decision"]["rerun"] == "new" and p5["attempts"][0]["decision"]["delay_s"] == 1
    assert (point_dir(tmp_path, "p5") / ".attempts" / "1" / "half.ckpt").read_text() == "half\n"
    assert not (point_dir(tmp_path, "p5") / "half.ckpt").exists()
    assert gap(*p5["attempts"]) >= 1
    assert "waypost: e/relax/p3: waiting 3 s before the next attempt" in done.stderr


def test_soft_and_hard_failures_by_exit_code_wait_for_nothing(tmp_path):
    run = study(tmp_path, ["p7", "p8"], protocol_policy(max_series=3, attempt_delay=30))
    started = time.monotonic()
    done = run("--cores", "2")
    assert done.returncode != 0
    assert time.monotonic() - started < 25, "a series that ends waits for no next attempt"
    soft, hard = read_manifest(point_dir(tmp_path, "p7")), read_manifest(point_dir(tmp_path, "p8"))
    assert soft["attempts"][-1]["decision"] == {"action": "fail", "reason": "cue 4 (fail when cmd.exit == 102)"}
    assert not soft.get("given_up")                     # SOFT_FAIL: the next run tries again
    assert hard["given_up"] and "cue 5 (give_up when cmd.exit == 103)" in hard["reason"]   # HARD_FAIL


def test_a_restart_placeholder_the_job_lacks_is_one_line(tmp_path):
    policy = protocol_policy(restart="run-again {params.tolerance} {wildcards.instance}")
    run = study(tmp_path, ["p3"], policy)
    done = run("--cores", "1")
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "stage relax: policy.restart: 'run-again {params.tolerance} {wildcards.instance}'" in text, text[-3000:]
    assert "Traceback" not in text
    assert not (point_dir(tmp_path, "p3") / "_manifest.json").exists()   # no attempt ran


def test_the_runner_keeps_its_heartbeat_while_it_waits_and_a_signal_ends_the_wait(tmp_path):
    stage = tmp_path / "st"
    policy = {"max_attempts": 3, "cues": [{"action": "restart", "when": "cmd.exit == 75", "delay": 30}]}
    step = step_input(stage, "exit 75", policy=policy)
    env = {**os.environ, "WAYPOST_HEARTBEAT_SECONDS": "0.5"}
    proc = subprocess.Popen(RUNNER, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=False)
    proc.stdin.write(step)
    proc.stdin.close()
    marker = stage / "_running.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if marker.exists() and json.loads(marker.read_text())["attempts"][0].get("decision"):
            break
        time.sleep(0.1)
    assert marker.exists(), "the runner wrote no running marker in 60 s"
    first = json.loads(marker.read_text())
    assert first["attempts"][0]["decision"]["delay_s"] == 30 and first.get("step_group") is None
    beat = marker.stat().st_mtime
    # (beats every 0.5 s: waited for up to 10 s, so a loaded machine's slow beat is not taken for none)
    deadline = time.monotonic() + 10
    while marker.stat().st_mtime <= beat and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.stat().st_mtime > beat, "no heartbeat during the wait"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 75
    stderr = proc.stderr.read().decode()
    data = read_manifest(stage)
    assert [a["action"] for a in data["attempts"]] == ["cmd"], stderr
    # Cancelled from outside (cancelled: resume): the series is not over;
    # the next run goes on with the restart the wait was for.
    assert data["state"] == "CANCELLED" and not data.get("given_up")
    assert data["goes_on"]["action"] == "restart" and data["goes_on"]["reason"].startswith(
        "cancelled from outside during the 30 s wait before the next attempt")
    assert not marker.exists()
    again = subprocess.run(RUNNER, input=step_input(stage, "exit 0", policy=policy), capture_output=True,
                           env={**os.environ, manifest.RUN_ID_ENV: "a-later-run"})
    assert again.returncode == 0, again.stderr
    data = read_manifest(stage)
    assert [(a["series"], a["action"], a["state"]) for a in data["attempts"]] == [
        (1, "cmd", "FAILED"), (1, "restart", "SUCCESS")]


@pytest.mark.parametrize("policy, message", [
    ({"attempt_delay": -3}, "stages.relax.policy.attempt_delay: -3 is less than the minimum of 0"),
    ({"attempt_delay": "soon"}, "stages.relax.policy.attempt_delay: expected number"),
    ({"cues": [{"action": "rerun", "when": "cmd.exit == 3", "delay": -1}]},
     "stages.relax.policy.cues[0].delay: -1 is less than the minimum of 0"),
    ({"cues": [{"action": "rerun", "when": "cmd.exit == 3", "rerun": "fresh"}]},
     "stages.relax.policy.cues[0].rerun: 'fresh' is not one of"),
    ({"cues": [{"action": "rerun", "when": "cmd.exit == x"}]},
     "policy of stage relax (experiment e): cues[0].when: 'cmd.exit == x': expected a whole number after cmd.exit =="),
    ({"cues": [{"action": "give_up", "when": "cmd.exit == 3", "delay": 4}]},
     "cues[0].delay: the wait before the next attempt, and this cue's action (give_up) starts none"),
])
def test_config_errors_name_the_key(policy, message):
    with pytest.raises(wconfig.ConfigError) as err:
        wconfig.prepare({"root": "results", "experiments": {"e": {}}, "stages": {"relax": {"policy": policy}}},
                        "/nowhere", "test.yaml", stages=["relax"])
    assert message in str(err.value)
