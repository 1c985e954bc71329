"""The client of ``gs://`` URLs (a ``bucketclient.BucketClient``, named in
``bucketclient.CLIENTS``): gcsfs, its endpoint, its errors. gcsfs lists
objects as the bucket stores read them (``size``, ``mtime``, ``metadata``,
``crc32c``, ``generation``).

Credentials come from Google's standard mechanisms (Application Default
Credentials, ``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server); with
``STORAGE_EMULATOR_HOST`` set (tests, fake-gcs-server) requests go there
anonymously. Nothing here prints or stores a credential. gcsfs retries
transient errors (429, 5xx, connection resets) with exponential backoff.
"""

from __future__ import annotations

import os
from functools import cache

# (MTIME_KEY, StorageError and mtime_of: the bucket stores', named here too)
from waypost.stores.base import MTIME_KEY, StorageError, mtime_of  # noqa: F401

SCHEME = "gs://"


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

    proxied = any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    if not str(url).startswith(SCHEME) or proxied:
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


def quiet_logging() -> None:
    """No gcsfs tracebacks on stderr (it logs one per failed request, with
    no handler configured): the error that reaches the command is reported
    in one line. GCSFS_DEBUG keeps them."""
    import logging
    if not os.environ.get("GCSFS_DEBUG"):
        logger = logging.getLogger("gcsfs")
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def reset() -> None:
    """Forget the cached GCS client (``stores.reset``: tests that start another emulator)."""
    _gcs.cache_clear()
    _reached.clear()


def filesystem(url: str):
    """(the gcsfs filesystem, the path within it: bucket/key) of a gs:// URL."""
    return _gcs(), str(url)[len(SCHEME):].rstrip("/")


def explain(exc: BaseException, url: str) -> StorageError:
    """One line for the errors a user can act on (no bucket, no permission)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return StorageError(f"{url}: not found (no such bucket?)" if str(url).startswith(SCHEME) else f"{url}: not found")
    if isinstance(exc, PermissionError) or "403" in text or "401" in text:
        return StorageError(f"{url}: permission denied; check the credentials "
                            f"(GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`)")
    return StorageError(f"{url}: {text}")


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
