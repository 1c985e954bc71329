"""The seam between the bucket stores and a service's client: which client
serves a URL's scheme (``CLIENTS``, ``client_of``), what a client module
must give (``BucketClient``), and what the bucket modules ask of a URL's
client, found by its scheme, never by name.

A client module (``gcs`` for ``gs://``) is imported only when a URL of its
scheme is first used, so choosing a backend imports no client library.
Everything else the bucket modules do (listings, batch reads, server-side
moves, the step's local copy) is written once over the client's fsspec
filesystem.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from importlib import import_module
from types import ModuleType
from typing import Protocol

from waypost.model.locations import is_bucket_url, scheme_of
from waypost.stores.base import StorageError

#: scheme → its bucket client module (a ``BucketClient``), imported when first asked for
CLIENTS: dict[str, Callable[[], ModuleType]] = {
    "gs": lambda: import_module("waypost.stores.gcs"),
}


def client_of(url: str):
    """The bucket client module of a URL's scheme; StorageError for a scheme no client serves."""
    load = CLIENTS.get(scheme_of(url))
    if load is None:
        raise unserved(url)
    return load()


def unserved(location: str, backends: Iterable[str] = ()) -> StorageError:
    """One line for a location whose scheme waypost doesn't serve, naming
    those it does (a client's, and ``backends``' other than a path's)."""
    served = ", ".join(f"{s}://" for s in sorted({*CLIENTS, *backends} - {""}))
    return StorageError(f"{location}: waypost serves no {scheme_of(location)}:// locations (a path, or {served})")


class BucketClient(Protocol):
    """What a client module (one per scheme, named in ``CLIENTS``)
    provides, as module-level names.

    Its filesystem is an fsspec one over the service, whose paths are a
    URL without its scheme (``bucket/key``). The bucket stores rely on it
    listing each object (``find``/``ls``/``info``, detail) with ``size``,
    ``mtime`` (a datetime: when it was written) and ``metadata`` (the
    object's user metadata: where waypost dates an object by
    ``base.MTIME_KEY``, ``base.mtime_of``), and where it has them
    ``crc32c`` (base64 of the 4 big-endian bytes, as manifests record it)
    and ``generation`` (changes whenever the object does); on its writes
    (``pipe_file``, ``put_file``) taking ``metadata=``; on ``copy`` being
    made in the service (server-side) and keeping each object's metadata;
    and on an object being whole or absent, its listing consistent at once.
    A client whose library lists no such fields shapes its infos itself.
    """

    def filesystem(self, url: str) -> tuple[object, str]:
        """(the fsspec filesystem, the path within it) of a URL of the scheme."""

    def explain(self, exc: BaseException, url: str) -> StorageError:
        """One line for an error a user can act on (no bucket, no permission)."""

    def check_bucket(self, root: str) -> None:
        """StorageError (one line) when the root's bucket is missing or can't be read."""

    def probe(self, url: str) -> None:
        """StorageError within seconds when the service of ``url`` can't be reached."""

    def quiet_logging(self) -> None:
        """No tracebacks of the client's library on stderr (the error is said in one line)."""

    def reset(self) -> None:
        """Forget cached clients (tests that start another service)."""


def filesystem(url: str):
    """(fsspec filesystem, path within it) for a local path or a bucket's URL."""
    if is_bucket_url(url):
        return client_of(url).filesystem(url)
    from fsspec.implementations.local import LocalFileSystem
    return LocalFileSystem(), os.path.abspath(url)


def explain(exc: BaseException, url: str) -> StorageError:
    """One line for an error reading ``url`` (its client's words for a bucket's URL)."""
    if isinstance(exc, StorageError):
        return exc
    if is_bucket_url(url):
        return client_of(url).explain(exc, url)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return StorageError(f"{url}: not found")
    if isinstance(exc, PermissionError):
        return StorageError(f"{url}: permission denied")
    return StorageError(f"{url}: {text}")


def check_bucket(root: str) -> None:
    """One clear line when the bucket of ``root`` (a bucket's URL) is missing or can't be read."""
    client_of(root).check_bucket(root)


def read_many(fs, paths: list[str], batch: int = 1000) -> dict[str, bytes | Exception]:
    """The contents of many objects (fsspec paths), fetched concurrently in
    batches; an object that can't be read maps to the exception."""
    found: dict[str, bytes | Exception] = {}
    for start in range(0, len(paths), batch):
        some = paths[start:start + batch]
        got = fs.cat(some, on_error="return")
        found.update({path: got.get(path, FileNotFoundError(path)) for path in some})
    return found
