"""A bucket mounted on the nodes (gcsfuse, rclone) as the root.

Steps read and write through the mount: to them the root is a directory.
A mount is not POSIX (no hard links or symlinks, copy2's metadata step
fails, a rename is a copy + delete, listings and stats are cached per node,
locks hold on one node only), so waypost does its own metadata work through
the bucket's API when the mount is known to serve a bucket and this process
can reach the bucket's API: listing (status, find, the catalog), archiving
(server-side copy + delete, resumable), reuse (a server-side copy, checked
by crc32c: no bytes through the node) and verify (the listed crc32c).

Known to serve a bucket: a mount the config declares (``mounts``), a
gcsfuse mount (its source in ``/proc/mounts`` is the bucket), an rclone
mount whose remote is of type Google Cloud Storage (``rclone``: the mount
table shows every rclone remote alike, ``remote:path``). Any other mount,
or a bucket whose API this process can't reach (no credentials, no route:
gcsfuse may have its own), is served through the mount: plain copies and
listings. Which way, and why, is said once per process
(``open_mounted``); a declared mount whose API can't be reached is an error.
"""

from __future__ import annotations

import os
import sys
import time
from collections import namedtuple

from waypost.model import layout, locations, writes
from waypost.stores.base import StageStore
from waypost.stores.gcs import SCHEME  # (the buckets FUSE mounts serve here are GCS's)
from waypost.stores.local import LocalStore

FUSE_KINDS = {"fuse.gcsfuse": "gcsfuse", "fuse.rclone": "rclone"}
# How long a reuse made through the API waits for this node's mount to list the copies.
SETTLE_S = float(os.environ.get("WAYPOST_MOUNT_SETTLE_SECONDS", "70"))
_said: set[str] = set()
_ways: dict[str, Way] = {}   # mount point → how this process serves it (way_of)


# (Named tuples, not dataclasses: every step runner asks mount_of about its
# stage directory, and importing dataclasses costs it ~10 ms.)
class Mount(namedtuple("Mount", "point kind url source", defaults=("",))):
    """``point``: where it is mounted; ``kind``: gcsfuse, rclone, declared,
    or the filesystem type; ``url``: the gs:// location the config or the
    mount table names (None: none; see way_of); ``source``: its source in
    the mount table (not compared)."""
    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, Mount) and self[:3] == other[:3]

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self[:3])


class Way(namedtuple("Way", "url said")):
    """How waypost serves a mount: through the bucket's API at ``url``, or
    (None) through the mount alone; ``said``: the line that tells the user."""
    __slots__ = ()


# The mount table as this process last read it: (pid, a poll object on a
# descriptor of /proc/self/mounts, that descriptor, the rows). Read again
# only once the kernel says a mount or unmount happened since (proc(5): the
# file polls POLLPRI after each change, once per open file). A step runner
# asks mount_of about its stage directory four times (~0.9 ms with a read
# each in a forked runner, ~0.65 ms with one read and three polls), and the
# local step server once per step. A fork shares its parent's open file,
# and so its change events: it opens its own (``pid``; the parent's copy,
# close-on-exec, stays as it is).
_cached: tuple | None = None


def _table() -> list[tuple[str, str, str]]:
    global _cached
    if _cached is not None and _cached[0] == os.getpid():
        if not _mounts_changed(_cached[1]):
            return _cached[3]
        os.close(_cached[2])
    _cached = None
    try:
        import select
        fd = os.open("/proc/self/mounts", os.O_RDONLY)
    except (OSError, ImportError):
        return _read_table("/proc/mounts")
    try:   # (the table as of the open, or later: a change since is polled next time)
        with open(fd, closefd=False) as f:
            rows = _parsed(f)
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
    except OSError:
        os.close(fd)
        return _read_table("/proc/mounts")
    _cached = (os.getpid(), poller, fd, rows)
    return rows


def _mounts_changed(poller) -> bool:
    """Has the mount table changed since its descriptor was opened or last
    polled? (Anything but a clear "no" counts as a change.)"""
    import select
    try:
        events = poller.poll(0)
    except OSError:
        return True
    return any(mask & (select.POLLPRI | select.POLLERR | select.POLLNVAL) for _, mask in events)


