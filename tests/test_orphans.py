"""A driver killed on a workstation (issue 38, point 6): the step dies with
its runner, whatever shape its processes take, and the next attempt never
runs beside a live one. Real Snakemake drivers on the local profile, killed
as a process group (a terminal or ssh session gone, the OOM killer), real
programs writing ticks into their stage directory."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LOCAL_PROFILE, read_manifest
from test_cron import cron

# A simulation: every 50 ms it opens its stage directory's ``ticks.log`` by
# path (as a program writing checkpoints does) and the test's ledger, and
# writes who it is and when. Its first attempt runs for ten minutes, later
# ones for a moment; it catches SIGTERM to say so, and then stops (or, with
# a file ``stubborn`` beside the ledger, ignores it).
TICKER = r'''
import os, signal, sys, time
ledger, output = sys.argv[1], sys.argv[2]
stage, attempt = os.environ["WAYPOST_STAGE_DIR"], os.environ["WAYPOST_ATTEMPT"]
def stop(*_):
    with open(ledger, "a") as f:
        f.write(f"{attempt} {os.getpid()} {time.time()} TERM\n")
    sys.exit(143)
stubborn = os.path.exists(os.path.join(os.path.dirname(ledger), "stubborn"))
signal.signal(signal.SIGTERM, signal.SIG_IGN if stubborn else stop)
end = time.time() + (600 if attempt == "1" else 1.0)
while time.time() < end:
    line = f"{attempt} {os.getpid()} {time.time()}\n"
    for path in (os.path.join(stage, "ticks.log"), ledger):
        with open(path, "a") as f:
            f.write(line)
    time.sleep(0.05)
with open(output, "w") as f:
    f.write("done\n")
'''

# The shapes a step's processes take: the program under a pipeline, as a
# background job, as a Python program's child, under a nested shell.
SHAPES = {
    "pipeline": "{sim} | cat",
    "background": "{sim} & wait",
    "python_child": "{py} -c 'import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))' {sim}",
    "nested_bash": "bash -c '{sim}; exit $?'",
}

SNAKEFILE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule sweep:
    output: result=wp.out("result.txt")
    shell: {command!r}

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def study(workdir: Path, shape: str, grace: float = 2) -> Path:
    """A one-stage study whose step runs the ticker in ``shape``; its stage dir.
    Its policy ends a series whose runner vanished (``runner_gone: cancel``):
    the next attempt starts in a new workspace, so what each attempt wrote
    stays apart (the default, going on in place: test_driver_crash)."""
    (workdir / "ticker.py").write_text(TICKER)
    sim = f"{sys.executable} {workdir / 'ticker.py'} {workdir / 'ledger.txt'} {{output.result}}"
    (workdir / "workflow").mkdir()
    (workdir / "workflow" / "Snakefile").write_text(
        SNAKEFILE.format(command=SHAPES[shape].format(sim=sim, py=sys.executable)))
    (workdir / "config.yaml").write_text(
        "root: results\nexperiments:\n  trial: {}\n"
        f"stages:\n  sweep:\n    policy: {{kill_grace: {grace}, runner_gone: cancel}}\n")
    return workdir / "results" / "_all" / "trial" / "sweep"


def start_driver(workdir: Path) -> subprocess.Popen:
    """A Snakemake driver in a session of its own, as a terminal starts one."""
    return subprocess.Popen(
        [sys.executable, "-m", "snakemake", "-s", str(workdir / "workflow" / "Snakefile"), "-d", str(workdir),
         "--profile", str(LOCAL_PROFILE), "--configfile", str(workdir / "config.yaml")],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def ticks(workdir: Path) -> list[tuple[str, int, float]]:
    ledger = workdir / "ledger.txt"
    if not ledger.exists():
        return []
    return [(a, int(p), float(t)) for a, p, t, *_ in (line.split() for line in ledger.read_text().splitlines())]


def wait_for(what, timeout: float, why: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(why)


def step_processes(stage: Path) -> list[int]:
    """Live processes of a step of ``stage``: they carry its directory in
    their environment (``$WAYPOST_STAGE_DIR``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = dict(v.partition(b"=")[::2] for v in f.read().split(b"\0"))
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        named = environ.get(b"WAYPOST_STAGE_DIR")
        if named and state != b"Z" and Path(cwd, named.decode()) == stage:
            found.append(int(entry))
    return found


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_driver(driver: subprocess.Popen) -> None:
    """SIGKILL the driver's whole process group: Snakemake and the runners."""
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)


def one_writer_at_a_time(workdir: Path) -> None:
    """The ledger's writers, by pid: no two were at work at the same time."""
    spans = {}
    for attempt, pid, at in ticks(workdir):
        first, last = spans.get(pid, (attempt, at, at))[1:]
        spans[pid] = (attempt, min(first, at), max(last, at))
    ordered = sorted(spans.values(), key=lambda s: s[1])
    for earlier, later in itertools.pairwise(ordered):
        assert later[1] > earlier[2], f"attempt {earlier[0]} and {later[0]} wrote at the same time: {ordered}"


def resumed_in_place(stage: Path) -> bool:
    """The stage's ticks are attempt 2's after attempt 1's, in one file, and no
    earlier workspace was archived."""
    attempts = [line.split()[0] for line in (stage / "ticks.log").read_text().splitlines()]
    return "2" in attempts and attempts == sorted(attempts) and not (stage / ".attempts").exists()


