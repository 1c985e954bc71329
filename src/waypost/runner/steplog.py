"""An attempt's log (``_logs/attempt-<n>.log``), kept where it can grow.

What goes into an attempt's log (the step's output, teed by
``attempt.Attempt``; waypost's notes; the checks' lines after it) is
appended to the log itself where the root can append to a file (disk,
NFS: a live log, ``tail -f`` works). On a bucket mount (gcsfuse; rclone
with ``--vfs-cache-mode off``) a file is an object uploaded whole at its
close and can't be appended to, so there the log grows in a scratch file
outside the root (``$TMPDIR``) and the stage directory gets it whole
(``writes.whole``): when the attempt starts (so the log its record names is
there from the start), at every heartbeat while the step runs
(``HEARTBEAT_S``: a live log at most that old), and when the attempt ends,
checks and all.

The step's output is on the runner's standard error as it comes, too
(Snakemake's terminal, or the Slurm job's output). On a mount, a runner
killed outright (SIGKILL, its node gone) leaves the log as its last
heartbeat (or its watchdog, see ``attempt``) wrote it, and the rest in its
scratch file (``$TMPDIR/waypost-<pid>-…-attempt-<n>.log``).
"""

from __future__ import annotations

import os
import time

from waypost.model import writes


class StepLog:
    """The log of one attempt at ``path`` in the stage directory: appended
    to there (``appends``), or grown in a local scratch file and written
    whole to ``path``. ``growing`` is the file to append to."""

    def __init__(self, path: str, appends: bool):
        self.path, self.appends = path, appends
        self._published: int | None = None   # the scratch's size when last written whole
        if appends:
            self.growing = path
            with writes.writing(path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666))
            return
        scratch_dir = os.environ.get("TMPDIR") or "/tmp"
        self.growing = os.path.join(scratch_dir, f"waypost-{os.getpid()}-{time.monotonic_ns()}-"
                                                 f"{os.path.basename(path)}")
        with writes.writing(self.growing):
            os.close(os.open(self.growing, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))

    def write(self, data: bytes) -> None:
        """Add ``data`` to the log."""
        with writes.writing(self.growing), open(self.growing, "ab") as f:
            f.write(data)

    def publish(self) -> None:
        """Write the log as it is now into the stage directory, whole (when
        it changed since the last time); nothing where it grows there."""
        if self.appends:
            return
        with open(self.growing, "rb") as f:
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
        if self.appends:
            return
        try:
            self.refresh() if quiet else self.publish()
        finally:
            try:
                os.unlink(self.growing)
            except FileNotFoundError:   # (closed already: by the watchdog of a runner gone)
                pass
