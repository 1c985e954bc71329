"""Where stage directories live: one ``StageStore`` interface (``base``),
chosen from the root by ``store_for``.

Backends: local disk or NFS (``local``), a ``gs://bucket/prefix`` read and
written through its API (``bucket``, over ``gcs``), and a bucket mounted on
the nodes (``mounted``). This module is the one place that maps a root to
its backend, and so the one that knows the ``gs://`` scheme: the rest of
waypost asks ``is_bucket_url`` and the store's capability flags.
"""

from __future__ import annotations

import os

SCHEME = "gs://"


def is_bucket_url(location: str) -> bool:
    """Is ``location`` a bucket's URL (read through its API), not a path?"""
    return str(location).startswith(SCHEME)


def is_absolute(location: str) -> bool:
    """A bucket's URL or an absolute path (not relative to a working directory)?"""
    return is_bucket_url(location) or os.path.isabs(str(location))


def listed_at_once(root: str) -> bool:
    """Is the root read from one listing of its bucket (a gs:// root, or a
    mount whose bucket is known), rather than directory by directory?"""
    if is_bucket_url(root):
        return True
    from .mounted import mount_of
    mount = mount_of(root)
    return mount is not None and mount.url is not None


def store_for(root: str, snapshot: bool = False, quiet: bool = False):
    """The store of a root: a bucket's URL through its API; a path on a
    mounted bucket through the mount and the bucket's API; any other path
    on disk (with ``snapshot``, listing each directory once: for commands
    that only look)."""
    if is_bucket_url(root):
        from .bucket import BucketStore
        return BucketStore(root)
    from .mounted import mount_of, open_mounted
    mount = mount_of(root)
    if mount is not None:
        return open_mounted(root, mount, quiet=quiet)
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
