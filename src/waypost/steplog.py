"""An attempt's log (``_logs/attempt-<n>.log``), kept where it can grow.

While the attempt runs, what goes into its log (the step's output, teed by
``attempt.Attempt``; waypost's notes; the checks' lines after it) is
appended to a scratch file outside the root (``$TMPDIR``). The stage
directory gets the log whole (``writes.whole``): when the attempt starts
(so the log its record names is there from the start), at every heartbeat
while the step runs (``HEARTBEAT_S``: a live log at most that old), and
when the attempt ends, checks and all. Nothing in a stage directory is
appended to: on a bucket mount an object can't be (see ``writes``).

The step's output is on the runner's standard error as it comes, too
(Snakemake's terminal, or the Slurm job's output). A runner killed outright
(SIGKILL, its node gone) leaves the log as its last heartbeat wrote it, and
the rest in its scratch file (``$TMPDIR/waypost-<pid>-…-attempt-<n>.log``).
"""

from __future__ import annotations

import os
import time

from . import writes


class StepLog:
    """The log of one attempt: appended to locally (``scratch``), written
    whole to ``path`` in the stage directory."""

    def __init__(self, path: str):
        self.path = path
        scratch_dir = os.environ.get("TMPDIR") or "/tmp"
        self.scratch = os.path.join(scratch_dir, f"waypost-{os.getpid()}-{time.monotonic_ns()}-"
                                                 f"{os.path.basename(path)}")
        with writes.writing(self.scratch):
            os.close(os.open(self.scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._published: int | None = None   # the scratch's size when last written whole

    def write(self, data: bytes) -> None:
        """Add ``data`` to the log (in the scratch file)."""
        with writes.writing(self.scratch), open(self.scratch, "ab") as f:
            f.write(data)

    def publish(self) -> None:
        """Write the log as it is now into the stage directory, whole (when
        it changed since the last time)."""
        with open(self.scratch, "rb") as f:
            data = f.read()
        if len(data) != self._published:
            writes.whole(self.path, data)
            self._published = len(data)

    def refresh(self) -> None:
        """``publish`` at a heartbeat: a write that fails now is not the
        attempt's end (the last one, at its end, says so)."""
        try:
            self.publish()
        except OSError:
            pass

    def close(self, quiet: bool = False) -> None:
        """Write the whole log into the stage directory (``quiet``: as far as
        it can); the scratch file is gone after."""
        try:
            self.refresh() if quiet else self.publish()
        finally:
            os.unlink(self.scratch)
