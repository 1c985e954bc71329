"""The step runner on its own: manifests, outcomes, archiving, signals."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RUNNER, step_input

from waypost.model import manifest


def run_step(stage_dir: Path, command: str, outputs=(), inputs=(), policy=None, **kw) -> subprocess.CompletedProcess:
    fields = {"settings": {"k": 1}, "config_hash": "h", "code_version": "v"}
    if policy is not None:
        fields["policy"] = json.loads(policy)
    step = step_input(stage_dir, command, outputs, inputs, **fields)
    proc = subprocess.run(RUNNER, input=step, capture_output=True, **kw)
    proc.stdout, proc.stderr = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    return proc


def sh(script: str) -> str:
    return script


def test_success_writes_manifest_with_checksums(tmp_path):
    stage = tmp_path / "p/e/s"
    out = stage / "out.txt"
    proc = run_step(stage, sh(f"echo hello; printf data > {out}"), outputs=[out])
    assert proc.returncode == 0, proc.stderr
    data = manifest.read(str(stage))
    assert data["state"] == "SUCCESS"
    # crc32c as GCS lists it: base64 of the big-endian CRC32C (of b"data")
    assert data["outputs"] == [{"path": "out.txt", "size": 4, "sha256": manifest.sha256_file(str(out)),
                                "crc32c": "rth90Q=="}]
    assert data["settings"] == {"k": 1} and data["config_hash"] == "h" and data["code_version"] == "v"
    (attempt,) = data["attempts"]
    assert attempt["state"] == "SUCCESS" and attempt["exit_code"] == 0 and attempt["number"] == 1
    assert "hello" in (stage / attempt["log"]).read_text()
    assert "hello" in proc.stderr  # teed to the job's own log too
    assert not (stage / "_running.json").exists()


def test_failure_keeps_exit_code_and_records_failed(tmp_path):
    stage = tmp_path / "p/e/s"
    proc = run_step(stage, sh("exit 3"), outputs=[stage / "out.txt"])
    assert proc.returncode == 3
    data = manifest.read(str(stage))
    assert data["state"] == "FAILED" and data["outputs"] == []
    assert data["attempts"][0]["exit_code"] == 3


def test_exit_zero_without_output_is_failed(tmp_path):
    stage = tmp_path / "p/e/s"
    proc = run_step(stage, "true", outputs=[stage / "out.txt"])
    assert proc.returncode != 0
    data = manifest.read(str(stage))
    assert data["state"] == "FAILED" and "did not write" in data["attempts"][0]["error"]


def test_killed_step_records_signal(tmp_path):
    stage = tmp_path / "p/e/s"
    proc = run_step(stage, sh("kill -9 $$"), outputs=[stage / "out.txt"])
    assert proc.returncode == 128 + 9
    attempt = manifest.read(str(stage))["attempts"][0]
    assert attempt["signal"] == 9 and attempt["exit_code"] is None and attempt["state"] == "HWFAILURE"


def test_terminated_runner_forwards_and_records_cancelled(tmp_path):
    stage = tmp_path / "p/e/s"
    proc = subprocess.Popen(RUNNER, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(step_input(stage, "sleep 30"))
    proc.stdin.close()
    deadline = time.time() + 10
    while not (stage / "_running.json").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) != 0
    data = manifest.read(str(stage))
    assert data["state"] == "CANCELLED" and data["attempts"][0]["signal"] == signal.SIGTERM


def test_rerun_archives_previous_workspace_and_keeps_history(tmp_path):
    stage = tmp_path / "p/e/s"
    out = stage / "out.txt"
    run_step(stage, sh(f"echo one > {out}; echo scratch > {stage}/notes"), outputs=[out])
    out.unlink()
    proc = run_step(stage, sh(f"echo two > {out}"), outputs=[out])
    assert proc.returncode == 0
    data = manifest.read(str(stage))
    assert [a["number"] for a in data["attempts"]] == [1, 2]
    assert data["attempts"][0]["workspace"] == os.path.join(".attempts", "1")
    archived = stage / ".attempts" / "1"
    assert (archived / "notes").read_text() == "scratch\n"
    assert json.loads((archived / "_manifest.json").read_text())["state"] == "SUCCESS"
    assert not (stage / "notes").exists()


def killed_mid_attempt(stage: Path, run_id: str) -> None:
    """A runner of run ``run_id`` killed with SIGKILL during its attempt (as
    by a node failure): its running record is left behind."""
    proc = subprocess.Popen(RUNNER, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, manifest.RUN_ID_ENV: run_id})
    proc.stdin.write(step_input(stage, f"echo partial > {stage}/partial; sleep 30"))
    proc.stdin.close()
    deadline = time.time() + 10
    while not (stage / "partial").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=20)
    assert (stage / "_running.json").exists()


def test_a_retry_within_the_run_goes_on_with_the_series(tmp_path):
    # Snakemake retrying the job (same run id): the series continues in the same workspace.
    stage = tmp_path / "p/e/s"
    killed_mid_attempt(stage, "run-1")
    out = stage / "out.txt"
    restart = json.dumps({"max_attempts": 2, "cues": [{"action": "restart", "when": "cmd.CANCELLED"}]})
    proc = run_step(stage, sh(f"cat {stage}/partial > {out}"), outputs=[out], policy=restart,
                    env={**os.environ, manifest.RUN_ID_ENV: "run-1"})
    assert proc.returncode == 0, proc.stderr
    data = manifest.read(str(stage))
    assert data["run"] == "run-1" and out.read_text() == "partial\n"
    assert [(a["series"], a["action"], a["state"], a["run"]) for a in data["attempts"]] == [
        (1, "cmd", "CANCELLED", "run-1"), (1, "restart", "SUCCESS", "run-1")]
    assert not (stage / ".attempts").exists()


def test_a_new_run_starts_a_new_series_and_archives_the_old_one(tmp_path):
    # (a series a vanished runner left ends: runner_gone: cancel; the default
    # goes on in place, see test_driver_crash.py; a new workspace is what a
    # cue asks for)
    stage = tmp_path / "p/e/s"
    killed_mid_attempt(stage, "run-1")
    out = stage / "out.txt"
    policy = {"runner_gone": "cancel", "cues": [{"action": "rerun", "when": "cmd.CANCELLED", "rerun": "new"}]}
    proc = run_step(stage, sh(f"test ! -e {stage}/partial && echo fresh > {out}"), outputs=[out],
                    policy=json.dumps(policy), env={**os.environ, manifest.RUN_ID_ENV: "run-2"})
    assert proc.returncode == 0, proc.stderr
    data = manifest.read(str(stage))
    assert [(a["series"], a["run"]) for a in data["attempts"]] == [(1, "run-1"), (2, "run-2")]
    assert (stage / ".attempts/1/partial").exists()


def test_a_new_run_resumes_a_cancelled_series_in_place_by_default(tmp_path):
    # A step cancelled from outside did not fail: with no cue, the next run's
    # series resumes it in place (its work kept), as plain Snakemake would.
    stage = tmp_path / "p/e/s"
    killed_mid_attempt(stage, "run-1")
    out = stage / "out.txt"
    proc = run_step(stage, sh(f"cat {stage}/partial > {out}"), outputs=[out],
                    policy=json.dumps({"runner_gone": "cancel"}), env={**os.environ, manifest.RUN_ID_ENV: "run-2"})
    assert proc.returncode == 0, proc.stderr
    data = manifest.read(str(stage))
    assert [(a["series"], a["action"], a["state"]) for a in data["attempts"]] == [
        (1, "cmd", "CANCELLED"), (2, "restart", "SUCCESS")]
    assert out.read_text() == "partial\n" and not (stage / ".attempts").exists()


def test_a_retry_of_a_series_the_policy_ended_does_not_run_it_again(tmp_path):
    stage = tmp_path / "p/e/s"
    out = stage / "out.txt"
    run_1 = {**os.environ, manifest.RUN_ID_ENV: "run-1"}
    assert run_step(stage, sh("exit 3"), outputs=[out], env=run_1).returncode == 3
    proc = run_step(stage, sh(f"echo again > {out}"), outputs=[out], env=run_1)
    assert proc.returncode == 3 and "already ended" in proc.stderr and not out.exists()
    # The next run (another id) starts over.
    proc = run_step(stage, sh(f"echo again > {out}"), outputs=[out], env={**os.environ, manifest.RUN_ID_ENV: "run-2"})
    assert proc.returncode == 0 and manifest.read(str(stage))["state"] == "SUCCESS"


def test_inputs_point_at_their_manifests(tmp_path):
    up = tmp_path / "p/e/up"
    run_step(up, sh(f"echo x > {up}/a.txt"), outputs=[up / "a.txt"])
    adopted = tmp_path / "p/e/hand"
    adopted.mkdir(parents=True)
    (adopted / "b.txt").write_text("by hand")
    down = tmp_path / "p/e/down"
    proc = run_step(down, sh(f"cat {up}/a.txt > {down}/c.txt"), outputs=[down / "c.txt"],
                    inputs=[up / "a.txt", adopted / "b.txt"])
    assert proc.returncode == 0
    inputs = manifest.read(str(down))["inputs"]
    assert inputs[0]["state"] == "SUCCESS" and inputs[0]["sha256"] == manifest.sha256_file(str(up / "a.txt"))
    assert inputs[0]["manifest"] == str(up / "_manifest.json")
    assert inputs[1]["state"] == "ADOPTED" and inputs[1]["manifest"] is None


def test_corrupt_manifest_is_archived_not_trusted(tmp_path):
    stage = tmp_path / "p/e/s"
    stage.mkdir(parents=True)
    (stage / "_manifest.json").write_text("{truncated")
    with pytest.raises(manifest.ManifestError):
        manifest.read(str(stage))
    out = stage / "out.txt"
    assert run_step(stage, sh(f"echo ok > {out}"), outputs=[out]).returncode == 0
    assert (stage / ".attempts/1/_manifest.json").read_text() == "{truncated"
    assert manifest.read(str(stage))["state"] == "SUCCESS"


def test_worker_env_reaches_the_step_and_the_manifest(tmp_path):
    stage = tmp_path / "p/e/s"
    out = stage / "env.txt"
    step = step_input(stage, f'echo "$GPUS|$WORKSPACE" > {out}', [out], pool="onprem", worker_class="gpu",
                      worker_env={"GPUS": "0", "WORKSPACE": 12000})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "SLURM_"))}
    env["CUDA_VISIBLE_DEVICES"] = "1,3"
    proc = subprocess.run(RUNNER, input=step, capture_output=True, env=env)
    assert proc.returncode == 0, proc.stderr
    worker = manifest.read(str(stage))["attempts"][0]["worker"]
    assert worker["pool"] == "onprem" and worker["class"] == "gpu"
    assert worker["GPUS"] == "1 3" and worker["GPUS_from"] == "CUDA_VISIBLE_DEVICES"
    # WORKSPACE: the declared 12000 MB, unless this machine has nvidia-smi.
    assert out.read_text().strip() == f"1 3|{worker['WORKSPACE']}"
    assert worker["WORKSPACE"] == 12000 or worker["WORKSPACE_from"] == "nvidia-smi"


def test_a_command_that_cannot_start_fails_with_127_and_says_why(tmp_path):
    stage = tmp_path / "p/e/s"
    proc = run_step(stage, "no-such-program-here x", outputs=[stage / "out.txt"])
    assert proc.returncode == 127
    assert "no-such-program-here: command not found" in proc.stderr   # the step's shell says why
    data = manifest.read(str(stage))
    assert data["state"] == "FAILED" and data["attempts"][0]["exit_code"] == 127
    assert "command not found" in (stage / data["attempts"][0]["log"]).read_text()
    assert not (stage / "_running.json").exists()


def test_a_shell_that_cannot_start_fails_with_127_and_says_why(tmp_path):
    stage = tmp_path / "p/e/s"
    step = step_input(stage, "true", [stage / "out.txt"], shell={"executable": "/no/such/shell"})
    proc = subprocess.run(RUNNER, input=step, capture_output=True)
    assert proc.returncode == 127
    assert b"cannot start '/no/such/shell'" in proc.stderr and b"No such file" in proc.stderr
    assert manifest.read(str(stage))["attempts"][0]["exit_code"] == 127


def test_the_step_gets_default_signal_dispositions_and_a_session_of_its_own(tmp_path):
    # Python ignores SIGPIPE; a step must not inherit that (`yes | head` would
    # then print "Broken pipe" and loop on errors instead of ending).
    stage = tmp_path / "p/e/s"
    out = stage / "out.txt"
    proc = run_step(stage, sh(f'set +o pipefail; yes | head -n1 > /dev/null; echo "${{PIPESTATUS[0]}} $(ps -o sid= -p $$)" > {out}'),
                    outputs=[out])
    assert proc.returncode == 0, proc.stderr
    status, session = out.read_text().split()
    assert status == str(128 + signal.SIGPIPE)
    assert int(session) not in (os.getsid(0), 0)   # its own session, not the test's


@pytest.mark.parametrize("grace", [0.5, 0])
def test_the_time_limit_terms_then_kills_a_step_that_ignores_sigterm(tmp_path, grace):
    stage = tmp_path / "p/e/s"
    policy = json.dumps({"runtime": 0.005, "kill_grace": grace})   # runtime in minutes: 0.3 s
    started = time.monotonic()
    proc = run_step(stage, sh("trap '' TERM; echo started; while :; do sleep 0.05; done"),
                    outputs=[stage / "out.txt"], policy=policy, timeout=60)
    elapsed = time.monotonic() - started
    attempt = manifest.read(str(stage))["attempts"][0]
    assert attempt["state"] == "TIMEOUT" and attempt["signal"] == signal.SIGKILL
    assert "started" in (stage / attempt["log"]).read_text()
    assert proc.returncode == 128 + signal.SIGKILL
    assert elapsed < 10


def test_the_step_spec_is_one_typed_record_read_back_as_written():
    from waypost.model import spec
    step = spec.StepSpec("echo {x} | cat\nline two", stage_dir="d", experiment="e", pair="p", stage="s",
                         inputs=["a", "b"], outputs=["o"], tolerated=True, policy={"max_attempts": 2})
    back = spec.read(spec.write(step))
    assert back.fields() == step.fields() and back.command == step.command
    assert back.shell == spec.DEFAULT_SHELL and back.reuse_from is None and back.worker_env == {}
    # A scope's part is encoded once, each job's own part joined to it.
    line = spec.extend(spec.encode({"stage": "s", "experiment": "e"}),
                       {"stage_dir": "d", "pair": "p", "inputs": ["x"]})
    assert spec.decode(line).inputs == ["x"] and "\n" not in line


@pytest.mark.parametrize(("line", "says"), [
    ("not json", "not JSON"),
    ('{"stage": "s"}', "'waypost_step' version"),
    ('{"waypost_step": 99, "stage": "s"}', "version 99"),
    ('{"waypost_step": 1, "stage": "s", "experiment": "e", "pair": "p"}', "'stage_dir' is missing"),
    ('{"waypost_step": 1, "stage": "s", "experiment": "e", "pair": "p", "stage_dir": "d", "inputs": "a"}',
     "'inputs' is str, expected list"),
    ('{"waypost_step": 1, "stage": "s", "experiment": "e", "pair": "p", "stage_dir": "d", "oops": 1}',
     "unknown field(s) oops"),
])
def test_a_bad_step_spec_is_one_clear_line(line, says):
    proc = subprocess.run(RUNNER, input=(line + "\ntrue\n").encode(), capture_output=True, text=False)
    assert proc.returncode == 1
    assert says in proc.stderr.decode() and b"Traceback" not in proc.stderr


def test_runner_usage_and_help_are_human(tmp_path):
    helped = subprocess.run([*RUNNER, "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "standard input" in helped.stdout and "--lost-slurm-job" in helped.stdout
    nothing = subprocess.run(RUNNER, input="", capture_output=True, text=True)
    assert nothing.returncode == 1 and "no step on standard input" in nothing.stderr
    wrong = subprocess.run([*RUNNER, "--no-such-option"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unrecognized arguments" in wrong.stderr
    spec_file = tmp_path / "step"
    spec_file.write_bytes(step_input(tmp_path / "p/e/s", f"echo ok > {tmp_path}/o", [tmp_path / "o"]))
    assert subprocess.run([*RUNNER, "--spec", str(spec_file)], capture_output=True).returncode == 0


def test_a_series_whose_step_succeeded_is_finished_not_rerun_after_the_job_ended(tmp_path):
    # Slurm ended the job (its time limit) after the step succeeded, while
    # the runner hashed the outputs and wrote the manifest: what is left is
    # the running record with the ended attempt and its decision, and the
    # outputs. The next runner (another run) finishes the series.
    stage = tmp_path / "p/e/s"
    out = stage / "out.txt"
    assert run_step(stage, f"echo first > {out}", outputs=[out]).returncode == 0
    record = manifest.read(str(stage))
    gone = subprocess.Popen(["true"])
    gone.wait()
    (stage / "_running.json").write_text(json.dumps({
        "pid": gone.pid, "host": manifest.hostname(), "run": record["run"], "series": 1, "series_base": 0,
        "outputs": ["out.txt"], "slurm_job_id": None, "attempts": record["attempts"]}))
    (stage / "_manifest.json").unlink()
    proc = run_step(stage, f"echo again > {out}", outputs=[out], env={**os.environ, manifest.RUN_ID_ENV: "run-2"})
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "first\n"                      # not run again
    finished = manifest.read(str(stage))
    assert finished["state"] == "SUCCESS" and len(finished["attempts"]) == 1
    assert finished["outputs"][0]["sha256"] == manifest.sha256_file(str(out))
    assert not (stage / "_running.json").exists() and not (stage / ".attempts").exists()


def test_each_line_the_runner_says_is_one_write(tmp_path):
    # Local steps run side by side share the run's stderr: a line written in
    # two pieces (its text, then its newline) let another runner's line in
    # between ("... ended SUCCESSwaypost: ... ended SUCCESS").
    if shutil.which("strace") is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI=true: this test must run, but strace is not installed (`make test` installs it as root)")
        pytest.skip("needs strace (to see the runner's writes; `make test` installs it as root)")
    stage = tmp_path / "p/e/s"
    out = stage / "out.txt"
    step = step_input(stage, f"printf data > {out}", [out], settings={}, config_hash="h", code_version="v")
    trace = tmp_path / "trace"
    proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=write", "-s", "4096", "-o", str(trace), *RUNNER],
                          input=step, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"attempt 1 (cmd) ended SUCCESS\n" in proc.stderr
    writes = re.findall(r'write\(2, "((?:[^"\\]|\\.)*)"', trace.read_text())
    said = [w for w in writes if "waypost: " in w or w == "\\n"]
    assert any("ended SUCCESS" in w for w in said), writes
    assert all(w.startswith("waypost: ") and w.endswith("\\n") for w in said), said


def _watch_the_log(stage: Path, scratch: Path, gate: Path):
    """Run a step with a check in ``stage`` (its scratch files in
    ``scratch``), until it said something and waits at ``gate``: yields
    (the log, what ``scratch`` holds then); the step then goes on to its end."""
    out = stage / "result.txt"
    step = step_input(stage, f"echo said-early; until [ -e {gate} ]; do sleep 0.05; done; echo late > {out}",
                      [out], policy={"checks": {"looked": "echo looked-at-it"}})
    runner = subprocess.Popen(RUNNER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "TMPDIR": str(scratch), "WAYPOST_HEARTBEAT_SECONDS": "0.3"})
    runner.stdin.write(step)
    runner.stdin.close()
    log = stage / "_logs" / "attempt-1.log"
    try:
        deadline = time.time() + 30
        while not (log.exists() and "said-early" in log.read_text()) and time.time() < deadline:
            time.sleep(0.05)
        assert "said-early" in log.read_text()   # there while the step is still at work
        assert runner.poll() is None
        yield log, sorted(p.name for p in scratch.iterdir())
    finally:
        gate.touch()
        assert runner.wait(timeout=60) == 0, runner.stderr.read().decode()
    text = log.read_text()
    assert text.index("said-early") < text.index("waypost: check looked: echo looked-at-it") \
        < text.index("looked-at-it\nwaypost: check looked: SUCCESS")
    assert list(scratch.iterdir()) == []
    assert manifest.read(str(stage))["attempts"][0]["checks"] == {"looked": "SUCCESS"}


def test_on_disk_the_log_grows_in_the_stage_directory(tmp_path):
    """Where the root can append (disk, NFS), the attempt's log is the file
    the step's output is appended to as it comes (``tail -f`` works): the
    same file from start to end, checks and all, and no scratch copy."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    watching = _watch_the_log(tmp_path / "q/r/t", scratch, tmp_path / "gate")
    log, scratch_files = next(watching)
    assert scratch_files == []
    live = log.stat().st_ino
    next(watching, None)
    assert log.stat().st_ino == live


def test_on_a_mount_the_log_is_written_whole_at_the_start_at_each_heartbeat_and_at_the_end(mount_root, tmp_path):
    """On a bucket mount (rclone, cache off: a file can't be appended to
    there) the attempt's log grows in $TMPDIR and is written whole into the
    stage directory: there, empty, from the start; with what the step said
    by the next heartbeat while it runs; all of it, the checks' lines too, at
    the end (a new file each time); no scratch file left."""
    _, path = mount_root
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    watching = _watch_the_log(path / "q/r/t", scratch, tmp_path / "gate")
    _, scratch_files = next(watching)
    assert [name.endswith("-attempt-1.log") for name in scratch_files] == [True]
    # To the end, checks and all: an append there would be refused (EPERM),
    # so the log holding every line (``_watch_the_log``) was written whole.
    next(watching, None)
