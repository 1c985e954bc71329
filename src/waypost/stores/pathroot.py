"""The backend of a root that is a path: local disk or NFS (``local``), or
a bucket mounted on the nodes (``mounted``: through the mount, or through
the bucket's API when the mount is known to serve one this process can
reach, ``mounted.way_of``). Which of them is the mount table's answer for
the path, asked only when a store is wanted."""

from __future__ import annotations

import os

from waypost.stores.base import Backend


class PathRoot(Backend):
    """A path: on disk, or on a mount (as the mount table or the config says)."""

    def store(self, root: str, snapshot: bool = False, quiet: bool = False, reads: bool = True):
        from waypost.stores.mounted import mount_of, open_mounted
        mount = mount_of(root)
        if mount is not None:
            return open_mounted(root, mount, quiet=quiet, reads=reads)
        from waypost.stores.local import LocalSnapshot, LocalStore
        return LocalSnapshot(root) if snapshot else LocalStore(root)

    def manifest_at(self, location: str):
        from waypost.model.manifest import read
        return read(location)

    def over(self, stage_dir: str):
        """The directory as it is (through a mount: a step runner, started
        without ``site``, reads its own stage directory with no bucket client)."""
        from waypost.stores.local import LocalStore
        return LocalStore(stage_dir)

    def reach(self, root: str) -> None:
        """How the path is served decided and said (a mount the config
        declares whose API can't be reached: StorageError)."""
        self.store(root)

    def on_a_bucket_mount(self, stage_dir: str) -> bool:
        from waypost.stores.mounted import mount_of
        mount = mount_of(stage_dir)
        return mount is not None and mount.url is not None

    def consistent(self, stage_dir: str) -> str:
        """For a stage directory on a mount served through its bucket's API,
        the bucket's URL of it; else ``stage_dir`` itself."""
        from waypost.stores.mounted import mount_of, way_of
        mount = mount_of(stage_dir)
        if mount is None or mount.url is None:
            return stage_dir
        way = way_of(mount)
        if way.url is None:
            return stage_dir
        return way.url + os.path.realpath(stage_dir)[len(mount.point.rstrip("/")):]

    def catch_up(self, stage_dir: str) -> None:
        """Wait (at most ``mounted.SETTLE_S``) until this node's mount lists
        every file its bucket lists in ``stage_dir``."""
        url = self.consistent(stage_dir)
        if url == stage_dir:
            return
        from waypost.stores.bucket import BucketStore
        from waypost.stores.mounted import settle
        settle(stage_dir, [name for name in BucketStore(url).entries(url) if not name.startswith(".")])

    def preload(self) -> None:
        """The mount check (and the codec it reads mount points with)."""
        from waypost.stores import mounted  # noqa: F401
