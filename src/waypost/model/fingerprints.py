"""Fingerprints of the inputs a stage reads from outside the results root
(a CSV in the repository, a reference file on another disk): no stage's
manifest stands for them, so the step runner records what they were, and
``waypost plan`` says when one changed since (``inputdrift``).

A fingerprint is the size and modification time (ns) of a file, and its
sha256 when it is at most ``CHECKSUM_LIMIT`` bytes (hashing a bigger one at
every job would cost more than the job's start). A directory's is over its
first ``DIRECTORY_FILES`` files in name order: their number, total size,
newest time, and a sha256 of their names, sizes and contents when the total
is within the limit. Comparing looks at size and time first and reads the
contents only when those changed and a checksum was recorded, so a file
touched without a change is not an edit.
"""

from __future__ import annotations

import hashlib
import os
import stat

from waypost.model import manifest

# The biggest input (a file, or a directory's files together) hashed; a
# bigger one is fingerprinted by size and time alone.
CHECKSUM_LIMIT = 64 * 2**20
# The most files of a directory input fingerprinted (the first, in name order).
DIRECTORY_FILES = 1000


def outside(path: str, root: str) -> bool:
    """Is ``path`` (an input, as Snakemake names it) a local file outside
    ``root`` (a path, or a gs:// URL)? A URL is never one (a bucket's
    objects are no file here)."""
    if "://" in path:
        return False
    if "://" in root:
        return True
    here, top = os.path.abspath(path), os.path.abspath(root)
    return here != top and not here.startswith(top.rstrip(os.sep) + os.sep)


def look(path: str) -> tuple | None:
    """What size and time say of ``path`` now, cheaply: (size, mtime_ns,
    files: None for a file) or None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, st.st_mtime_ns, None
    size, newest, files = 0, st.st_mtime_ns, _files(path)
    for _, info in files:
        size += info.st_size
        newest = max(newest, info.st_mtime_ns)
    return size, newest, len(files)


def take(path: str, seen: tuple | None = None) -> dict | None:
    """The fingerprint of ``path`` (None when it is not there). ``seen``: what
    ``look`` said as the step began; when the file changed since, that is
    recorded, without a checksum (the contents the step read are gone), so
    ``plan`` reports the change rather than take the new version for the
    one the stage was made from."""
    now = look(path)
    if now is None:
        return None
    if seen is not None and seen != now:
        return _print(seen, None)
    return _print(now, _digest(path, now))


def _print(looked: tuple, digest: str | None) -> dict:
    size, mtime_ns, files = looked
    found = {"size": size, "mtime_ns": mtime_ns, "sha256": digest}
    if files is not None:
        found["files"] = files
    return found


def _files(path: str) -> list[tuple[str, os.stat_result]]:
    """A directory's first DIRECTORY_FILES files (relative name, stat), in name order."""
    found: list = []
    for top, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            if len(found) >= DIRECTORY_FILES:
                return found
            full = os.path.join(top, name)
            try:
                found.append((os.path.relpath(full, path), os.stat(full)))
            except OSError:
                continue
    return found


def _digest(path: str, looked: tuple) -> str | None:
    """The sha256 of a file (of a directory's names, sizes and contents),
    when it is within CHECKSUM_LIMIT; None otherwise, or when it can't be read."""
    size, _, files = looked
    if size > CHECKSUM_LIMIT:
        return None
    try:
        if files is None:
            return manifest.sha256_file(path) if os.path.isfile(path) else None
        digest = hashlib.sha256()
        for name, info in _files(path):
            digest.update(f"{name}\0{info.st_size}\0{manifest.sha256_file(os.path.join(path, name))}\n".encode())
        return digest.hexdigest()
    except OSError:
        return None


class Comparer:
    """Recorded fingerprints against the files now, each file looked at (and
    read) at most once however many stages read it."""

    def __init__(self):
        self._looks: dict[str, tuple | None] = {}
        self._digests: dict[str, str | None] = {}

    def change(self, path: str, recorded: dict) -> str | None:
        """What changed in ``path`` since ``recorded`` (a fingerprint), in a
        user's words; None when nothing did (the same size and time, or the
        same contents under a new time: a touch)."""
        if path not in self._looks:
            self._looks[path] = look(path)
        now = self._looks[path]
        if now is None:
            return "missing now"
        size, _, files = now
        before = (recorded.get("size"), recorded.get("mtime_ns"), recorded.get("files"))
        if before == now:
            return None
        if files != before[2] and None in (files, before[2]):
            return "now a directory" if files is not None else "now a file, not a directory"
        if files is not None and files != before[2]:
            return f"content changed: {before[2]:,} → {files:,} files"
        if size != before[0]:
            return f"content changed: {before[0]:,} → {size:,} bytes"
        if recorded.get("sha256"):
            if path not in self._digests:
                self._digests[path] = _digest(path, now)
            return None if self._digests[path] == recorded["sha256"] else "content changed"
        return "the same size, another time; " + (
            f"over the {CHECKSUM_LIMIT // 2**20} MiB checksum limit, contents not compared" if size > CHECKSUM_LIMIT
            else "no checksum recorded")
