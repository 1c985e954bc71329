"""What a waypost Slurm job runs: the stage's step, straight away.

    python -S .../waypost/jobstep.py STEP_FILE [--slurm-jobstep-array-execs=PAYLOAD]
    python -S .../waypost/jobstep.py --bundle LIST

The job's step is complete when it is submitted: waypost's executor formats
it in Snakemake's main process (the step runner's line, with the step spec
and the rule's command in a here-document: ``waypost.planning.wiring.job_command``)
and writes it to ``STEP_FILE`` in the run's spool directory, which the
cluster's nodes share with the main process as they share ``.snakemake``.
So the job starts no Snakemake, and no argument carries the command: this
file hands the step file to bash, as Snakemake's shell would a long command.

Packed stages are one Slurm job array (the Slurm executor plugin's arrays):
task *i* finds its own step file in the plugin's payload of every task but
the first, whose file is the base one. The payload maps a task id to the
zlib-compressed hex of that task's ``jobstep.py`` command line.

A bundle (a class's ``bundle: N``: several stages in one Slurm job) runs
the step files its list names one after another, each with
``WAYPOST_BUNDLED=1`` (so each stage's runner keeps its own time limit), and
writes each step's exit status to the status file beside it as it ends. A
signal (Slurm ending the job) goes to the step at work, and no later step
starts.

Only the standard library, no ``site``: a few milliseconds per job.
"""

import base64
import json
import os
import shlex
import sys
import zlib

ARRAY_OPTION = "--slurm-jobstep-array-execs="
BUNDLE_OPTION = "--bundle"
BUNDLED_ENV = "WAYPOST_BUNDLED"


def step_file_of(argv: list[str], task: str | None) -> str:
    """This job's (or this array task's) step file."""
    own, payload = argv[0], None
    for arg in argv[1:]:
        if arg.startswith(ARRAY_OPTION):
            payload = json.loads(base64.b64decode(arg[len(ARRAY_OPTION):]))
    if payload and task in payload:
        own = shlex.split(zlib.decompress(bytes.fromhex(payload[task])).decode())[-1]
    return own


def run_bundle(list_path: str) -> int:
    """Run a bundle's steps in turn; 128 + N when signal N stopped it."""
    import signal
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
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, stop)
    env = {**os.environ, BUNDLED_ENV: "1"}
    for step, status in entries:
        if stopped:
            break
        child = subprocess.Popen(["/bin/bash", step], env=env)
        current[:] = [child]
        code = child.wait()
        current.clear()
        with open(status + ".tmp", "w") as f:
            f.write(f"{128 - code if code < 0 else code}\n")
        os.replace(status + ".tmp", status)
    return 128 + stopped[0] if stopped else 0


def main() -> None:
    if sys.argv[1:2] == [BUNDLE_OPTION]:
        sys.stdout.flush()
        sys.exit(run_bundle(sys.argv[2]))
    path = step_file_of(sys.argv[1:], os.environ.get("SLURM_ARRAY_TASK_ID"))
    sys.stdout.flush()
    os.execv("/bin/bash", ["bash", path])


if __name__ == "__main__":
    main()