@pytest.fixture
def leftovers():
    """Stages whose step processes the test kills at its end, whatever happened."""
    stages = []
    yield stages
    for stage in stages:
        kill_all(step_processes(stage))


@pytest.mark.parametrize("shape, moment", [*((shape, "ticking") for shape in sorted(SHAPES)),
                                           ("pipeline", "starting"), ("python_child", "starting")])
def test_a_step_dies_with_its_killed_driver_and_the_next_cron_runs_one_attempt(tmp_path, leftovers, shape, moment):
    stage = study(tmp_path, shape)
    leftovers.append(stage)
    driver = start_driver(tmp_path)
    try:
        if moment == "starting":   # the step's shell has just been started
            wait_for(lambda: (stage / "_running.json").exists(), 120, "the step never started")
        else:
            wait_for(lambda: len(ticks(tmp_path)) >= 10, 120, "the step never ticked")
    finally:
        kill_driver(driver)
    # Nothing of the step lives on, even what its shell had started.
    try:
        wait_for(lambda: not step_processes(stage), 5, "")
    except AssertionError:
        raise AssertionError(f"the step outlived its runner: {step_processes(stage)}") from None

    out = cron(tmp_path, snakefile=tmp_path / "workflow" / "Snakefile", workflow=tmp_path / "workflow")
    assert out.returncode == 0, out.stdout + out.stderr
    record = read_manifest(stage)
    assert record["state"] == "SUCCESS"
    assert [a["state"] for a in record["attempts"]] == ["CANCELLED", "SUCCESS"]
    one_writer_at_a_time(tmp_path)
    assert {a for a, _, _ in ticks(tmp_path)} <= {"1", "2"}
    # A step killed from outside resumes in place: attempt 2 appended to what
    # attempt 1 wrote, in the same directory, nothing archived.
    assert resumed_in_place(stage)
    if moment == "ticking":   # the runner's watchdog said what it did, in the attempt's log
        log = (stage / "_logs" / "attempt-1.log").read_text()
        assert "waypost: the step's runner" in log and "is gone; ended the step's process group" in log, log


def watchdog_of(runner: int) -> int:
    """The runner's watchdog: its child named waypost-watch."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                name, rest = f.read().split(b"(", 1)[1].rsplit(b")", 1)
        except (OSError, IndexError):
            continue
        if name == b"waypost-watch" and int(rest.split()[1]) == runner:
            return int(entry)
    raise AssertionError(f"runner {runner} has no watchdog")


@pytest.mark.parametrize("next_run", ["cron", "snakemake"])
def test_a_step_left_at_work_without_runner_or_watchdog_is_ended_before_the_next_attempt(
        tmp_path, leftovers, next_run):
    """The watchdog is killed too: the step's process group lives on. The
    running marker names it; the next attempt ends it (not waits: nobody
    would record it) and says so, then runs alone."""
    stage = study(tmp_path, "background")
    leftovers.append(stage)
    if next_run == "snakemake":
        (tmp_path / "stubborn").touch()   # it ignores SIGTERM: the grace, then SIGKILL
    driver = start_driver(tmp_path)
    try:
        wait_for(lambda: len(ticks(tmp_path)) >= 10, 120, "the step never ticked")
        marker = json.loads((stage / "_running.json").read_text())
        group = marker["step_group"]
        os.kill(watchdog_of(marker["pid"]), signal.SIGKILL)
    finally:
        kill_driver(driver)
    time.sleep(1)
    left = step_processes(stage)
    assert left and all(os.getpgid(pid) == group["pgid"] for pid in left)
    status = subprocess.run([sys.executable, "-m", "waypost.cli", "status", "--json", "--config",
                             str(tmp_path / "config.yaml"), "--workflow", str(tmp_path / "workflow")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    cell = json.loads(status.stdout)["experiments"]["trial"]["_all"]["sweep"]
    assert cell["state"] == "running", cell

    if next_run == "cron":
        out = cron(tmp_path, snakefile=tmp_path / "workflow" / "Snakefile", workflow=tmp_path / "workflow")
        assert out.returncode == 0, out.stdout + out.stderr
        said, how = out.stdout, "SIGTERM"
    else:
        cmd = [sys.executable, "-m", "snakemake", "-s", str(tmp_path / "workflow" / "Snakefile"), "--profile",
               str(LOCAL_PROFILE), "--configfile", str(tmp_path / "config.yaml")]
        subprocess.run([*cmd, "--unlock"], cwd=tmp_path, capture_output=True, timeout=300)   # the killed driver's
        out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        said, how = out.stderr, "SIGKILL after 2 s"
    line = (f"attempt 1: its runner, pid {marker['pid']} on {os.uname().nodename}, is gone but its step is not: "
            f"process group {group['pgid']} (pid")
    assert line in said and f"ended it ({how}) rather than start another attempt beside it" in said, said
    assert not step_processes(stage)
    record = read_manifest(stage)
    assert [a["state"] for a in record["attempts"]] == ["CANCELLED", "SUCCESS"]
    if next_run == "snakemake":   # the attempt's record says it too
        assert f"ended it ({how})" in record["attempts"][0]["error"], record["attempts"][0]
    one_writer_at_a_time(tmp_path)
    assert resumed_in_place(stage)
    log = (stage / "_logs" / "attempt-1.log").read_text()
    assert line in log and f"ended it ({how})" in log, log
    terms = [t for t in (tmp_path / "ledger.txt").read_text().splitlines() if t.endswith("TERM")]
    assert len(terms) == (0 if next_run == "snakemake" else 1), terms
