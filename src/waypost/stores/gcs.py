"""The GCS client behind the bucket stores: gcsfs, its endpoint, its errors,
and the one listing of a root a Snakemake planning answers from.

Credentials come from Google's standard mechanisms (Application Default
Credentials, ``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server); with
``STORAGE_EMULATOR_HOST`` set (tests, fake-gcs-server) requests go there
anonymously. Nothing here prints or stores a credential. gcsfs retries
transient errors (429, 5xx, connection resets) with exponential backoff.
"""

from __future__ import annotations

import os
from functools import cache

from waypost.model.errors import WaypostError
from waypost.model.locations import SCHEME, is_bucket_url

MTIME_KEY = "waypost-mtime"


def mtime_of(info: dict) -> float:
    """An object's mtime: its ``waypost-mtime`` metadata, else when it was written."""
    stamp = (info.get("metadata") or {}).get(MTIME_KEY)
    return float(stamp) if stamp else info["mtime"].timestamp()


class StorageError(WaypostError, RuntimeError):
    """A root that cannot be reached: one clear line for the user."""


@cache
def _gcs():
    # gcsfs ≥ 2026.10 swaps in a class that probes every bucket over gRPC;
    # against the HTTP emulator (and behind proxies) that makes each call take
    # tens of seconds. The plain JSON-API class is what we test.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs.core

    # No listings cache: other processes (step runners, other runs) change the
    # bucket while this one runs; planning keeps its own snapshot (listing()).
    options = {"skip_instance_cache": True, "use_listings_cache": False}
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        return gcsfs.core.GCSFileSystem(endpoint_url=emulator, token="anon", **options)
    return gcsfs.core.GCSFileSystem(**options)


# A forked process (a runner forked from a job's Snakemake process, which
# used the client already) makes its own: gcsfs refuses to be used across a fork.
os.register_at_fork(after_in_child=_gcs.cache_clear)

GCS_ENDPOINT = "https://storage.googleapis.com"
# How long the probe waits for the endpoint to accept a connection.
PROBE_TIMEOUT_S = 5.0
_reached: set[tuple[str, int]] = set()


def endpoint() -> str:
    """The URL GCS requests go to (the emulator's, when one is set)."""
    url = os.environ.get("STORAGE_EMULATOR_HOST") or GCS_ENDPOINT
    return url if "://" in url else "http://" + url


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """StorageError at once when the storage endpoint of gs:// ``url`` does
    not accept a connection (``unreachable``): gcsfs would retry each
    request with backoff for about a minute and log a traceback per request.
    For commands, before their first request."""
    problem = unreachable(url, timeout)
    if problem:
        raise StorageError(f"{url}: {problem}; nothing was read or changed")


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the storage endpoint of gs:// ``url`` does not accept a
    connection (refused, no route, unknown host, no answer within
    ``timeout``); None when it does. Once per endpoint and process (when
    reached). Behind a proxy (HTTPS_PROXY and the like) it says nothing:
    the proxy decides."""
    import socket
    from urllib.parse import urlsplit

    if not is_bucket_url(url) or any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                                               "all_proxy")):
        return None
    where = endpoint()
    parts = urlsplit(where)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    if (host, port) in _reached:
        return None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc) or type(exc).__name__)
        return f"can't reach the storage endpoint {where} ({why})"
    _reached.add((host, port))
    return None


def quiet_gcsfs_logging() -> None:
    """No gcsfs tracebacks on stderr (it logs one per failed request, with
    no handler configured): the error that reaches the command is reported
    in one line. GCSFS_DEBUG keeps them."""
    import logging
    if not os.environ.get("GCSFS_DEBUG"):
        logger = logging.getLogger("gcsfs")
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def reset() -> None:
    """Forget the cached GCS client and listings (tests that start another emulator)."""
    _gcs.cache_clear()
    _roots.clear()
    _listings.clear()
    _reached.clear()


def filesystem(url: str):
    """(fsspec filesystem, path within it) for a local path or gs:// URI."""
    if is_bucket_url(url):
        return _gcs(), url[len(SCHEME):].rstrip("/")
    from fsspec.implementations.local import LocalFileSystem
    return LocalFileSystem(), os.path.abspath(url)


def url_of(fs, path: str) -> str:
    """The user-facing name of ``path`` in ``fs`` (gs:// URI or local path)."""
    from fsspec.implementations.local import LocalFileSystem
    return path if isinstance(fs, LocalFileSystem) else SCHEME + path


def explain(exc: BaseException, url: str) -> StorageError:
    """One line for the errors a user can act on (no bucket, no permission)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return StorageError(f"{url}: not found (no such bucket?)" if is_bucket_url(url) else f"{url}: not found")
    if isinstance(exc, PermissionError) or "403" in text or "401" in text:
        return StorageError(f"{url}: permission denied; check the credentials "
                            f"(GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`)")
    return StorageError(f"{url}: {text}")


def read_many(fs, paths: list[str], batch: int = 1000) -> dict[str, bytes | Exception]:
    """The contents of many objects (fsspec paths), fetched concurrently in
    batches; an object that can't be read maps to the exception."""
    found: dict[str, bytes | Exception] = {}
    for start in range(0, len(paths), batch):
        some = paths[start:start + batch]
        got = fs.cat(some, on_error="return")
        found.update({path: got.get(path, FileNotFoundError(path)) for path in some})
    return found


# gs:// roots a Snakemake run plans over, and their listings: one listing of
# the whole root answers every "does this stage file exist?" of a planning
# (1,000 single requests take seconds; one listing of 5,000 objects ~0.15 s).
_roots: set[str] = set()
_listings: dict[str, dict[str, dict]] = {}


def register_root(url: str) -> None:
    _roots.add(url.rstrip("/"))


def root_of(url: str) -> str | None:
    """The registered root that holds ``url``, if any."""
    found = [r for r in _roots if url == r or url.startswith(r + "/")]
    return max(found, key=len) if found else None


def listing(root: str) -> dict[str, dict]:
    """Every object under a gs:// root (fsspec name → info), listed once per
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


def check_bucket(root: str) -> None:
    """One clear line when the root's bucket is missing or can't be read."""
    fs, path = filesystem(root)
    bucket = path.split("/")[0]
    try:
        fs.info(bucket)
    except FileNotFoundError:
        raise StorageError(f"{root}: bucket {bucket!r} does not exist (waypost never creates "
                           "buckets; check the name and the project)") from None
    except Exception as exc:
        raise explain(exc, root) from None


_directories: dict[int, dict[str, float]] = {}   # id of a listing → its directories (see directories)


def directories(root: str) -> dict[str, float]:
    """The directories of a gs:// root's listing (fsspec name, the root's
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
