"""The listing of a bucket prefix a ``BucketStore`` keeps: its objects,
indexed by directory, and what the listing answers without a request
(which objects and directories there are, their sizes, times and
crc32cs, a directory's archives and usage)."""

from __future__ import annotations

from bisect import bisect_left

from waypost.model import layout
from waypost.model.layout import ATTEMPTS, MANIFEST
from waypost.stores.base import mtime_of, walked


class BucketListing:
    """A snapshot of the objects below ``root`` (a bucket's URL, ``gs://bucket/prefix``):
    ``_index`` makes it from their infos (relative name → info)."""

    root: str

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

    def size(self, path: str) -> int | None:
        info = self.objects.get(self._rel(path))
        return None if info is None else info["size"]

    def files(self, directory: str) -> list[str]:
        rel = self._rel(directory)
        if rel is None:
            return []
        prefix = self._in(rel, "")
        return sorted(name[len(prefix):] for name in self.objects if name.startswith(prefix))

    def marker_dirs(self, leaf: str = MANIFEST) -> list[str]:
        found = []
        for name in self.objects:
            parts = name.split("/")
            if parts[-1] == leaf and len(parts) <= 7 and all(walked(p) for p in parts[:-1]):
                found.append(layout.join(self.root, *parts[:-1]))
        return sorted(found)

    def mtime(self, path: str) -> float:
        info = self.objects.get(self._rel(path))
        if info is None:
            raise FileNotFoundError(path)
        return mtime_of(info)

    def bucket_of(self, directory: str) -> str:
        return directory.rstrip("/")

    def _under(self, rel: str) -> list[str]:
        """The names of the objects below a directory (relative to the root)."""
        if self._sorted is None:
            self._sorted = sorted(self.objects)
        prefix = self._in(rel, "")
        start = bisect_left(self._sorted, prefix)
        end = bisect_left(self._sorted, prefix + "\U0010ffff", start)
        return self._sorted[start:end]

    def file_sizes(self, directory: str) -> dict[str, int]:
        rel = self._rel(directory)
        if not rel:
            return {}
        prefix = self._in(rel, "")
        return {name[len(prefix):]: int(self.objects[name].get("size") or 0) for name in self._under(rel)}

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

    def crc32c(self, path: str) -> str | None:
        """The object's crc32c as the listing has it (base64 of the 4
        big-endian bytes, as manifests record it); None if it isn't there."""
        info = self.objects.get(self._rel(path))
        return None if info is None else info.get("crc32c")


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