def _read_table(path: str) -> list[tuple[str, str, str]]:
    """(source, mount point, type) of every mount (octal escapes undone)."""
    try:
        with open(path) as f:
            return _parsed(f)
    except OSError:
        return []


def _parsed(lines) -> list[tuple[str, str, str]]:
    rows = [line.split()[:3] for line in lines if len(line.split()) >= 3]
    return [(_unescaped(src), _unescaped(point), kind) for src, point, kind in rows]


def _unescaped(field: str) -> str:
    return field.encode().decode("unicode_escape")


def bucket_of_source(kind: str, source: str) -> str | None:
    """The bucket (and path) a FUSE mount's source names: gcsfuse's is the
    bucket; rclone's ``remote:bucket[/path]`` (whether that remote is a
    bucket at all is its type's to say: ``way_of``)."""
    if kind == "fuse.gcsfuse":
        return source if source and "/" not in source and ":" not in source else None
    if kind == "fuse.rclone":   # (a remote:/absolute/path is a local or SFTP remote, no bucket)
        from waypost.stores import rclone
        _, _, rest = rclone.split_source(source)
        return None if rest.startswith("/") else rest.strip("/") or None
    return None


def mount_of(path: str) -> Mount | None:
    """The mount ``path`` is on, when it is a FUSE or declared mount."""
    real = os.path.realpath(path)
    declared = locations.declared_mounts()
    for point in sorted(declared, key=len, reverse=True):
        if real == point or real.startswith(point.rstrip("/") + "/"):
            return Mount(point, "declared", declared[point])
    best = None
    for source, point, kind in _table():
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if kind.startswith("fuse") and inside and (best is None or len(point) > len(best[1])):
            best = (source, point, kind)
    if best is None:
        return None
    source, point, kind = best
    bucket = bucket_of_source(kind, source)
    return Mount(point, FUSE_KINDS.get(kind, kind), SCHEME + bucket if bucket else None, source)


def way_of(mount: Mount) -> Way:
    """How this process serves ``mount`` (decided once per mount point):
    through the bucket's API when the mount is known to serve that bucket
    and the API answers; else through the mount. StorageError when the
    config declares the mount and the API can't be reached."""
    if mount.point not in _ways:
        _ways[mount.point] = _decide(mount)
    return _ways[mount.point]


PLAIN = "reuse and archives copy through the mount, listings go through it"


def _decide(mount: Mount) -> Way:
    article = "an" if mount.kind == "rclone" or mount.kind[0] in "aeiou" else "a"
    how = f"{article} {mount.kind} mount ({mount.point})"
    url, what = _bucket(mount)
    if url is None:
        declare = "declare it in the config: mounts: {" + mount.point + ": gs://BUCKET[/PREFIX]}"
        return Way(None, f"{how} {what}: {PLAIN} (if it serves a GCS bucket, {declare})")
    problem = api_problem(url)
    if problem and mount.kind == "declared":
        from waypost.stores.base import StorageError
        raise StorageError(f"{mount.point}: the config's mounts: has it served through the API of {url}, but this "
                           f"process can't use that API ({problem}): give it credentials and a route to the "
                           f"storage endpoint, or take {mount.point} out of mounts: to work through the mount")
    if problem:
        return Way(None, f"{how} of {url}, but this process can't use the bucket's API ({problem}): {PLAIN} (for "
                         "the API, give this process credentials and a route to the storage endpoint; with the "
                         "mount in the config's mounts:, the API is required)")
    return Way(url, "" if mount.kind == "declared" else
               f"{how} of {url}{what}: listings, verify and reuse go through the bucket's API")


def _bucket(mount: Mount) -> tuple[str | None, str]:
    """The bucket a mount is known to serve (None: none known), and what
    makes it one, or not."""
    if mount.url is None:
        return None, "whose bucket waypost doesn't know"
    if mount.kind != "rclone":
        return mount.url, ""   # the config says so, or gcsfuse serves only buckets
    from waypost.stores import rclone
    remote, backend, _ = rclone.split_source(mount.source)
    kind = rclone.remote_type(mount.point, mount.source)
    name = remote or f":{backend}:"
    if kind in rclone.GCS_TYPES:
        return mount.url, f" (remote {name}, type {kind})"
    if kind:
        return None, f"of remote {name} (type {kind}), not a GCS bucket"
    return None, f"of remote {name}, whose type waypost can't read in rclone's config"


