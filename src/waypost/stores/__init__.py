"""Where stage directories live: one ``StageStore`` interface (``base``),
chosen from the root by ``store_for``.

Each kind of root has a backend (``base.Backend``), found by the root's URL
scheme in ``registry``: a bucket's URL read and written through its API
(``bucketroot``: ``bucket`` over the client of the URL's scheme that
``bucketclient`` finds, ``gcs`` for ``gs://bucket/prefix``, and the
step's local copy, ``mirror``), and a path (``pathroot``: local disk or
NFS, ``local``, or a bucket mounted on the nodes, ``mounted``). A scheme
nothing serves is one line (``StorageError``). The rest of waypost imports this
package alone, never one of its modules: it asks the functions below, which
ask the root's backend, and the store's capability flags; it spells
locations (a path or a bucket's URL) with ``waypost.model.locations``
(re-exported here), never by looking at the scheme. What the callers need
of a backend's modules (the bucket client's listing, the mirror's paths,
the mount's wait) is named here too, imported when first asked for
(``__getattr__``), so that importing this package imports no client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waypost.model.locations import (  # noqa: F401  (the stores' callers spell locations with these)
    absolute,
    below,
    is_absolute,
    is_bucket_url,
    join,
    needs_mirror,
    normalised,
    parent,
    resolve,
    scheme_of,
    shown,
    split_url,
)
from waypost.stores.base import StorageError, mtime_of  # noqa: F401  (the bucket clients' errors, objects' times)
from waypost.stores.bucketclient import CLIENTS, check_bucket, client_of, explain, filesystem  # noqa: F401
from waypost.stores.registry import backend_of

if TYPE_CHECKING:
    from waypost.model.records import Manifest


def manifest_at(location: str) -> Manifest | None:
    """The manifest of one stage directory anywhere (a path or a bucket's
    URL), read alone; None when there is none; ManifestError when it is
    unusable or can't be read."""
    return backend_of(location).manifest_at(location)


def reach(root: str) -> None:
    """For a root read through an API, StorageError within seconds when its
    endpoint can't be reached (its client's ``probe``); for a path on a mount, how
    waypost serves it decided and said (``store_for``: a mount the config
    declares whose API can't be reached is a StorageError); nothing for
    another path."""
    backend_of(root).reach(root)


def listed_at_once(root: str) -> bool:
    """Is the root read from one listing of its bucket (a bucket's URL, or a
    mount served through its bucket's API), rather than directory by
    directory (so, fastest by worker processes)?"""
    return backend_of(root).listed_at_once(root)


def store_for(root: str, snapshot: bool = False, quiet: bool = False, reads: bool = True):
    """The store of a root: a bucket's URL through its API; a path on a
    mount through the mount, and through the bucket's API when the mount is
    known to serve one that this process can reach (``mounted.way_of``,
    said once unless ``quiet``); any other path on disk (with ``snapshot``,
    listing each directory once: for commands that only look). Without
    ``reads`` (a step runner's own stage directory: it only writes there) a
    mount is taken as it is, nothing checked."""
    return backend_of(root).store(root, snapshot=snapshot, quiet=quiet, reads=reads)


def on_a_bucket_mount(stage_dir: str) -> bool:
    """Is ``stage_dir`` on a mount that may serve a bucket (its mount
    table or the config names one)? A step runner there reads its stage
    directory's state through the bucket's API (``consistent``), so it
    needs site-packages."""
    return backend_of(stage_dir).on_a_bucket_mount(stage_dir)


def consistent(stage_dir: str) -> str:
    """Where to read a stage directory's state so that what other nodes
    wrote is seen: for one on a mount served through its bucket's API
    (``mounted.way_of``), the bucket's URL of it (a node's mount lists
    late, as long as its caches keep a listing: rclone's
    ``--dir-cache-time``, gcsfuse's TTLs); else ``stage_dir`` itself."""
    return backend_of(stage_dir).consistent(stage_dir)


def catch_up(stage_dir: str) -> None:
    """Wait (at most ``mounted.SETTLE_S``) until this node's mount lists
    every file its bucket lists in ``stage_dir`` (nothing to wait for off
    a bucket mount): what another node's attempt left there, read next
    through the mount."""
    backend_of(stage_dir).catch_up(stage_dir)


def over(stage_dir: str):
    """A store to look at one stage directory: in a bucket, the planning's
    listing of its root when this process made one (no request), else a
    listing of the directory; on disk or a mount, the directory as it is
    (through the mount: a step runner, started without ``site``, reads its
    own stage directory with no bucket client)."""
    return backend_of(stage_dir).over(stage_dir)


def workspace_for(step):
    """(the workspace a step runner keeps in step with its stage directory,
    None when the step works in the directory itself: a path; the step's
    inputs and outputs as it works with them: on a bucket root their local
    copies, ``runnerstage``)."""
    return backend_of(step.stage_dir).workspace(step)


def bucket_schemes() -> list[str]:
    """The schemes of the bucket URLs waypost serves (``gs``)."""
    return sorted(CLIENTS)


def quiet_client_logging() -> None:
    """No tracebacks on stderr from any bucket client's library (gcsfs's,
    ...): the error that reaches the command is said in one line. Imports
    each client module, never its library."""
    for load in CLIENTS.values():
        load().quiet_logging()


def reset() -> None:
    """Forget every bucket client's cached clients and the planning's
    listings of bucket roots (tests that start another service)."""
    for load in CLIENTS.values():
        load().reset()
    _planlisting().reset()


def preload() -> None:
    """Import now, once, what a step runner on a path imports as it goes
    (the mount check), so that no runner forked from this process pays for it."""
    backend_of("").preload()


# --- what callers need of the backends' modules, imported when first asked for

def _planlisting():
    from waypost.stores import planlisting
    return planlisting


def _mirror():
    from waypost.stores import mirror
    return mirror


def _mounted():
    from waypost.stores import mounted
    return mounted


def _local():
    from waypost.stores import local
    return local


def _bucketmoves():
    from waypost.stores import bucketmoves
    return bucketmoves


_LAZY = {name: module for module, names in (
    # the planning's one listing of a bucket root
    (_planlisting, ("register_root", "root_of", "listing", "listed", "listed_info", "directories", "plain_names")),
    # a bucket root's local copy (the mirror): its paths, Snakemake's options for it, downloads
    (_mirror, ("PROVIDER", "snakemake_options", "local_of", "download", "fetch_folder")),
    # a bucket mount that lists late
    (_mounted, ("SETTLE_S", "settle", "lagging")),
    # a stage directory on disk, as a step runner keeps it; checked copies onto disk and within a bucket
    (_local, ("LocalStore", "place_checked")),
    (_bucketmoves, ("copy_checked",)),
) for name in names}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module(), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
