"""The stage directories under a root, the same way on disk and in a bucket.

``open(root)`` gives a tree over a local path (``os`` calls, as they come)
or over a ``gs://bucket/prefix`` (one listing of the prefix when the tree is
made; manifests and ``_running.json`` markers read in one concurrent batch
the first time one is asked for; archiving a stage a server-side move). The
commands that look at or steer the file state (status, rerun, adopt, plan,
verify, cron, prune) are written once against this interface.

Paths in and out are the user's: local paths as given (``results/...``), or
gs:// URLs under the root. A bucket tree is a snapshot: what others write
after it was listed is not in it (what it archives or writes itself is).
"""

from __future__ import annotations

import builtins
import os
import time
from bisect import bisect_left

from . import layout, manifest, records, storage, trust
from .layout import ATTEMPTS, LOGS, MANIFEST, RUNNING


def open(root: str, snapshot: bool = False) -> Tree:
    """A tree over ``root``; with ``snapshot``, a local one lists each
    directory once (for commands that only look, like a bucket tree)."""
    if storage.is_remote(root):
        return BucketTree(root)
    return LocalSnapshot(root) if snapshot else LocalTree(root)


_planning: dict[str, tuple[dict, BucketTree]] = {}   # root → (the planning's listing, a tree over it)


def over(stage_dir: str) -> Tree:
    """A tree to look at one stage directory: in a bucket, the planning's
    listing of its root when this process made one (no request), else a
    listing of the directory; on disk, the directory as it is."""
    if storage.is_remote(stage_dir):
        root = storage.root_of(stage_dir)
        if root is None:
            return BucketTree(stage_dir)
        found = storage.listing(root)
        if root not in _planning or _planning[root][0] is not found:
            _planning[root] = (found, BucketTree(root, found=found))
        return _planning[root][1]
    return LocalTree(stage_dir)


def _walked(name: str) -> bool:
    """Directories a search for manifests goes into (not archives, not logs)."""
    return not name.startswith((".", LOGS))


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
                if entry.is_dir(follow_symlinks=False) and _walked(entry.name):
                    yield from walk(entry.path, depth + 1)
    yield from walk(root, 0)


class Tree:
    """What both kinds of tree answer; see LocalTree for each method."""

    remote = False
    root: str

    def state_dirs(self, stage_dir: str) -> list[tuple[str | None, str]]:
        """The directories that hold a stage's state: ``[(None, stage_dir)]``,
        or ``(instance, dir)`` for each instance of a stage with instances
        (and no files of its own)."""
        entries = self.entries(stage_dir)
        if any(manifest.is_engine_file(e) or self.isfile(layout.join(stage_dir, e)) for e in entries):
            return [(None, stage_dir)]
        instances = [e for e in entries if layout.is_valid_name(e) and self.isdir(layout.join(stage_dir, e))]
        return [(name, layout.join(stage_dir, name)) for name in instances] or [(None, stage_dir)]

    def describe(self, stage_dir: str, files: list[str]) -> list[dict]:
        """Size, sha256 and crc32c of files of a stage dir (relative paths),
        as a manifest's ``outputs`` (see manifest.describe_outputs)."""
        described = []
        for f in files:
            path = layout.join(stage_dir, f)
            sha256, crc32c = self.digests(path)
            described.append({"path": f, "size": self.size(path), "sha256": sha256,
                              **({"crc32c": crc32c} if crc32c else {})})
        return described