def api_problem(url: str) -> str | None:
    """Why this process can't use the API of the bucket at ``url`` (None:
    it can): its endpoint refuses or doesn't answer (``gcs.unreachable``: a
    connection, seconds at most), or the bucket can't be read (one request;
    only where the GCS client is installed: a step runner started without
    it reads nothing through the API)."""
    from importlib.util import find_spec

    from waypost.stores.base import StorageError
    from waypost.stores.gcs import check_bucket, unreachable
    problem = unreachable(url)
    if problem or find_spec("gcsfs") is None:
        return problem
    try:
        check_bucket(url)
    except StorageError as exc:
        return str(exc).removeprefix(f"{url}: ")
    return None


def open_mounted(root: str, mount: Mount, quiet: bool = False, reads: bool = True) -> StageStore:
    """The store of a root on ``mount``, served as ``way_of`` says (and,
    unless ``quiet``, said once). Without ``reads`` (a step runner's own
    stage directory: heartbeats and archives, the same either way) through
    the mount, nothing checked."""
    if not reads:
        return PlainMountStore(root)
    way = way_of(mount)
    if way.said and not quiet and mount.point not in _said:
        _said.add(mount.point)
        print(f"waypost: {root} is on {way.said}", file=sys.stderr)
    if way.url is None:
        return PlainMountStore(root)
    real = os.path.realpath(root)
    url = way.url + real[len(mount.point.rstrip("/")):]
    return MountedStore(root, url.rstrip("/"))


class PlainMountStore(LocalStore):
    """A mount whose bucket waypost doesn't know: files through the mount,
    plain copies (the base class copies, never links)."""

    links = False
    appends = False   # objects: written whole
    bucket_url = None

    def heartbeat(self, path: str) -> None:
        """Rewritten (temp + rename: a new object), so every mount sees a new time."""
        touch(path)


def touch(path: str) -> None:
    with open(path, "rb") as f:
        data = f.read()
    writes.whole(path, data)


