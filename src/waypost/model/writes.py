"""waypost's own writes in a stage directory (or a root): whole files, and
the one line a fault while writing one comes to.

A stage directory may be on a bucket mount (gcsfuse; rclone with
``--vfs-cache-mode off``), where a file is an object uploaded whole when it
is closed: it can't be appended to or seeked in place (rclone: EPERM on
``open(path, "ab")``, ESPIPE on a seek). So every file waypost writes there
is written whole (``whole``: a temporary name beside it, then a rename),
never appended to; what grows (an attempt's log) grows in a local scratch
file and is written whole (``steplog``).

A full disk (ENOSPC, EDQUOT), a read-only one (EROFS) or one that fails
(EIO) while waypost writes one of its records is no bug of waypost's: the
write is tagged with its file (``Unrecorded``, from ``whole`` or
``writing``) and the step runner turns it into one line (``line``):
nothing more was recorded, and the next run, once the cause is gone, goes
on from what was.

The runner starts at every step: this imports nothing beyond ``os`` and
``errno``.
"""

from __future__ import annotations

import errno
import os
import time

from waypost.model.errors import WaypostError

# The faults of a filesystem (not of waypost's): what each says to do.
FAULTS = {
    errno.ENOSPC: "free space",
    errno.EDQUOT: "free space (or raise the quota)",
    errno.EROFS: "make it writable",
    errno.EIO: "check the filesystem (or the mount)",
}
# Those that only a write meets: an untagged one in the runner is a write too.
WRITE_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class Unrecorded(WaypostError, OSError):
    """A fault of the filesystem while waypost wrote ``filename``: it was
    not written. An OSError still (code that tolerates a failed write, as a
    heartbeat does, goes on tolerating it)."""


class writing:   # (lower case: used as a context manager, like open)
    """``with writing(path): ...``: a filesystem fault (FAULTS) in the block
    is ``Unrecorded`` writing ``path`` (when it named no other file)."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, _tb) -> None:
        if exc is not None and isinstance(exc, OSError) and not isinstance(exc, Unrecorded) \
                and exc.errno in FAULTS:
            raise Unrecorded(exc.errno, exc.strerror, exc.filename or self.path) from exc


def whole(path: str, data: bytes, durable: bool = False) -> None:
    """Write ``path`` whole: a temporary name in its directory (written once,
    synced with ``durable``), then renamed over it. A reader sees the old
    file or the new one; on a bucket mount the object is uploaded once. A
    temporary file a failed write leaves is removed."""
    # A name no other writer uses (pid + clock), created exclusively, readable
    # by everyone the umask allows (tempfile would cost the runner's start ~5 ms).
    tmp = os.path.join(os.path.dirname(path) or ".", f".tmp-{os.getpid()}-{time.monotonic_ns()}")
    with writing(path):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)   # (a mount may only now find the object can't be stored)
            os.replace(tmp, path)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise


def line(stage: str, exc: OSError, where: str) -> str | None:
    """The one line a runner ends with when ``exc`` is a filesystem fault of
    one of waypost's writes (``where``: the stage directory, for a fault no
    write was tagged with); None for any other error."""
    if isinstance(exc, Unrecorded):
        path = exc.filename
    elif exc.errno in WRITE_ONLY:
        path = exc.filename or where
    else:
        return None
    what = (exc.strerror or os.strerror(exc.errno)).lower()
    point, free = filesystem(path)
    return (f"waypost: {stage}: {what} writing {path} ({point}: {free} bytes free): not recorded; "
            f"{FAULTS[exc.errno]} and run again")


def filesystem(path: str) -> tuple[str, int | str]:
    """The mount point of the filesystem ``path`` is on (or would be), and
    the bytes free there for an unprivileged writer (or "?")."""
    here = os.path.abspath(path)
    while not os.path.exists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    try:
        stat = os.statvfs(here)
        free: int | str = stat.f_bavail * stat.f_frsize
        device = os.stat(here).st_dev
        while os.path.dirname(here) != here and os.stat(os.path.dirname(here)).st_dev == device:
            here = os.path.dirname(here)
    except OSError:
        return here, "?"
    return here, free
