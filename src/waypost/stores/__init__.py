"""Where stage directories live: one ``StageStore`` interface (``base``),
chosen from the root by ``store_for``.

Backends: local disk or NFS (``local``), a ``gs://bucket/prefix`` read and
written through its API (``bucket``, over ``gcs``), and a bucket mounted on
the nodes (``mounted``). This module is the one place that maps a root to
its backend: the rest of waypost asks the store's capability flags, and
spells locations (a path or a bucket's URL) with ``waypost.model.locations``
(re-exported here), never by looking at the scheme.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waypost.model.locations import (  # noqa: F401  (the stores' callers spell locations with these)
    SCHEME,
    absolute,
    below,
    is_absolute,
    is_bucket_url,
    join,
    needs_mirror,
    normalised,
    parent,
    resolve,
    shown,
    split_url,
)

if TYPE_CHECKING:
    from waypost.model.records import Manifest


def manifest_at(location: str) -> Manifest | None:
    """The manifest of one stage directory anywhere (a path or a bucket's
    URL), read alone; None when there is none; ManifestError when it is
    unusable or can't be read."""
    if is_bucket_url(location):
        from waypost.stores.bucket import read_manifest
        return read_manifest(location)
    from waypost.model.manifest import read
    return read(location)


def reach(root: str) -> None:
    """For a root read through an API, StorageError within seconds when its
    endpoint can't be reached (``gcs.probe``); for a path on a mount, how
    waypost serves it decided and said (``store_for``: a mount the config
    declares whose API can't be reached is a StorageError); nothing for
    another path."""
    if is_bucket_url(root):
        from waypost.stores.gcs import probe
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
        from waypost.stores.bucket import BucketStore
        return BucketStore(root)
    from waypost.stores.mounted import mount_of, open_mounted
    mount = mount_of(root)
    if mount is not None:
        return open_mounted(root, mount, quiet=quiet, reads=reads)
    from waypost.stores.local import LocalSnapshot, LocalStore
    return LocalSnapshot(root) if snapshot else LocalStore(root)


def on_a_bucket_mount(stage_dir: str) -> bool:
    """Is ``stage_dir`` on a mount that may serve a bucket (its mount
    table or the config names one)? A step runner there reads its stage
    directory's state through the bucket's API (``consistent``), so it
    needs site-packages."""
    if is_bucket_url(stage_dir):
        return False
    from waypost.stores.mounted import mount_of
    mount = mount_of(stage_dir)
    return mount is not None and mount.url is not None


def consistent(stage_dir: str) -> str:
    """Where to read a stage directory's state so that what other nodes
    wrote is seen: for one on a mount served through its bucket's API
    (``mounted.way_of``), the bucket's URL of it (a node's mount lists
    late, as long as its caches keep a listing: rclone's
    ``--dir-cache-time``, gcsfuse's TTLs); else ``stage_dir`` itself."""
    if is_bucket_url(stage_dir):
        return stage_dir
    import os

    from waypost.stores.mounted import mount_of, way_of
    mount = mount_of(stage_dir)
    if mount is None or mount.url is None:
        return stage_dir
    way = way_of(mount)
    if way.url is None:
        return stage_dir
    return way.url + os.path.realpath(stage_dir)[len(mount.point.rstrip("/")):]


def catch_up(stage_dir: str) -> None:
    """Wait (at most ``mounted.SETTLE_S``) until this node's mount lists
    every file its bucket lists in ``stage_dir`` (nothing to wait for off
    a bucket mount): what another node's attempt left there, read next
    through the mount."""
    url = consistent(stage_dir)
    if url == stage_dir:
        return
    from waypost.stores.bucket import BucketStore
    from waypost.stores.mounted import settle
    settle(stage_dir, [name for name in BucketStore(url).entries(url) if not name.startswith(".")])


_planning: dict[str, tuple] = {}   # root → (the planning's listing, a store over it)


def over(stage_dir: str):
    """A store to look at one stage directory: in a bucket, the planning's
    listing of its root when this process made one (no request), else a
    listing of the directory; on disk or a mount, the directory as it is
    (through the mount: a step runner, started without ``site``, reads its
    own stage directory with no bucket client)."""
    if not is_bucket_url(stage_dir):
        from waypost.stores.local import LocalStore
        return LocalStore(stage_dir)
    from waypost.stores import gcs
    from waypost.stores.bucket import BucketStore
    root = gcs.root_of(stage_dir)
    if root is None:
        return BucketStore(stage_dir)
    found = gcs.listing(root)
    if root not in _planning or _planning[root][0] is not found:
        _planning[root] = (found, BucketStore(root, found=found))
    return _planning[root][1]
