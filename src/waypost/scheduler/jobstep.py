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
starts. The bundle imports the step runner once and forks it for each step
that is just the runner reading its here-document (every local stage's):
a short stage then pays no interpreter start and no imports of its own. Any
other step file (a bucket root's, a reuse) runs with bash, as alone.

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
    os.environ[BUNDLED_ENV] = "1"
    runner = _import_runner()
    for step, status in entries:
        if stopped:
            break
        body = _runner_input(step, runner)
        child = _Forked(runner, body) if body is not None else subprocess.Popen(["/bin/bash", step])
        current[:] = [child]
        code = child.wait()
        current.clear()
        with open(status + ".tmp", "w") as f:
            f.write(f"{128 - code if code < 0 else code}\n")
        os.replace(status + ".tmp", status)
    return 128 + stopped[0] if stopped else 0


def _import_runner():
    """The step runner's module, imported once for the whole bundle, as
    ``launch.py`` imports it (waypost from the directory above this file's
    package, after the standard library)."""
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]   # this file's own directory: waypost's modules are imported as waypost.*
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from waypost.runner import main
    return main


def _runner_input(step: str, runner) -> bytes | None:
    """What the step file gives the runner on its standard input, when the
    file is exactly this interpreter's runner reading a here-document
    (``waypost.planning.wiring``'s step) of a step the runner works on
    locally; None for any other file: bash runs it."""
    from waypost import stores
    from waypost.model import spec

    try:
        with open(step, "rb") as f:
            text = f.read()
    except OSError:
        return None   # bash says what is wrong with it
    head, _, rest = text.partition(b"\n")
    end = b"\n" + spec.DELIMITER.encode() + b"\n"
    cut = rest.find(end)
    if not _runs_this_runner(head.decode(errors="replace"), runner.command(sys.executable), spec.DELIMITER) \
            or cut < 0 or rest[cut + len(end):].strip():
        return None
    body = rest[:cut + 1]   # the here-document: every line before the delimiter's
    line = body.partition(b"\n")[0]
    try:
        step_spec = spec.decode(line)
    except spec.SpecError:
        return None   # the runner alone says what is wrong with it
    if step_spec.reuse_from or stores.needs_mirror(step_spec.stage_dir):
        return None   # these bring in site-packages and need the interpreter's teardown
    return body


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


class _Forked:
    """One step's runner, forked from the bundle's process (``wait`` and
    ``send_signal`` as a ``Popen``'s): a fresh process that has the runner's
    modules imported already, reading the step from ``body``."""

    def __init__(self, runner, body: bytes):
        import signal
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid:
            return
        status = 1
        try:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(signum, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)   # as alone: the step's input was the here-document, now read
            os.dup2(null, 0)
            os.close(null)
            status = runner.run_and_exit(body)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)


def main() -> None:
    if sys.argv[1:2] == [BUNDLE_OPTION]:
        sys.stdout.flush()
        sys.exit(run_bundle(sys.argv[2]))
    path = step_file_of(sys.argv[1:], os.environ.get("SLURM_ARRAY_TASK_ID"))
    sys.stdout.flush()
    os.execv("/bin/bash", ["bash", path])


if __name__ == "__main__":
    main()
