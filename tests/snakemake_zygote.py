"""``python -m snakemake ARGS`` in a fork of one process that imported
Snakemake's command line once: the conformance suite runs several hundred
short workflows, and importing Snakemake (about 1 s of CPU) was most of each
run's cost. Each run is still a process of its own (its own globals,
working directory and environment), entering ``snakemake.cli.main`` as
``python -m snakemake`` does.

Protocol: one JSON request a line on standard input (``cwd``, ``args``,
``env``, ``log``: the file its standard output and error go to,
``timeout`` in seconds), one JSON answer a line (``returncode``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

import snakemake.cli


def _child(request: dict) -> None:
    code = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.setpgid(0, 0)   # its jobs with it: a run past its time is killed whole
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [snakemake.cli.__file__, *request["args"]]
        snakemake.cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    def kill(*_):
        os.killpg(pid, signal.SIGKILL)
    signal.signal(signal.SIGALRM, kill)
    signal.alarm(int(timeout))
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        signal.alarm(0)
    return os.waitstatus_to_exitcode(status)


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        try:
            os.setpgid(pid, pid)   # (the child does it too: whichever comes first)
        except OSError:
            pass
        print(json.dumps({"returncode": _wait(pid, request["timeout"])}), flush=True)


if __name__ == "__main__":
    serve()
