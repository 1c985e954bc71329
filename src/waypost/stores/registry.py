"""Which backend serves a location, by its URL's scheme (as fsspec's
``url_to_fs`` picks a filesystem): a path (no scheme) is local disk, NFS or
a mounted bucket (``PathRoot``); a URL whose scheme has a bucket client in
``bucketclient.CLIENTS`` (``gs://bucket/prefix``) is a bucket read through
its API (``BucketRoot``, over that client). A service reached through an
fsspec filesystem is one client module (``bucketclient.BucketClient``) and
one line in ``bucketclient.CLIENTS`` (there, not here: the bucket modules
ask it for their client, and this imports the backends that import them);
another kind of root is one backend (a ``base.Backend``) and one line in
``BACKENDS``. A scheme that neither serves is one clear line
(``StorageError``). The rest of waypost asks ``waypost.stores``, which asks
this."""

from __future__ import annotations

from waypost.model.locations import scheme_of
from waypost.stores.base import Backend
from waypost.stores.bucketclient import CLIENTS, unserved
from waypost.stores.bucketroot import BucketRoot
from waypost.stores.pathroot import PathRoot

#: scheme → the backend of its roots, for those not served by a bucket client ("": a path)
BACKENDS: dict[str, Backend] = {
    "": PathRoot(),
}

_BUCKETS = BucketRoot()   # the backend of every scheme with a client


def backend_of(location: str) -> Backend:
    """The backend of the root ``location`` is in; StorageError for a scheme none serves."""
    scheme = scheme_of(location)
    if scheme in BACKENDS:
        return BACKENDS[scheme]
    if scheme in CLIENTS:
        return _BUCKETS
    raise unserved(location, BACKENDS)
