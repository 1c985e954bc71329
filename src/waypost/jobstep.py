"""What a waypost Slurm job runs: the stage's step runner, straight away.

    python -S .../waypost/jobstep.py COMMAND_B64 [--slurm-jobstep-array-execs=PAYLOAD]

The job's command line is complete when it is submitted (waypost's executor
formats it in Snakemake's main process: ``job.shellcmd``, the step runner
around the rule's command), so the job starts no Snakemake: this file
decodes the command and hands it to bash, as Snakemake's shell would.

Packed stages are one Slurm job array (the Slurm executor plugin's arrays):
task *i* finds its own command in the plugin's payload of every task but
the first, whose command is the base one. The payload maps a task id to the
zlib-compressed hex of that task's ``jobstep.py`` command line.

Only the standard library, no ``site``: a few milliseconds per job.
"""

import base64
import json
import os
import sys
import zlib

ARRAY_OPTION = "--slurm-jobstep-array-execs="


def encode(command: str) -> str:
    """A shell command as one word of safe characters (the executor's side)."""
    return base64.urlsafe_b64encode(zlib.compress(command.encode(), 6)).decode()


def decode(word: str) -> str:
    return zlib.decompress(base64.urlsafe_b64decode(word.encode())).decode()


def command_of(argv: list[str], task: str | None) -> str:
    """This job's (or this array task's) shell command."""
    own, payload = argv[0], None
    for arg in argv[1:]:
        if arg.startswith(ARRAY_OPTION):
            payload = json.loads(base64.b64decode(arg[len(ARRAY_OPTION):]))
    if payload and task in payload:
        line = zlib.decompress(bytes.fromhex(payload[task])).decode().split()
        own = line[-1]      # the task's own `python -S jobstep.py WORD`
    return decode(own)


# One argument of a command line holds at most 128 KiB (MAX_ARG_STRLEN).
LONGEST_ARGUMENT = 100_000


def main() -> None:
    command = "set -euo pipefail; " + command_of(sys.argv[1:], os.environ.get("SLURM_ARRAY_TASK_ID"))
    sys.stdout.flush()
    if len(command.encode()) < LONGEST_ARGUMENT:
        os.execv("/bin/bash", ["bash", "-c", command])
    # Longer (a funnel's thousands of paths): bash reads it from a file in memory.
    script = os.memfd_create("waypost-step", 0)
    os.write(script, command.encode())
    os.lseek(script, 0, os.SEEK_SET)
    os.set_inheritable(script, True)
    os.execv("/bin/bash", ["bash", f"/proc/self/fd/{script}"])


if __name__ == "__main__":
    main()
