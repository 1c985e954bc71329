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
