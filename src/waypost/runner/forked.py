"""A step runner forked from a process that has imported it already (a
bundle's, ``bundle``; the local step server's, ``server``; a ``run:`` job's
own Snakemake process, ``run_here``): a fresh process for the step that pays
no interpreter start and no imports of its own.

``forkable`` says which steps may: a step that works on a gs:// stage
directory or reuses another stage brings in site-packages (gcsfs and what
it imports) and needs the interpreter's teardown, so it runs alone. A step
on a bucket mount only reads its stage directory's state through the
bucket's API: it is forked, with the GCS client imported here first.
"""

from __future__ import annotations

import os
import signal
import sys


def preload() -> None:
    """Import now, once, what a step imports as it goes, so that no forked
    runner pays for it: the outputs' crc32c (and how a manifest writes
    it), the mount check (and the codec it reads mount points with), the
    attempt's ``select``; and this machine's GPUs, as ``nvidia-smi`` lists
    them (it takes a while on a GPU node)."""
    import binascii  # noqa: F401
    import encodings.unicode_escape  # noqa: F401
    import select  # noqa: F401

    from waypost import stores
    from waypost.model import manifest, workers
    stores.preload()
    manifest.crc32c_extend()
    workers.gpus_listed()


def forkable(body: bytes) -> bool:
    """May the step whose here-document is ``body`` (its spec's line, then
    its command) run in a forked runner? False for a spec that can't be
    read: the runner alone says what is wrong with it."""
    from waypost import stores
    from waypost.model import spec

    try:
        step_spec = spec.decode(body.partition(b"\n")[0])
    except spec.SpecError:
        return False
    if step_spec.reuse_from or stores.needs_mirror(step_spec.stage_dir):
        return False
    if stores.on_a_bucket_mount(step_spec.stage_dir):
        _with_the_bucket_client()
    return True


def _with_the_bucket_client() -> None:
    """Import the GCS client here, once, so that the runners forked for
    steps on a bucket mount (which read their stage through its API) pay
    no import of it. Its event loop starts in each child (fsspec resets it
    after a fork; no instance of this process's is shared)."""
    from waypost import with_site
    with_site()
    import gcsfs  # noqa: F401


class Forked:
    """One step's runner, forked from this process (``wait`` and
    ``send_signal`` as a ``Popen``'s), reading the step from ``body``.

    ``defaults``: the signals this process handles or ignores, put back to
    their defaults in the child (the runner sets its own). ``setup(child)``
    runs first in the child (where its files, directory and environment
    come from); the step's standard input is empty, as the here-document's
    is once read."""

    def __init__(self, body: bytes, defaults: tuple[int, ...], setup=None):
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid:
            return
        status = 1
        try:
            for signum in defaults:
                signal.signal(signum, signal.SIG_DFL)
            if setup is not None:
                setup()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            from waypost.runner import main as runner
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


def run_here(body: bytes, step, env: dict[str, str]) -> int:
    """Run the step ``body`` (its spec's line, then its command) with a
    runner forked from this process, whose attempts each call ``step()``
    (their exit status) in a fork of it, in place of running the command:
    how a ``run:`` job's own Snakemake process runs its block as a step,
    with no second Snakemake process. ``env``: the runner's environment.
    The runner's exit status (negative: the signal that ended it).

    This process may have threads (Snakemake's); the fork has only the one
    that called, and runs nothing of the others' until it exits."""
    import warnings

    from waypost.runner import attempt

    def setup() -> None:
        # Fresh standard streams: another thread may have held the old ones'
        # locks at the fork, and nothing would ever release them here.
        for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
            old = getattr(sys, name)
            setattr(sys, name, open(fd, "w", encoding=getattr(old, "encoding", None), errors=errors,  # noqa: SIM115
                                    closefd=False, buffering=1 if getattr(old, "line_buffering", False) else -1))
        os.environ.clear()
        os.environ.update(env)
        attempt.call_instead(step)
    with warnings.catch_warnings():   # (Python 3.12+ warns of any fork of a process with threads)
        warnings.simplefilter("ignore", DeprecationWarning)
        child = Forked(body, attempt.FORWARDED_SIGNALS, setup)
    return child.wait()
