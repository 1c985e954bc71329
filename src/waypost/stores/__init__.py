"""Where stage directories live: one ``StageStore`` interface (``base``),
chosen from the root by ``store_for``.

Backends: local disk or NFS (``local``), a ``gs://bucket/prefix`` read and
written through its API (``bucket``, over ``gcs``), and a bucket mounted on
the nodes (``mounted``). This module is the one place that maps a root to
its backend, and so the one that knows the ``gs://`` scheme: the rest of
waypost asks the store's capability flags, and spells locations (a path or
a bucket's URL) with the functions below, never by looking at the scheme.
"""

from __future__ import annotations

import os
import posixpath

SCHEME = "gs://"


def is_bucket_url(location: str) -> bool:
    """Is ``location`` a bucket's URL (read through its API), not a path?"""
    return str(location).startswith(SCHEME)


def is_absolute(location: str) -> bool:
    """A bucket's URL or an absolute path (not relative to a working directory)?"""
    return is_bucket_url(location) or os.path.isabs(str(location))


def needs_mirror(location: str) -> bool:
    """Is ``location`` reached only through an API (a bucket's URL), so that
    a step works on a local copy of it (``stores.mirror``), rather than a
    path a step reads and writes itself (disk, NFS, a mounted bucket)?"""
    return is_bucket_url(location)


def split_url(location: str) -> tuple[str, str] | None:
    """(bucket, object name) of a bucket's URL; None for a path."""
    if not is_bucket_url(location):
        return None
    bucket, _, name = str(location)[len(SCHEME):].partition("/")
    return bucket, name


def join(location: str, *parts: str) -> str:
    """``parts`` below a path or a bucket's URL."""
    if is_bucket_url(location):
        return "/".join([location.rstrip("/"), *parts])
    return os.path.join(location, *parts)


def absolute(location: str) -> str:
    """One spelling of a location: a bucket's URL without a trailing slash,
    or an absolute, normalised path."""
    return location.rstrip("/") if is_bucket_url(location) else os.path.abspath(location)


def resolve(base: str, location: str) -> str:
    """``location`` as it is when absolute (a URL or an absolute path), else
    below ``base``; normalised (``..`` and ``.`` undone)."""
    if is_absolute(location):
        return normalised(location)
    return normalised(join(base, location))


def normalised(location: str) -> str:
    if is_bucket_url(location):
        return SCHEME + posixpath.normpath(location[len(SCHEME):])
    return os.path.normpath(location)


def below(root: str, location: str) -> str | None:
    """``location`` relative to ``root`` (both paths, or both URLs); None
    when it is not below it."""
    if is_bucket_url(root):
        top = root.rstrip("/")
        return location[len(top) + 1:] if str(location).startswith(top + "/") else None
    rel = os.path.relpath(location, root)
    return None if rel == "." or rel.startswith("..") else rel


def parent(location: str) -> str:
    """The directory holding a file or directory (of a path or a URL)."""
    if is_bucket_url(location):
        return location.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(location)


def shown(location: str) -> str:
    """A location as the commands print it: a path below the working
    directory relative to it, anything else as it is."""
    if is_bucket_url(location) or not os.path.isabs(location):
        return location
    here = os.getcwd().rstrip(os.sep) + os.sep
    return os.path.relpath(location) if location.startswith(here) else location


def manifest_at(location: str) -> dict | None:
    """The manifest of one stage directory anywhere (a path or a bucket's
    URL), read alone; None when there is none; ManifestError when it is
    unusable or can't be read."""
    if is_bucket_url(location):
        from .bucket import read_manifest
        return read_manifest(location)
    from ..manifest import read
    return read(location)


def reach(root: str) -> None:
    """For a root read through an API, StorageError within seconds when its
    endpoint can't be reached (``gcs.probe``); for a path on a mount, how
    waypost serves it decided and said (``store_for``: a mount the config
    declares whose API can't be reached is a StorageError); nothing for
    another path."""
    if is_bucket_url(root):
        from .gcs import probe
        probe(root)
    else:
        store_for(root)


def listed_at_once(root: str) -> bool:
    """Is the root read from one listing of its bucket (a gs:// root, or a
    mount served through its bucket's API), rather than directory by
    directory (so, fastest by worker processes)?"""
    return is_bucket_url(root) or not store_for(root, quiet=True).parallel_reads


def store_for(root: str, snapshot: bool = False, quiet: bool = False, reads: bool = True):
    """The store of a root: a bucket's URL through its API; a path on a
    mount through the mount, and through the bucket's API when the mount is
    known to serve one that this process can reach (``mounted.way_of``,
    said once unless ``quiet``); any other path on disk (with ``snapshot``,
    listing each directory once: for commands that only look). Without
    ``reads`` (a step runner's own stage directory: it only writes there) a
    mount is taken as it is, nothing checked."""
    if is_bucket_url(root):
        from .bucket import BucketStore
        return BucketStore(root)
    from .mounted import mount_of, open_mounted
    mount = mount_of(root)
    if mount is not None:
        return open_mounted(root, mount, quiet=quiet, reads=reads)
    from .local import LocalSnapshot, LocalStore
    return LocalSnapshot(root) if snapshot else LocalStore(root)


_planning: dict[str, tuple] = {}   # root → (the planning's listing, a store over it)


def over(stage_dir: str):
    """A store to look at one stage directory: in a bucket, the planning's
    listing of its root when this process made one (no request), else a
    listing of the directory; on disk or a mount, the directory as it is
    (through the mount: a step runner, started without ``site``, reads its
    own stage directory with no bucket client)."""
    if not is_bucket_url(stage_dir):
        from .local import LocalStore
        return LocalStore(stage_dir)
    from . import gcs
    from .bucket import BucketStore
    root = gcs.root_of(stage_dir)
    if root is None:
        return BucketStore(stage_dir)
    found = gcs.listing(root)
    if root not in _planning or _planning[root][0] is not found:
        _planning[root] = (found, BucketStore(root, found=found))
    return _planning[root][1]
