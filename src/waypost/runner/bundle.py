"""A bundle: several stages in one Slurm job (a worker class's ``bundle: N``).

    python -S .../waypost/runner/launch.py --bundle LIST

runs the step files its list names (``STEP_FILE<TAB>STATUS_FILE`` lines,
written by waypost's executor) one after another, each with
``WAYPOST_BUNDLED=1`` (so each stage's runner keeps its own time limit), and
writes each step's exit status to the status file beside it as it ends. A
signal (Slurm ending the job) goes to the step at work, and no later step
starts. The bundle has imported the step runner once and forks it for each
step that is just the runner reading its here-document (every local
stage's): a short stage then pays no interpreter start and no imports of
its own. Any other step file (a bucket root's, a reuse) runs with bash, as
alone.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys

from waypost.runner.forked import Forked, forkable, preload

BUNDLE_OPTION = "--bundle"
BUNDLED_ENV = "WAYPOST_BUNDLED"
# What Slurm (or a user) sends to end the bundle: passed on to the step at work.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def run_bundle(list_path: str) -> int:
    """Run a bundle's steps in turn; 128 + N when signal N stopped it."""
    import subprocess

    with open(list_path) as f:
        entries = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    stopped: list[int] = []
    current: list[subprocess.Popen] = []

    def stop(signum, _frame) -> None:
        stopped.append(signum)
        for child in current:
            try:
                child.send_signal(signum)
            except OSError:
                pass
    for signum in FORWARDED:
        signal.signal(signum, stop)
    os.environ[BUNDLED_ENV] = "1"
    from waypost.runner import main as runner
    preload()
    for step, status in entries:
        if stopped:
            break
        body = _runner_input(step, runner)
        child = Forked(body, FORWARDED) if body is not None else subprocess.Popen(["/bin/bash", step])
        current[:] = [child]
        code = child.wait()
        current.clear()
        with open(status + ".tmp", "w") as f:
            f.write(f"{128 - code if code < 0 else code}\n")
        os.replace(status + ".tmp", status)
    return 128 + stopped[0] if stopped else 0


def _runner_input(step: str, runner) -> bytes | None:
    """What the step file gives the runner on its standard input, when the
    file is exactly this interpreter's runner reading a here-document
    (``waypost.planning.wiring.steps``' step) of a step the runner works on
    locally; None for any other file: bash runs it."""
    from waypost.model import spec

    try:
        with open(step, "rb") as f:
            text = f.read()
    except OSError:
        return None   # bash says what is wrong with it
    found = spec.here_document(text)
    if found is None or not _runs_this_runner(found[0].decode(errors="replace"), runner.command(sys.executable),
                                              spec.DELIMITER):
        return None
    body = found[1]
    return body if forkable(body) else None


def _runs_this_runner(head: str, command: list[str], delimiter: str) -> bool:
    """Is ``head`` (a step file's first line) ``exec COMMAND <<'DELIMITER'``,
    the same interpreter (``-S``: its standard library and waypost only) and
    the same runner as ``command``, however their paths are spelt?"""
    try:
        words = shlex.split(head)
    except ValueError:
        return False
    if words[:1] != ["exec"] or words[-1] != "<<" + delimiter or len(words) != len(command) + 2:
        return False
    same, ours, theirs = os.path.realpath, command, words[1:-1]
    return (same(theirs[0]) == same(ours[0]) and theirs[1:-1] == ours[1:-1]
            and same(theirs[-1]) == same(ours[-1]))
