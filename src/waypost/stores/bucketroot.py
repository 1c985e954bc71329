"""The backend of a bucket root (``gs://bucket/prefix``, or any scheme with
a client in ``bucketclient.CLIENTS``), read and written through the bucket's
API: its stores (``bucket``, over the URL's client), and the local copy a
step works on (``runnerstage``). Nothing is imported until asked: choosing
this backend costs no import of a client library."""

from __future__ import annotations

from waypost.stores.base import Backend

_planning: dict[str, tuple] = {}   # root → (the planning's listing, a store over it)


class BucketRoot(Backend):
    """A bucket root: a snapshot store over one listing, a step on a local copy."""

    def store(self, root: str, snapshot: bool = False, quiet: bool = False, reads: bool = True):
        from waypost.stores.bucket import BucketStore
        return BucketStore(root)

    def manifest_at(self, location: str):
        from waypost.stores.bucket import read_manifest
        return read_manifest(location)

    def over(self, stage_dir: str):
        """The planning's listing of the root when this process made one (no
        request), else a listing of the directory."""
        from waypost.stores import planlisting
        from waypost.stores.bucket import BucketStore
        root = planlisting.root_of(stage_dir)
        if root is None:
            return BucketStore(stage_dir)
        found = planlisting.listing(root)
        if root not in _planning or _planning[root][0] is not found:
            _planning[root] = (found, BucketStore(root, found=found))
        return _planning[root][1]

    def reach(self, root: str) -> None:
        from waypost.stores.bucketclient import client_of
        client_of(root).probe(root)

    def listed_at_once(self, root: str) -> bool:
        return True

    def workspace(self, step):
        from waypost.stores import runnerstage
        return runnerstage.for_runner(step)
