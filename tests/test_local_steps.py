"""The local step server (``waypost.scheduler.stepserver``): on the local
executor, Snakemake's main process hands each step to one server process
that forks its runner. A step sees what it would if Snakemake's ``shell``
had started its runner: the same environment, directory, umask, threads
variables and ``tmpdir``, side by side with plain Snakemake; it goes
through the server unless ``WAYPOST_STEP_SERVER=off``; the server ends
with the run; a step killed by a signal fails as in plain Snakemake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LOCAL_PROFILE, one_rule_plain, one_rule_waypost

# What the step reports of its world: one line of JSON. ``runner``: the
# command line of its runner (its shell's parent), which a runner forked by
# the server has from the server (``launch.py --serve``).
PROBE = (
    "python3 -c 'import json, os, sys; ppid = int(open(\"/proc/%d/stat\" % os.getppid()).read().split()[3]); "
    "print(json.dumps({{\"cwd\": os.getcwd(), \"umask\": oct(os.umask(0)), "
    "\"var\": os.environ.get(\"WAYPOST_TEST_VAR\"), \"omp\": os.environ.get(\"OMP_NUM_THREADS\"), "
    "\"tmpdir\": os.environ.get(\"TMPDIR\"), "
    "\"runner\": open(\"/proc/%d/cmdline\" % ppid).read().replace(chr(0), \" \")}}))' > {output.seen}"
)


def _rule(output: str) -> str:
    return (f"rule look:\n    output: seen={output}\n    threads: 2\n    resources: tmpdir='/tmp/waypost-probe'\n"
            f"    shell: {json.dumps(PROBE)}\n")


def _waypost(workdir: Path) -> Path:
    return one_rule_waypost(workdir, _rule('wp.out("seen.json")'))


def _plain(workdir: Path) -> Path:
    return one_rule_plain(workdir, _rule('"out/seen.json"'), '"out/seen.json"')


def _run(workdir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "WAYPOST_TEST_VAR": "from-the-shell", **env}
    return subprocess.run(["bash", "-c", 'umask 027 && exec "$@"', "-", sys.executable, "-m", "snakemake",
                           "-s", "workflow/Snakefile", "--cores", "2", *args],
                          cwd=workdir, env=environ, capture_output=True, text=True, timeout=300)


def _seen(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_step_sees_what_plain_snakemake_gives_a_job(tmp_path):
    plain = _plain(tmp_path / "plain")
    waypost = _waypost(tmp_path / "waypost")
    done = _run(plain)
    assert done.returncode == 0, done.stderr
    done = _run(waypost, "--profile", str(LOCAL_PROFILE))
    assert done.returncode == 0, done.stderr
    theirs, ours = _seen(plain / "out/seen.json"), _seen(waypost / "results/_all/e1/look/seen.json")
    assert "--serve" in ours.pop("runner")   # through the server
    theirs.pop("runner")
    assert ours == {**theirs, "cwd": str(waypost)}
    assert theirs["cwd"] == str(plain) and theirs["umask"] == "0o27" and theirs["var"] == "from-the-shell"
    assert theirs["omp"] == "2" and theirs["tmpdir"] == "/tmp/waypost-probe"
    record = json.loads((waypost / "results/_all/e1/look/_manifest.json").read_text())
    assert record["state"] == "SUCCESS"


def test_off_starts_each_runner_from_snakemake(tmp_path):
    waypost = _waypost(tmp_path / "waypost")
    done = _run(waypost, "--profile", str(LOCAL_PROFILE), WAYPOST_STEP_SERVER="off")
    assert done.returncode == 0, done.stderr
    seen = _seen(waypost / "results/_all/e1/look/seen.json")
    assert "--serve" not in seen["runner"] and "waypost/runner/launch.py" in seen["runner"]
    assert seen["umask"] == "0o27" and seen["omp"] == "2"


def test_the_server_ends_with_the_run(tmp_path):
    waypost = _waypost(tmp_path / "waypost")
    marker = f"--serve-probe-{os.getpid()}"
    done = _run(waypost, "--profile", str(LOCAL_PROFILE), WAYPOST_TEST_VAR=marker)
    assert done.returncode == 0, done.stderr
    left = subprocess.run(["pgrep", "-f", "waypost/runner/launch.py --serve"], capture_output=True, text=True)
    for pid in left.stdout.split():   # (another test's run may have one: only this run's must be gone)
        environ = Path(f"/proc/{pid}/environ")
        if environ.exists():
            assert marker.encode() not in environ.read_bytes()


# (the runner is the step's shell's parent: ``$PPID`` in the step's script)
@pytest.mark.parametrize("command", ["touch {output.seen} && exit 3", "touch {output.seen} && kill -TERM $$",
                                     "touch {output.seen} && kill -KILL $PPID"],
                         ids=["exit-3", "step-killed", "runner-killed"])
def test_a_failing_step_fails_as_without_the_server(tmp_path, command):
    """However the step ends, Snakemake says what it says when the runner is
    its own process: the same command, the same status or signal, no
    traceback."""
    said = {}
    for server in ("on", "off"):
        workdir = _waypost(tmp_path / server)
        snakefile = workdir / "workflow" / "Snakefile"
        snakefile.write_text(snakefile.read_text().replace(json.dumps(PROBE), json.dumps(command)))
        done = _run(workdir, "--profile", str(LOCAL_PROFILE), WAYPOST_STEP_SERVER=server)
        assert done.returncode != 0
        assert "Traceback" not in done.stderr and 'File "' not in done.stderr, done.stderr
        (line,) = [x for x in done.stderr.splitlines() if x.startswith("Command '")]
        said[server] = line
    assert said["on"] == said["off"]
    assert command.replace("{output.seen}", "results/_all/e1/look/seen.json") in said["on"]
    if "KILL $PPID" in command:
        assert said["on"].endswith("died with <Signals.SIGKILL: 9>."), said
