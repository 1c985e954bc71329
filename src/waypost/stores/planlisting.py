"""The one listing of a bucket root a Snakemake planning answers from: one
listing of the whole root answers every "does this stage file exist?" of a
planning (1,000 single requests take seconds; one listing of 5,000 objects
~0.15 s). Made once per process through the root's client
(``bucketclient``), for any scheme."""

from __future__ import annotations

from waypost.stores.base import mtime_of
from waypost.stores.bucketclient import filesystem

# Bucket roots a Snakemake run plans over, and their listings.
_roots: set[str] = set()
_listings: dict[str, dict[str, dict]] = {}
_directories: dict[int, dict[str, float]] = {}   # id of a listing → its directories (see directories)


def reset() -> None:
    """Forget the roots and their listings (``stores.reset``: another service)."""
    _roots.clear()
    _listings.clear()


def register_root(url: str) -> None:
    _roots.add(url.rstrip("/"))


def root_of(url: str) -> str | None:
    """The registered root that holds ``url``, if any."""
    found = [r for r in _roots if url == r or url.startswith(r + "/")]
    return max(found, key=len) if found else None


def listing(root: str) -> dict[str, dict]:
    """Every object under a bucket root (fsspec name → info), listed once per
    process: a snapshot for planning, never for deciding anything later.
    Objects whose names no local path can stand for (``..``, an empty or
    ``.`` part, a backslash: see ``plain_names``) are not in it."""
    if root not in _listings:
        fs, path = filesystem(root)
        try:
            found = fs.find(path, detail=True)
        except FileNotFoundError:
            found = {}
        _listings[root] = {name: found[name] for name in plain_names(path, found)}
    return _listings[root]


def plain_names(prefix: str, names) -> list[str]:
    """The object names (fsspec paths) below ``prefix`` whose part below it
    is a plain relative path (trust.relative_problem): the ones waypost may
    turn into a local path or a Snakemake wildcard."""
    from waypost.model.trust import relative_problem
    start = len(prefix.rstrip("/")) + 1
    return [name for name in names if name.startswith(prefix.rstrip("/") + "/") and not relative_problem(name[start:])]


def listed(url: str) -> bool:
    """Is ``url`` in its registered root's listing?"""
    return filesystem(url)[1] in listing(root_of(url))


def listed_info(url: str) -> dict | None:
    """``url``'s entry in its registered root's listing (None: not there)."""
    return listing(root_of(url)).get(filesystem(url)[1])


def directories(root: str) -> dict[str, float]:
    """The directories of a bucket root's listing (fsspec name, the root's
    own and those above it left out) → the newest mtime below each: what
    a ``directory()`` output is in a bucket (a prefix of objects). Made once
    per listing."""
    found = listing(root)
    if id(found) not in _directories:
        top = filesystem(root)[1].rstrip("/")
        dirs: dict[str, float] = {}
        for name, info in found.items():
            stamp = mtime_of(info)
            parent = name.rsplit("/", 1)[0]
            while parent != top and parent.startswith(top + "/"):
                if dirs.get(parent, -1.0) >= stamp:
                    break
                dirs[parent] = stamp
                parent = parent.rsplit("/", 1)[0]
        _directories.clear()
        _directories[id(found)] = dirs
    return _directories[id(found)]
