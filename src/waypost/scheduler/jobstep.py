"""What a waypost Slurm job runs: the stage's step, straight away.

    python -S .../waypost/jobstep.py --array-index-env=NAME STEP_FILE [--slurm-jobstep-array-execs=PAYLOAD]

The job's step is complete when it is submitted: waypost's executor formats
it in Snakemake's main process (the step runner's line, with the step spec
and the rule's command in a here-document: ``waypost.planning.wiring.steps.job_command``)
and writes it to ``STEP_FILE`` in the run's spool directory, which the
cluster's nodes share with the main process as they share ``.snakemake``.
So the job starts no Snakemake, and no argument carries the command: this
file hands the step file to bash, as Snakemake's shell would a long command.

Packed stages are one Slurm job array (the Slurm executor plugin's arrays):
task *i* finds its own step file in the plugin's payload of every task but
the first, whose file is the base one. The payload maps a task id to the
zlib-compressed hex of that task's ``jobstep.py`` command line; the task's
id is in the environment variable ``--array-index-env`` names (its
scheduler's ``array_index_env``: this file imports no waypost).

A bundle (a class's ``bundle: N``: several stages in one Slurm job) is
the step runner's own entry (``waypost.runner.bundle``), not this file's.

Only the standard library, no ``site``: a few milliseconds per job.
"""

import base64
import json
import os
import shlex
import sys
import zlib

ARRAY_OPTION = "--slurm-jobstep-array-execs="
INDEX_OPTION = "--array-index-env="
# where the task's id is when no option names it: a job a waypost from
# before the option submitted (the Slurm plugin's arrays)
FORMER_INDEX_ENV = "SLURM_ARRAY_TASK_ID"


def step_file_of(argv: list[str], task: str | None) -> str:
    """This job's (or this array task's) step file."""
    own, payload = next(arg for arg in argv if not arg.startswith("--")), None
    for arg in argv:
        if arg.startswith(ARRAY_OPTION):
            payload = json.loads(base64.b64decode(arg[len(ARRAY_OPTION):]))
    if payload and task in payload:
        own = shlex.split(zlib.decompress(bytes.fromhex(payload[task])).decode())[-1]
    return own


def array_index(argv: list[str], environ) -> str | None:
    """This array task's id, from the variable ``INDEX_OPTION`` names."""
    name = next((arg[len(INDEX_OPTION):] for arg in argv if arg.startswith(INDEX_OPTION)), FORMER_INDEX_ENV)
    return environ.get(name)


def main() -> None:
    path = step_file_of(sys.argv[1:], array_index(sys.argv[1:], os.environ))
    sys.stdout.flush()
    os.execv("/bin/bash", ["bash", path])


if __name__ == "__main__":
    main()