class MountedStore(LocalStore):
    """Paths are the mount's (local); what waypost reads and changes goes
    through the bucket's API at ``url`` (gs://bucket/prefix of the root)."""

    snapshot = True
    listed_crc32c = True
    links = False
    appends = False   # objects: written whole
    server_side_copy = True

    def __init__(self, root: str, url: str):
        super().__init__(root)
        self.real = os.path.realpath(root).rstrip("/")
        self.bucket_url = url
        self._api = None

    @property
    def api(self):
        """The bucket store over the whole root: one listing, made when first needed."""
        if self._api is None:
            from waypost.stores.bucket import BucketStore
            self._api = BucketStore(self.bucket_url)
        return self._api

    def url(self, path: str) -> str:
        root = self.root.rstrip("/")
        if path.startswith(root + "/") and "/." not in path[len(root):]:   # (a mount holds no links)
            return self.bucket_url + path[len(root):]
        real = os.path.realpath(path)
        if real != self.real and not real.startswith(self.real + "/"):
            raise ValueError(f"{path}: not under the root {self.root}")
        return self.bucket_url + real[len(self.real):]

    def bucket_of(self, directory: str) -> str:
        return self.url(directory)

    def path(self, url: str) -> str:
        return os.path.join(self.root, url[len(self.bucket_url) + 1:]) if url != self.bucket_url else self.root

    def _stage(self, directory: str):
        """A bucket store over one stage directory (one listing of it)."""
        from waypost.stores.bucket import BucketStore
        return BucketStore(self.url(directory))

    # reads: from the one listing
    def entries(self, directory):
        return self.api.entries(self.url(directory))

    def isdir(self, path):
        return self.api.isdir(self.url(path))

    def isfile(self, path):
        return self.api.isfile(self.url(path))

    def exists(self, path):
        return self.api.exists(self.url(path))

    def escapes(self, stage_dir, rel):
        return None   # a mount holds no links

    def size(self, path):
        return self.api.size(self.url(path))

    def files(self, directory):
        return self.api.files(self.url(directory))

    def file_sizes(self, directory):
        return self.api.file_sizes(self.url(directory))

    def marker_dirs(self, leaf=layout.MANIFEST):
        return [self.path(u) for u in self.api.marker_dirs(leaf)]

    def archives(self, directory):
        return self.api.archives(self.url(directory))

    def usage(self, path):
        return self.api.usage(self.url(path))

    parallel_reads = False   # read through the API, in batches

    def listed_manifests(self, refused=None):
        away: dict = {}
        found = {self.path(url): stamp for url, stamp in self.api.listed_manifests(away).items()}
        if refused is not None:
            refused.update({self.path(url): why for url, why in away.items()})
        return found

    def read_manifests(self, directories, stamps=None):
        urls = {self.url(d): d for d in directories}
        listed = {url: (stamps or {}).get(d) for url, d in urls.items()}
        for url, stamp, text in self.api.read_manifests(list(urls), listed):
            yield urls[url], stamp, text

    def manifest(self, directory):
        if not self._under(directory):
            return super().manifest(directory)
        return self.api.manifest(self.url(directory))

    def mtime(self, path):
        return self.api.mtime(self.url(path))

    def marker(self, directory):
        return self.api.marker(self.url(directory))

    def crc32c(self, path):
        return self.api.crc32c(self.url(path))

    def digests(self, path):
        return self.api.digests(self.url(path))

    def _under(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self.real or real.startswith(self.real + "/")

    # Changes go through the mount (a rename there is the bucket's copy +
    # delete, made by the mount itself): a node's mount keeps showing a file
    # it wrote itself after it was moved or deleted through the API (rclone's
    # VFS cache, measured), so only what no mount has seen yet is made
    # through the API: the copies a reuse brings in.
    def _changed(self) -> None:
        self._api = None   # the listing is out of date

    def write_manifest(self, directory, record):
        super().write_manifest(directory, record)
        self._changed()

    def write_marker(self, path, text):
        super().write_marker(path, text)
        self._changed()

    def heartbeat(self, path):
        touch(path)

    def remove(self, path):
        super().remove(path)
        self._changed()

    def remove_tree(self, path):
        super().remove_tree(path)
        self._changed()

    def remove_files(self, directory, names):
        super().remove_files(directory, names)
        self._changed()

    def archive(self, directory, keep=()):
        """Renames through the mount, file by file where an archive cut
        short left part of a directory (LocalStore.archive): each is the
        bucket's own server-side copy + delete, resumable from its note."""
        target = super().archive(directory, keep)
        self._changed()
        return target

    def bring(self, source, source_dir, stage_dir, outputs):
        if source.bucket_url is None:
            return super().bring(source, source_dir, stage_dir, outputs)   # plain copies, checked
        how = self._stage(stage_dir).bring(source, source_dir, self.url(stage_dir), outputs)
        settle(stage_dir, [o["path"] for o in outputs])
        self._changed()
        return how


def settle(directory: str, want: list[str], until: float | None = None) -> bool:
    """Wait (at most SETTLE_S, or until the ``time.monotonic()`` ``until``)
    until this node's mount lists the files its bucket lists in
    ``directory`` (``want``: written through the API, or by another node;
    the mount's listing cache: rclone --dir-cache-time, gcsfuse's TTLs):
    what comes next looks for them through the mount. False (said, when it
    waited for SETTLE_S) when it does not list them in that time."""
    deadline = time.monotonic() + SETTLE_S if until is None else until
    while True:
        if all(os.path.exists(os.path.join(directory, w)) for w in want):
            return True
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if until is None:
        print(f"{lagging(directory)}; going on", file=sys.stderr)
    return False


def lagging(directory: str) -> str:
    """The line that says this node's mount still lags its bucket at ``directory``."""
    return (f"waypost: {directory}: this node's mount does not list what its bucket lists there after "
            f"{SETTLE_S:.0f} s (its directory cache; WAYPOST_MOUNT_SETTLE_SECONDS)")
