"""Stage directories on local disk (or NFS): ``os`` calls, as they come.

``LocalStore`` answers each question when asked; ``LocalSnapshot`` lists
each directory once (for commands that only look, like a bucket store).
Reuse copies (a reflink where the filesystem has them, else a plain copy):
never a hard link, which would change the source's files (their link count
and ctime) and tie the two stages' files together.
"""

from __future__ import annotations

import json
import os
import time
from types import MappingProxyType

from waypost.model import layout, manifest, records, trust, writes
from waypost.model.layout import ARCHIVING, ATTEMPTS, MANIFEST, RUNNING
from waypost.stores import walk
from waypost.stores.base import StageStore, archive_number, walked


def manifests_under(root: str, max_depth: int = 6, leaf: str = MANIFEST):
    """Every directory with a manifest (or another engine file, ``leaf``)
    under a local ``root`` (not archives)."""
    def walk(directory: str, depth: int):
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return
        if any(e.name == leaf for e in entries):
            yield directory
        if depth < max_depth:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and walked(entry.name):
                    yield from walk(entry.path, depth + 1)
    yield from walk(root, 0)


class LocalStore(StageStore):
    links = True
    def __init__(self, root: str):
        self.root = root

    def key(self, path: str) -> str:
        """One spelling per directory (to compare paths)."""
        return os.path.abspath(path)

    def relative(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def entries(self, directory: str) -> list[str]:
        """Names in a directory but the archive, sorted."""
        return manifest.workspace_entries(directory)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def escapes(self, stage_dir: str, rel: str) -> str | None:
        """Where a stage dir's file (``rel``) really is, when a symbolic link
        takes it out of the stage dir; None when it is inside (trust.escapes)."""
        return trust.escapes(stage_dir, rel)

    def size(self, path: str) -> int | None:
        """A file's size; None when it isn't there."""
        if not os.path.exists(path):
            return None
        return os.path.getsize(path)

    def files(self, directory: str) -> list[str]:
        """Every file below a directory (archives too), relative to it, sorted."""
        return sorted(os.path.relpath(os.path.join(top, name), directory)
                      for top, _, names in os.walk(directory) for name in names)

    def marker_dirs(self, leaf: str = MANIFEST) -> list[str]:
        return sorted(manifests_under(self.root, leaf=leaf))

    def manifest(self, directory: str) -> records.Manifest | None:
        """A directory's manifest; None if none; ManifestError if unusable."""
        return manifest.read(directory)

    parallel_reads = True

    def listed_manifests(self, refused=None):
        """A walk of the layout's fixed depth (``walk.listed``)."""
        return walk.listed(self.root)

    def manifest_groups(self) -> tuple[list[list[str]], bool]:
        """The root in parts that list on their own (``listed_in``), and
        whether there are enough for worker processes: a cold build lists
        and reads each part in one go (``walk.pair_groups``)."""
        return walk.pair_groups(self.root)

    def listed_in(self, group: list[str]) -> list[str]:
        """The manifests' directories in one part, in order, unstamped: the read stamps each."""
        return sorted(walk.manifests_below(group, stamps=False))

    def read_manifests(self, directories, stamps=None):
        """Each stamped from the file it was read from (``walk.read_manifests``)."""
        return walk.read_manifests(directories)

    def mtime(self, path: str) -> float:
        return os.stat(path).st_mtime

    def marker(self, directory: str) -> tuple[bytes, float] | None:
        try:
            with open(os.path.join(directory, RUNNING), "rb") as f:
                return f.read(), time.time() - os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None

    def archive(self, directory: str, keep: tuple[str, ...] = ()) -> str | None:
        """Entries are renamed one by one (a symbolic link moves as a link,
        never followed); an ``.attempts`` that is a link is refused
        (ManifestError). An archive cut short (its ``ARCHIVING`` note still
        there) is where the next one goes on."""
        entries = [e for e in manifest.workspace_entries(directory) if e not in keep]
        attempts_dir = os.path.join(directory, ATTEMPTS)
        if os.path.islink(attempts_dir):   # it would move the workspace out of the stage dir
            raise manifest.ManifestError(
                f"{attempts_dir} is a symbolic link (to {os.path.realpath(attempts_dir)}); waypost archives only "
                "into a directory of the stage directory's own: remove the link")
        if not entries:
            return None
        os.makedirs(attempts_dir, exist_ok=True)
        names = os.listdir(attempts_dir)
        n = archive_number(names, [e for e in names if os.path.exists(os.path.join(attempts_dir, e, ARCHIVING))])
        target = os.path.join(attempts_dir, str(n))
        os.makedirs(target, exist_ok=True)
        note = os.path.join(target, ARCHIVING)
        writes.whole(note, json.dumps(entries).encode())
        for entry in entries:
            _move(os.path.join(directory, entry), os.path.join(target, entry))
        os.unlink(note)
        return os.path.relpath(target, directory)

    def archive_from(self, directory: str, base: str, paths: list[str], into: str | None = None) -> str | None:
        """(The outputs may be on another filesystem than the record: a copy then.)"""
        import shutil

        present = [p for p in paths if os.path.lexists(os.path.join(base, p))]
        if not present:
            return into
        if into is None:
            attempts_dir = os.path.join(directory, ATTEMPTS)
            os.makedirs(attempts_dir, exist_ok=True)
            names = os.listdir(attempts_dir)
            n = archive_number(names, [e for e in names if os.path.exists(os.path.join(attempts_dir, e, ARCHIVING))])
            into = os.path.relpath(os.path.join(attempts_dir, str(n)), directory)
        for path in present:
            moved = os.path.join(directory, into, path)
            os.makedirs(os.path.dirname(moved), exist_ok=True)
            shutil.move(os.path.join(base, path), moved)
        return into

    def heartbeat(self, path: str) -> None:
        os.utime(path)

    def bring(self, source: StageStore, source_dir: str, stage_dir: str,
              outputs: list[dict]) -> tuple[str, dict[str, str]]:
        """Each file fetched (copied; from a bucket, downloaded) under a
        temporary name, checked (size and sha256), then renamed into place."""
        copies = [(_target_file(stage_dir, out["path"]), out, layout.join(source_dir, out["path"]))
                  for out in outputs]
        how, crc32cs = place_checked(copies, lambda out, temp: source.fetch(source_dir, out["path"], temp))
        return " and ".join(sorted(how)) or "nothing", crc32cs

    def local_file(self, stage_dir: str, rel: str) -> str:
        """A stage dir's file, which must be inside it (a link that stays
        inside is followed to it; one that leads out, or to nothing, is
        refused: ManifestError)."""
        try:
            return trust.resolve_inside(stage_dir, rel, "a reused output")
        except trust.Untrusted as exc:
            raise manifest.ManifestError(f"{exc}; not reused") from None

    def fetch(self, stage_dir: str, rel: str, local: str) -> str:
        """Copy a stage dir's file to a local path; says how. Only a file
        inside the stage dir (a link that stays inside is followed to it)."""
        return copy_file(self.local_file(stage_dir, rel), local)

    def write_manifest(self, directory: str, record: dict) -> None:
        path = manifest.manifest_path(directory)
        manifest.write_json_atomic(path, records.checked("manifest", record, path))

    def remove(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)

    def write_marker(self, path: str, text: str) -> None:
        writes.whole(path, text.encode())

    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything below it (links as links: never
        what they point to)."""
        import shutil  # here: the step runner imports this module, and rarely removes a tree
        shutil.rmtree(path)

    def file_sizes(self, directory: str) -> dict[str, int]:
        """Every file below a directory (a link counts as itself, never
        followed), relative to it, with its size."""
        found: dict[str, int] = {}

        def walk(top: str, rel: str) -> None:
            try:
                entries = list(os.scandir(top))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                return
            for entry in entries:
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir(follow_symlinks=False):
                    walk(entry.path, name)
                else:
                    try:
                        found[name] = entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        walk(directory, "")
        return found

    def remove_files(self, directory: str, names: list[str]) -> None:
        """Remove some files below a directory (relative paths; links as
        links), then the directories below it left empty. The modification
        times of the directories that remain are left as they were (an
        archive's age is its newest time)."""
        times: dict[str, tuple[float, float]] = {}
        for name in names:
            parent = os.path.dirname(os.path.join(directory, name))
            while parent not in times and (parent == directory or parent.startswith(directory + os.sep)):
                try:
                    st = os.lstat(parent)
                except OSError:
                    break
                times[parent] = (st.st_atime, st.st_mtime)
                if parent == directory:
                    break
                parent = os.path.dirname(parent)
        for name in names:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                continue
        for parent in sorted(times, key=len, reverse=True):
            if parent != directory:
                try:
                    os.rmdir(parent)
                    continue
                except OSError:   # not empty (or gone)
                    pass
            try:
                os.utime(parent, times[parent], follow_symlinks=False)
            except OSError:
                continue

    def archives(self, directory: str) -> list[str]:
        """The numbered archives of a stage dir (``.attempts/<n>``), oldest first."""
        attempts = os.path.join(directory, ATTEMPTS)
        if os.path.islink(attempts):   # never followed out of the stage dir (nor pruned through)
            return []
        try:
            names = os.listdir(attempts)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        return sorted((n for n in names if n.isascii() and n.isdigit() and os.path.isdir(os.path.join(attempts, n))
                       and not os.path.islink(os.path.join(attempts, n))), key=int)

    def usage(self, path: str) -> tuple[int, int, float | None]:
        """(bytes, files, newest modification time) of everything below a
        directory: the size of each file (a link counts as itself), and the
        latest mtime of the directory and its files (epoch seconds; None
        when it isn't there)."""
        try:
            newest = os.lstat(path).st_mtime
        except OSError:
            return 0, 0, None
        total = count = 0
        for top, _, names in os.walk(path):
            for name in names:
                try:
                    st = os.lstat(os.path.join(top, name))
                except OSError:
                    continue
                total, count, newest = total + st.st_size, count + 1, max(newest, st.st_mtime)
        return total, count, newest

    def sha256(self, path: str) -> str:
        return manifest.sha256_file(path)

    def digests(self, path: str) -> tuple[str, str | None]:
        """(sha256, crc32c) of a file, from one read."""
        return manifest.digests_file(path)


class LocalSnapshot(LocalStore):
    """A LocalStore that lists each directory once and answers from that
    listing (names and types from one ``scandir``, no stat per name, no
    opening of files that aren't there): what changes after a directory was
    listed is not seen, nor a directory made below the root after its parent
    was listed. For commands that only look (``waypost status``, and the
    planning, which looks at each stage directory once)."""

    def __init__(self, root: str):
        super().__init__(root)
        self._listings: dict[str, dict[str, os.DirEntry]] = {}
        self._top = os.path.normpath(root)
        self._below = "" if self._top == "." else self._top.rstrip("/") + "/"
        self._unlisted: set[str] = set()   # directories there that could not be listed (permissions)
        self._absent: set[str] = set()     # directories known not to be there (_missing)

    def _listing(self, directory: str) -> dict[str, os.DirEntry]:
        found = self._listings.get(directory)
        if found is None:
            found = None if self._missing(directory) else self._scan(directory)
            if found is None:   # not there: its parent's listing says so (nothing kept per directory)
                return _NOTHING
        return found

    def _scan(self, directory: str) -> dict[str, os.DirEntry]:
        try:
            with os.scandir(directory) as it:
                found = {entry.name: entry for entry in it}
        except (FileNotFoundError, NotADirectoryError):
            found = {}
        except PermissionError:
            found = {}
            self._unlisted.add(directory)
        self._listings[directory] = found
        return found

    def _missing(self, directory: str) -> bool:
        """Is a directory below the root known not to be there from its
        parent's listing (listed once, as this store lists)? Then it costs no
        listing of its own: a planning asks about every stage directory, and
        those still to be done are not there."""
        if not directory.startswith(self._below) or (not self._below and directory.startswith(("/", ".."))):
            return False
        parent, name = os.path.split(directory)
        if not parent or not name or name in (".", "..") or os.path.normpath(directory) != directory:
            return False
        if parent in self._absent or (parent != self._top and parent not in self._listings
                                      and self._missing(parent)):
            self._absent.add(parent)
            return True
        listing = self._listings.get(parent)
        if listing is None:
            listing = self._scan(parent)
        if parent in self._unlisted:
            return False
        entry = listing.get(name)
        try:
            return entry is None or not entry.is_dir()
        except OSError:
            return False

    def _entry(self, path: str) -> os.DirEntry | None:
        directory, name = os.path.split(path)
        return self._listing(directory).get(name)

    def entries(self, directory: str) -> list[str]:
        return sorted(name for name in self._listing(directory) if name != ATTEMPTS)

    def isdir(self, path: str) -> bool:
        entry = self._entry(path)
        return entry is not None and entry.is_dir()

    def isfile(self, path: str) -> bool:
        entry = self._entry(path)
        return entry is not None and entry.is_file()

    def exists(self, path: str) -> bool:
        entry = self._entry(path)
        return entry is not None and (not entry.is_symlink() or os.path.exists(path))

    def size(self, path: str) -> int | None:
        entry = self._entry(path)
        try:
            return None if entry is None else entry.stat().st_size
        except OSError:   # a dangling link
            return None

    def manifest(self, directory: str) -> records.Manifest | None:
        return manifest.read(directory) if MANIFEST in self._listing(directory) else None

    def mtime(self, path: str) -> float:
        entry = self._entry(path)
        if entry is None:
            raise FileNotFoundError(path)
        return entry.stat().st_mtime

    def marker(self, directory: str) -> tuple[bytes, float] | None:
        return super().marker(directory) if RUNNING in self._listing(directory) else None


_NOTHING = MappingProxyType({})   # the listing of a directory that is not there


def _move(source: str, target: str) -> None:
    """Rename ``source`` to ``target`` in the same tree; where an archive
    cut short left part of a directory at ``target``, what is left of it
    goes in file by file (then its empty directories go)."""
    if not os.path.lexists(target) or not os.path.isdir(target) or os.path.islink(source) \
            or not os.path.isdir(source):
        os.replace(source, target)
        return
    for name in os.listdir(source):
        _move(os.path.join(source, name), os.path.join(target, name))
    os.rmdir(source)


def place_checked(copies: list[tuple[str, dict, str]], fetch) -> tuple[set[str], dict[str, str]]:
    """Each of ``copies`` (a target path, its manifest entry, the source's
    name for errors) fetched by ``fetch(entry, temp)`` (which says how)
    under a temporary name beside its target, checked against the entry's
    size and sha256, then all renamed into place; where one fails, none is
    (ManifestError, OSError) and no temporary file is left. Returns how
    they came, and the crc32c of each by its entry's ``path``."""
    staged, how, crc32cs = [], set(), {}
    try:
        for target, entry, name in copies:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            temp = os.path.join(os.path.dirname(target), f".tmp-reuse-{os.path.basename(target)}")
            staged.append((temp, target))
            how.add(fetch(entry, temp))
            size, (digest, crc32c) = os.path.getsize(temp), manifest.digests_file(temp)
            if crc32c and "path" in entry:
                crc32cs[entry["path"]] = crc32c
            if size != entry.get("size") or digest != entry.get("sha256"):
                raise manifest.ManifestError(f"{name}: differs from its manifest (size {size} vs "
                                             f"{entry.get('size')}, or checksum)")
    except BaseException:
        for temp, _ in staged:
            if os.path.exists(temp):
                os.unlink(temp)
        raise
    for temp, target in staged:
        os.replace(temp, target)
    return how, crc32cs


def _target_file(stage_dir: str, rel: str) -> str:
    """Where a reused output goes: below the stage dir, through no link out of it."""
    target = os.path.join(stage_dir, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not trust.inside(os.path.realpath(os.path.dirname(target)), os.path.realpath(stage_dir)):
        raise manifest.ManifestError(f"{target}: a symbolic link in the stage directory leads out of it; not reused")
    return target


FICLONE = 0x40049409   # linux/fs.h: share the source's blocks (btrfs, XFS, ...) until either is written


def copy_file(source: str, target: str) -> str:
    """A copy of ``source`` at ``target`` that leaves the source as it was:
    a reflink where the filesystem makes one, else the bytes (``copyfile``:
    no permission bits, times or xattrs, which a mounted bucket refuses).
    Says how."""
    import fcntl
    with open(source, "rb") as src, open(target, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
            return "reflinked"
        except OSError:
            pass
    import shutil
    shutil.copyfile(source, target)
    return "copied"
