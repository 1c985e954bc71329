"""What waypost does not trust, and how it checks it.

Waypost trusts your config and your workflow: the roots, reuse sources and
steps you wrote. It does not trust what it reads from a root: another
team's root, a bucket, a manifest (even one under your own root: anyone
who can write there can write one). Every path such a source gives is
checked here before it becomes a path on disk or an object name:

- a path a manifest records relative to its stage directory (an output, a
  member of a ``directory()`` output, an attempt's workspace or log), and
  an object name a bucket listing gives relative to the stage or root it
  was listed under, must be relative and normalised: no absolute path, no
  ``..``, no empty or ``.`` part, no backslash (a separator to some
  filesystems), no NUL or other control character (``relative_problem``);
- a location a manifest records (an input, its producer's manifest, a
  reuse source) may be the run's own spelling of a root (``results``,
  ``../shared/results``, ``/data/results``, ``gs://bucket/prefix``), but
  never climbs again after that: no ``..`` past its leading ones, and a
  gs:// URL's object name is normalised as above (``location_problem``);
- a local stage directory is never left through a symbolic link: what a
  link inside one points to must be inside it too (``escapes``), and a
  manifest is read only from a regular file, never through a link
  (``read_regular``).

The manifest reader (``manifest.parse``) applies these rules to every
manifest it hands out; see docs/reliability.md, "Trust".
"""

from __future__ import annotations

import errno
import os
import re
import stat

from waypost.model import locations
from waypost.model.errors import WaypostError

# The most waypost reads of one manifest: a funnel over 10,000 inputs
# records about 3 MB (290 bytes per input on disk, 350 in a bucket), so
# 16 MiB leaves room for 40,000 while a planted file of gigabytes is never
# read into memory (and one of 16 MiB parses in well under a second).
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
# The deepest nesting of lists and objects in a manifest (waypost writes
# about 6; a stage's settings add their own few levels).
MAX_DEPTH = 64
# The longest path a manifest may record (Linux's PATH_MAX).
MAX_PATH = 4096


class Untrusted(WaypostError, ValueError):
    """A path, object name or file waypost refuses to use; the message says why."""


def _encodable(path: str) -> bool:
    """Can ``path`` be a file name here (a lone surrogate can't, but those
    that stand for bytes that aren't UTF-8 can)?"""
    try:
        os.fsencode(path)
        return True
    except UnicodeEncodeError:
        return False


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _name_problem(path: str) -> str | None:
    if "\x00" in path:
        return "has a NUL character"
    if _CONTROL.search(path):
        return "has a control character"
    if "\\" in path:
        return "has a backslash, which some filesystems read as a separator"
    if not path.isascii() and not _encodable(path):
        return "is no file name this system can write (a lone surrogate)"
    return None


# A path every part of which is a plain name (not empty, not "." or "..",
# no "/", backslash or NUL): what relative_problem accepts, in one match.
_PART = r"(?!\.\.?(?:/|\Z))[^/\\\x00-\x1f\x7f]+"
_PLAIN = re.compile(rf"{_PART}(?:/{_PART})*")


def relative_problem(path: object, dot: bool = False) -> str | None:
    """Why ``path`` can't be a path inside a stage directory, relative to it
    (None when it can); ``dot``: the directory itself (``.``) will do."""
    if type(path) is str and len(path) <= MAX_PATH and _PLAIN.fullmatch(path) and (path.isascii() or _encodable(path)):
        return None
    if not isinstance(path, str):
        return "is not a string"
    if not path:
        return "is empty"
    if len(path) > MAX_PATH:
        return f"is longer than {MAX_PATH} characters"
    problem = _name_problem(path)
    if problem:
        return problem
    if path.startswith("/"):
        return "is an absolute path, outside its stage directory"
    if dot and path == ".":
        return None
    parts = path.split("/")
    if ".." in parts:
        return "leaves its stage directory"
    if "" in parts or "." in parts:
        return "is not a normalised relative path (an empty or '.' part)"
    return None