class LocalTree(Tree):
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

    def manifest_dirs(self) -> list[str]:
        """Every directory with a manifest (stages and instances; not archives)."""
        return list(manifests_under(self.root))

    def manifest(self, directory: str) -> dict | None:
        """A directory's manifest; None if none; ManifestError if unusable."""
        return manifest.read(directory)

    def mtime(self, path: str) -> float:
        """A file's modification time (OSError when it isn't there)."""
        return os.stat(path).st_mtime

    def marker(self, directory: str) -> tuple[bytes, float] | None:
        """A stage dir's ``_running.json`` and the age of its heartbeat (its
        mtime); None without one."""
        try:
            with builtins.open(os.path.join(directory, RUNNING), "rb") as f:   # this module's open() is a tree's
                return f.read(), time.time() - os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None

    def archive(self, directory: str, keep: tuple[str, ...] = ()) -> str | None:
        """Move what is in a stage directory into ``.attempts/<n>/``; returns
        ``.attempts/<n>``, or None when there was nothing."""
        return manifest.archive_workspace(directory, keep=keep)

    def write_manifest(self, directory: str, record: dict) -> None:
        path = manifest.manifest_path(directory)
        manifest.write_json_atomic(path, records.checked("manifest", record, path))

    def remove(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)

    def write_marker(self, path: str, text: str) -> None:
        """A small engine file (a planner's marker), dated now."""
        with builtins.open(path, "w") as f:   # this module's open() is a tree's
            f.write(text)

    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything below it (links as links: never
        what they point to)."""
        import shutil
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


class LocalSnapshot(LocalTree):
    """A LocalTree that lists each directory once and answers from that
    listing (names and types from one ``scandir``, no stat per name, no
    opening of files that aren't there): what changes after a directory was
    listed is not seen. For commands that only look (``waypost status``)."""

    def __init__(self, root: str):
        super().__init__(root)
        self._listings: dict[str, dict[str, os.DirEntry]] = {}

    def _listing(self, directory: str) -> dict[str, os.DirEntry]:
        if directory not in self._listings:
            try:
                with os.scandir(directory) as it:
                    self._listings[directory] = {entry.name: entry for entry in it}
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                self._listings[directory] = {}
        return self._listings[directory]

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

    def manifest(self, directory: str) -> dict | None:
        return manifest.read(directory) if MANIFEST in self._listing(directory) else None

    def mtime(self, path: str) -> float:
        entry = self._entry(path)
        if entry is None:
            raise FileNotFoundError(path)
        return entry.stat().st_mtime

    def marker(self, directory: str) -> tuple[bytes, float] | None:
        return super().marker(directory) if RUNNING in self._listing(directory) else None


def _written(size: int) -> dict:
    """The listing entry of an object this tree wrote now."""
    from snakemake_storage_plugin_waypost import MTIME_KEY
    return {"size": size, "metadata": {MTIME_KEY: repr(time.time())}}


class BucketTree(Tree):
    remote = True

    def __init__(self, root: str, found: dict[str, dict] | None = None):
        """A listing of ``root``; or, with ``found``, one made already
        (fsspec name → info: the planning's)."""
        from . import remote_stage

        self.root = root.rstrip("/")
        self.fs, self.base = storage.filesystem(self.root)
        if found is None:
            remote_stage.check_bucket(self.root)
            try:
                found = self.fs.find(self.base, detail=True)
            except FileNotFoundError:
                found = {}
        objects, self.refused = {}, {}   # refused: names no path can stand for, left alone (trust)
        for name, info in found.items():
            if name.startswith(self.base + "/") and info.get("type", "file") == "file":
                rel = name[len(self.base) + 1:]
                problem = trust.relative_problem(rel)
                if problem:
                    self.refused[rel] = problem
                else:
                    objects[rel] = info
        self._index(objects)
        self._read: dict[str, dict[str, bytes | Exception]] = {}  # MANIFEST / RUNNING → their contents

    def _index(self, objects: dict[str, dict]) -> None:
        self.objects = objects                      # relative name → object info
        self._sorted: list[str] | None = None       # their names, sorted (made when asked for)
        self.children: dict[str, set[str]] = {}     # relative dir ("" the root) → names in it
        for name in objects:
            parts = name.split("/")
            for depth in range(len(parts)):
                self.children.setdefault("/".join(parts[:depth]), set()).add(parts[depth])

    def _rel(self, path: str) -> str | None:
        """``path`` relative to the root ("" for the root); None if outside."""
        path = path.rstrip("/")
        if path == self.root:
            return ""
        return path[len(self.root) + 1:] if path.startswith(self.root + "/") else None

    @staticmethod
    def _in(rel: str, name: str) -> str:
        return f"{rel}/{name}" if rel else name

    def key(self, path: str) -> str:
        return path.rstrip("/")

    def relative(self, path: str) -> str:
        rel = self._rel(path)
        return path if rel is None else rel

    def entries(self, directory: str) -> list[str]:
        rel = self._rel(directory)
        return sorted(self.children.get(rel, set()) - {ATTEMPTS}) if rel is not None else []

    def isdir(self, path: str) -> bool:
        rel = self._rel(path)
        return rel is not None and rel in self.children

    def isfile(self, path: str) -> bool:
        return self._rel(path) in self.objects

    def exists(self, path: str) -> bool:
        return self._rel(path) in self.objects

    def escapes(self, stage_dir: str, rel: str) -> str | None:
        return None   # objects have no links

    def size(self, path: str) -> int | None:
        info = self.objects.get(self._rel(path))
        return None if info is None else info["size"]

    def files(self, directory: str) -> list[str]:
        rel = self._rel(directory)
        if rel is None:
            return []
        prefix = self._in(rel, "")
        return sorted(name[len(prefix):] for name in self.objects if name.startswith(prefix))

    def manifest_dirs(self) -> list[str]:
        found = []
        for name in self.objects:
            parts = name.split("/")
            if parts[-1] == MANIFEST and len(parts) <= 7 and all(_walked(p) for p in parts[:-1]):
                found.append(layout.join(self.root, *parts[:-1]))
        return sorted(found)

    def _contents(self, leaf: str) -> dict[str, bytes | Exception]:
        """Every workspace file named ``leaf`` in the tree, read in one batch."""
        if leaf not in self._read:
            names = [n for n in self.objects
                     if n.rsplit("/", 1)[-1] == leaf and not any(p.startswith(".") for p in n.split("/"))]
            big = {n for n in names if int(self.objects[n].get("size") or 0) > trust.MAX_MANIFEST_BYTES}
            got = storage.read_many(self.fs, [f"{self.base}/{n}" for n in names if n not in big]) if names else {}
            self._read[leaf] = {n: trust.Untrusted(trust.too_big(f"{self.root}/{n}", self.objects[n]["size"]))
                                if n in big else got[f"{self.base}/{n}"] for n in names}
        return self._read[leaf]

    def manifest(self, directory: str) -> dict | None:
        rel = self._rel(directory)
        url = layout.join(directory.rstrip("/"), MANIFEST)
        if rel is None:  # another root's (an input from elsewhere): read it alone
            return manifest.load(directory) if storage.is_remote(directory) else manifest.read(directory)
        name = self._in(rel, MANIFEST)
        if name not in self.objects:
            return None
        if int(self.objects[name].get("size") or 0) > trust.MAX_MANIFEST_BYTES:
            raise manifest.ManifestError(f"{trust.too_big(url, self.objects[name]['size'])}; {manifest.UNUSED}")
        if any(part.startswith(".") for part in name.split("/")):   # in an archive: not in the batch
            try:
                text = self.fs.cat_file(f"{self.base}/{name}")
            except Exception as exc:
                text = exc
        else:
            text = self._contents(MANIFEST).get(name, FileNotFoundError(url))
        if isinstance(text, Exception):
            raise manifest.ManifestError(f"{url}: unreadable manifest ({text})")
        return manifest.parse(text, url)

    def mtime(self, path: str) -> float:
        info = self.objects.get(self._rel(path))
        if info is None:
            raise FileNotFoundError(path)
        from snakemake_storage_plugin_waypost import mtime_of  # an object's time (waypost-mtime)
        return mtime_of(info)

    def marker(self, directory: str) -> tuple[bytes, float] | None:
        rel = self._rel(directory)
        name = self._in(rel, RUNNING) if rel is not None else None
        if name not in self.objects:
            return None
        text = self._contents(RUNNING).get(name)
        if not isinstance(text, bytes):
            return b"", 0.0   # listed, gone or unreadable since: its writer is gone
        return text, time.time() - self.mtime(layout.join(self.root, name))

    def archive(self, directory: str, keep: tuple[str, ...] = ()) -> str | None:
        """Server-side (see remote_stage.archive_objects)."""
        from .remote_stage import archive_objects

        rel = self._rel(directory)
        prefix = self._in(rel, "")
        listing = {n[len(prefix):]: info for n, info in self.objects.items() if n.startswith(prefix)}
        target, moved = archive_objects(self.fs, self.base + ("/" + rel if rel else ""), listing, keep)
        if target:
            objects = dict(self.objects)
            for name in moved:
                objects[prefix + f"{target}/{name}"] = objects.pop(prefix + name)
            self._index(objects)
            for read in self._read.values():
                for name in moved:
                    read.pop(prefix + name, None)
        return target

    def write_manifest(self, directory: str, record: dict) -> None:
        rel = self._rel(directory)
        data = manifest.dumps(records.checked("manifest", record, layout.join(directory, MANIFEST))).encode()
        self.fs.pipe_file(f"{self.base}/{self._in(rel, MANIFEST)}", data)
        self._index({**self.objects, self._in(rel, MANIFEST): _written(len(data))})
        if MANIFEST in self._read:
            self._read[MANIFEST][self._in(rel, MANIFEST)] = data

    def write_marker(self, path: str, text: str) -> None:
        rel = self._rel(path)
        written = _written(len(text.encode()))
        self.fs.pipe_file(f"{self.base}/{rel}", text.encode(), metadata=written["metadata"])
        self._index({**self.objects, rel: written})

    def remove(self, path: str) -> None:
        rel = self._rel(path)
        if rel in self.objects:
            self.fs.rm_file(f"{self.base}/{rel}")
            self._index({n: i for n, i in self.objects.items() if n != rel})

    def _under(self, rel: str) -> list[str]:
        """The names of the objects below a directory (relative to the root)."""
        if self._sorted is None:
            self._sorted = sorted(self.objects)
        prefix = self._in(rel, "")
        start = bisect_left(self._sorted, prefix)
        end = bisect_left(self._sorted, prefix + "\U0010ffff", start)
        return self._sorted[start:end]

    def remove_tree(self, path: str) -> None:
        """Remove every object below a directory (one batch delete)."""
        rel = self._rel(path)
        if not rel:
            raise ValueError(f"{path}: not a directory under the root {self.root}")
        names = self._under(rel)
        if names:
            self.fs.rm([f"{self.base}/{n}" for n in names])
        gone = set(names)
        self._index({n: i for n, i in self.objects.items() if n not in gone})
        for read in self._read.values():
            for name in names:
                read.pop(name, None)

    def file_sizes(self, directory: str) -> dict[str, int]:
        rel = self._rel(directory)
        if not rel:
            return {}
        prefix = self._in(rel, "")
        return {name[len(prefix):]: int(self.objects[name].get("size") or 0) for name in self._under(rel)}

    def remove_files(self, directory: str, names: list[str]) -> None:
        """Remove some objects below a directory (relative names; one batch delete)."""
        rel = self._rel(directory)
        if not rel:
            raise ValueError(f"{directory}: not a directory under the root {self.root}")
        gone = {self._in(rel, name) for name in names} & set(self.objects)
        if gone:
            self.fs.rm([f"{self.base}/{n}" for n in sorted(gone)])
        self._index({n: i for n, i in self.objects.items() if n not in gone})
        for read in self._read.values():
            for name in gone:
                read.pop(name, None)

    def archives(self, directory: str) -> list[str]:
        rel = self._rel(directory)
        if rel is None:
            return []
        attempts = self._in(rel, ATTEMPTS)
        names = self.children.get(attempts, ())
        return sorted((n for n in names if n.isascii() and n.isdigit() and f"{attempts}/{n}" in self.children), key=int)

    def usage(self, path: str) -> tuple[int, int, float | None]:
        """(bytes, objects, newest object time) below a directory, from the
        listing (an archive's objects are written when it is made: a
        server-side move is a copy)."""
        rel = self._rel(path)
        if rel is None:
            return 0, 0, None
        total, count, newest = 0, 0, None
        for name in self._under(rel):
            info = self.objects[name]
            total, count = total + int(info.get("size") or 0), count + 1
            when = _epoch(info)
            if when is not None and (newest is None or when > newest):
                newest = when
        return total, count, newest

    def sha256(self, path: str) -> str:
        """Reads the object (nothing else can: GCS keeps crc32c and md5)."""
        with self.fs.open(storage.filesystem(path)[1], "rb") as f:
            return manifest.sha256_stream(f)

    def crc32c(self, path: str) -> str | None:
        """The object's crc32c as the listing has it (base64 of the 4
        big-endian bytes, as manifests record it); None if it isn't there."""
        info = self.objects.get(self._rel(path))
        return None if info is None else info.get("crc32c")

    def digests(self, path: str) -> tuple[str, str | None]:
        """The sha256 read from the object, the crc32c from the listing."""
        return self.sha256(path), self.crc32c(path)


def _epoch(info: dict) -> float | None:
    """An object's last write (epoch seconds) from its listing info."""
    when = info.get("mtime") or info.get("updated")
    if when is None:
        return None
    if isinstance(when, str):
        from datetime import datetime
        try:
            when = datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            return None
    return when.timestamp() if hasattr(when, "timestamp") else float(when)