def location_problem(location: object) -> str | None:
    """Why ``location`` can't be where a stage's file or manifest is (None
    when it can): a gs:// URL with a normalised object name, or a local path
    that climbs (``..``) only at its start."""
    if not isinstance(location, str):
        return "is not a string"
    if not location:
        return "is empty"
    if len(location) > 2 * MAX_PATH:
        return f"is longer than {2 * MAX_PATH} characters"
    url = locations.split_url(location)
    if url:
        bucket, name = url
        if not bucket or "\\" in bucket or "\x00" in bucket:
            return "names no bucket"
        problem = relative_problem(name) if name else None
        return problem and problem.replace("its stage directory", "its bucket")
    if "\x00" in location:
        return "has a NUL character"
    if _CONTROL.search(location):
        return "has a control character"
    if not location.isascii() and not _encodable(location):
        return "is no file name this system can write (a lone surrogate)"
    if ".." not in location:
        return None
    parts = location.split("/")
    start = 0
    while start < len(parts) and parts[start] in ("", ".", ".."):
        start += 1
    if ".." in parts[start:]:
        return "climbs out of the directory it names ('..' past its start)"
    return None


def inside(path: str, directory: str) -> bool:
    """Is ``path`` (a resolved, absolute path) ``directory`` or below it?"""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def escapes(stage_dir: str, rel: str) -> str | None:
    """Where a file of a local stage dir (``rel``, relative to it) really
    is, when a symbolic link takes it out of the stage dir or to nothing;
    None when it is inside (a link inside the stage that stays inside is
    fine)."""
    base = os.path.realpath(stage_dir)
    real = os.path.realpath(os.path.join(stage_dir, rel))
    if not inside(real, base):
        return real
    return None


def resolve_inside(stage_dir: str, rel: str, what: str) -> str:
    """The real path of a stage dir's file (``rel``, relative to it), which
    must be there and inside the stage dir (through links, if any);
    Untrusted naming it otherwise."""
    path = os.path.join(stage_dir, rel)
    real = os.path.realpath(path)
    if not inside(real, os.path.realpath(stage_dir)):
        raise Untrusted(f"{path}: {what} is a symbolic link to {real}, outside its stage directory")
    if not os.path.isfile(real):
        if os.path.islink(path):
            raise Untrusted(f"{path}: {what} is a symbolic link to nothing ({real})")
        raise FileNotFoundError(f"{path}: no such file")
    return real


def links_out(directory: str, skip=()) -> list[tuple[str, str]]:
    """(relative path, where it leads) of every symbolic link below a local
    directory that leads out of it or to nothing (links are never followed
    while walking; names in ``skip`` at the top are left out)."""
    base = os.path.realpath(directory)
    found = []

    def walk(top: str, rel: str) -> None:
        try:
            entries = list(os.scandir(top))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return
        for entry in entries:
            if not rel and entry.name in skip:
                continue
            name = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                real = os.path.realpath(entry.path)
                if not inside(real, base) or not os.path.exists(real):
                    found.append((name, real))
            elif entry.is_dir(follow_symlinks=False):
                walk(entry.path, name)
    walk(directory, "")
    return sorted(found)


def read_regular(path: str, limit: int = MAX_MANIFEST_BYTES) -> tuple[bytes, os.stat_result]:
    """The bytes of a local file and its stat, read only if it is a regular
    file (never through a symbolic link, never a FIFO or a device) of at
    most ``limit`` bytes; Untrusted otherwise, FileNotFoundError when there
    is none, OSError when it can't be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):   # ELOOP: the last part is a link
            raise Untrusted(f"{path}: a symbolic link (to {os.path.realpath(path)}); waypost reads a manifest "
                            "only from a regular file in the stage directory") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{path}: not a regular file")
        if st.st_size > limit:
            raise Untrusted(too_big(path, st.st_size, limit))
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:   # it grew while being read
            raise Untrusted(too_big(path, size, limit))
        return b"".join(chunks), st
    finally:
        os.close(fd)


def too_big(path: str, size: int, limit: int = MAX_MANIFEST_BYTES) -> str:
    return f"{path}: {size} bytes or more, over the {limit // (1024 * 1024)} MiB waypost reads of a manifest"
