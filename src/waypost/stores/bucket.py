"""Stage directories in a bucket (``gs://bucket/prefix``, or any scheme with
a client in ``bucketclient.CLIENTS``), through its client's fsspec filesystem.

One listing of the prefix when the store is made; manifests and
``_running.json`` markers read in one concurrent batch the first time one is
asked for; archiving a stage a server-side copy + delete, resumable; a reuse
from the same service a server-side copy checked by crc32c. A bucket store is
a snapshot: what others write after it was listed is not in it (what it
archives or writes itself is). A GCS object is whole or absent (never half
written), and its listing is strongly consistent, so a stage is done on any
node once its manifest object is there (what a client promises:
``bucketclient.BucketClient``).
"""

from __future__ import annotations

import time

from waypost.model import layout, manifest, records, trust
from waypost.model.layout import ATTEMPTS, MANIFEST, RUNNING
from waypost.stores.base import MTIME_KEY, StageStore, mtime_of
from waypost.stores.bucketclient import client_of, explain, read_many
from waypost.stores.bucketlisting import BucketListing
from waypost.stores.bucketmoves import archive_objects, bring_objects, move_into_archive


class BucketStore(BucketListing, StageStore):
    snapshot = True
    listed_crc32c = True
    links = False
    appends = False   # objects: written whole
    server_side_copy = True

    def __init__(self, root: str, found: dict[str, dict] | None = None):
        """A listing of ``root``; or, with ``found``, one made already
        (fsspec name → info: the planning's)."""
        self.root = self.bucket_url = root.rstrip("/")
        self.fs, self.base = self.client.filesystem(self.root)
        if found is None:
            self.client.check_bucket(self.root)
            self.fs.invalidate_cache(self.base)   # others write to the bucket: never an old listing
            try:
                found = self.fs.find(self.base, detail=True)
            except FileNotFoundError:
                found = {}
        objects, self.refused = {}, {}   # refused: names no path can stand for, left alone (trust)
        for name, info in found.items():
            if name.startswith(self.base + "/") and info.get("type", "file") == "file":
                rel = name[len(self.base) + 1:]
                problem = trust.relative_problem(rel)
                if problem:
                    self.refused[rel] = (problem, info)
                else:
                    objects[rel] = info
        self._index(objects)
        self._read: dict[str, dict[str, bytes | Exception]] = {}  # MANIFEST / RUNNING → their contents

    @property
    def client(self):
        """The root's bucket client (by its scheme; a module: never pickled with the store)."""
        return client_of(self.root)

    def escapes(self, stage_dir: str, rel: str) -> str | None:
        return None   # objects have no links

    def listed_manifests(self, refused=None):
        """From this store's listing, each stamped by its object generation."""
        found = {}
        for rel, info in self.objects.items():
            parts = rel.split("/")
            if parts[-1] != MANIFEST:
                continue
            directory = layout.join(self.root, *parts[:-1])
            if int(info.get("size") or 0) > trust.MAX_MANIFEST_BYTES:
                if refused is not None:
                    refused[directory] = (_stamp(info), f"{trust.too_big(layout.join(self.root, rel), info['size'])}"
                                                        "; not read")
                continue
            stage = parts[:-3] if len(parts) > 3 and parts[-3] == ATTEMPTS and parts[-2].isdigit() else parts[:-1]
            # pair/experiment/stage[/instance], itself or in .attempts/<n>
            if len(stage) in (3, 4) and not any(p.startswith(".") for p in stage):
                found[directory] = _stamp(info)
        for rel, (problem, info) in self.refused.items():
            if refused is not None and rel.rsplit("/", 1)[-1] == MANIFEST:
                refused[layout.join(self.root, rel.rsplit("/", 1)[0])] = (
                    _stamp(info), f"{layout.join(self.root, rel)}: an object name that {problem}; not read")
        return found

    def read_manifests(self, directories, stamps=None):
        """Read in concurrent batches."""
        paths = [f"{self.base}/{self._in(self._rel(d), MANIFEST)}" for d in directories]
        got = read_many(self.fs, paths) if paths else {}
        for directory, path in zip(directories, paths):
            yield directory, (stamps or {}).get(directory), got[path]

    def _contents(self, leaf: str) -> dict[str, bytes | Exception]:
        """Every workspace file named ``leaf`` in the tree, read in one batch."""
        if leaf not in self._read:
            names = [n for n in self.objects
                     if n.rsplit("/", 1)[-1] == leaf and not any(p.startswith(".") for p in n.split("/"))]
            big = {n for n in names if int(self.objects[n].get("size") or 0) > trust.MAX_MANIFEST_BYTES}
            got = read_many(self.fs, [f"{self.base}/{n}" for n in names if n not in big]) if names else {}
            self._read[leaf] = {n: trust.Untrusted(trust.too_big(f"{self.root}/{n}", self.objects[n]["size"]))
                                if n in big else got[f"{self.base}/{n}"] for n in names}
        return self._read[leaf]

    def manifest(self, directory: str) -> records.Manifest | None:
        rel = self._rel(directory)
        url = layout.join(directory.rstrip("/"), MANIFEST)
        if rel is None:  # another root's (an input from elsewhere): read it alone
            return read_manifest(directory)
        name = self._in(rel, MANIFEST)
        if name not in self.objects:
            return None
        if int(self.objects[name].get("size") or 0) > trust.MAX_MANIFEST_BYTES:
            raise manifest.ManifestError(f"{trust.too_big(url, self.objects[name]['size'])}; {manifest.UNUSED}")
        if any(part.startswith(".") for part in name.split("/")):   # in an archive: not in the batch
            try:
                text = self.fs.cat_file(f"{self.base}/{name}")
            except Exception as exc:
                text = exc
        else:
            text = self._contents(MANIFEST).get(name, FileNotFoundError(url))
        if isinstance(text, Exception):
            raise manifest.ManifestError(f"{url}: unreadable manifest ({text})")
        return manifest.parse(text, url)

    def marker(self, directory: str) -> tuple[bytes, float] | None:
        rel = self._rel(directory)
        name = self._in(rel, RUNNING) if rel is not None else None
        if name not in self.objects:
            return None
        text = self._contents(RUNNING).get(name)
        if not isinstance(text, bytes):
            return b"", 0.0   # listed, gone or unreadable since: its writer is gone
        return text, time.time() - mtime_of(self.objects[name])

    def archive(self, directory: str, keep: tuple[str, ...] = ()) -> str | None:
        """Server-side (see archive_objects)."""
        rel = self._rel(directory)
        prefix = self._in(rel, "")
        listing = {n[len(prefix):]: info for n, info in self.objects.items() if n.startswith(prefix)}
        target, moved = archive_objects(self.fs, self.base + ("/" + rel if rel else ""), listing, keep)
        if target:
            objects = dict(self.objects)
            for name in moved:
                objects[prefix + f"{target}/{name}"] = objects.pop(prefix + name)
            self._index(objects)
            for read in self._read.values():
                for name in moved:
                    read.pop(prefix + name, None)
        return target

    def archive_from(self, directory: str, base: str, paths: list[str], into: str | None = None) -> str | None:
        """Server-side (see move_into_archive); ``base`` in this bucket too."""
        rel, outputs = self._rel(directory), self._rel(base)
        if rel is None or outputs is None:
            raise manifest.ManifestError(f"{base}: outputs outside the root {self.root} (of the record {directory})")
        present = [p for p in paths if self._in(outputs, p) in self.objects]
        prefix = self._in(rel, "")
        listing = {n[len(prefix):]: info for n, info in self.objects.items() if n.startswith(prefix)}
        into = move_into_archive(self.fs, f"{self.base}/{rel}", listing, f"{self.base}/{outputs}".rstrip("/"),
                                 present, {}, into)
        if present:
            objects = dict(self.objects)
            for name in present:
                objects[prefix + f"{into}/{name}"] = objects.pop(self._in(outputs, name))
            self._index(objects)
        return into

    def write_manifest(self, directory: str, record: dict) -> None:
        rel = self._rel(directory)
        data = manifest.dumps(records.checked("manifest", record, layout.join(directory, MANIFEST))).encode()
        self.fs.pipe_file(f"{self.base}/{self._in(rel, MANIFEST)}", data)
        self._index({**self.objects, self._in(rel, MANIFEST): {"size": len(data),
                                                               "metadata": {MTIME_KEY: repr(time.time())}}})
        if MANIFEST in self._read:
            self._read[MANIFEST][self._in(rel, MANIFEST)] = data

    def write_marker(self, path: str, text: str) -> None:
        rel = self._rel(path)
        self.fs.pipe_file(f"{self.base}/{rel}", text.encode(), metadata={MTIME_KEY: repr(time.time())})
        self._index({**self.objects, rel: {"size": len(text.encode()), "metadata": {MTIME_KEY: repr(time.time())}}})

    def heartbeat(self, path: str) -> None:
        """Rewritten with its ``waypost-mtime`` now (a new generation: every reader's listing has it)."""
        rel = self._rel(path)
        data = self.fs.cat_file(f"{self.base}/{rel}")
        self.fs.pipe_file(f"{self.base}/{rel}", data, metadata={MTIME_KEY: repr(time.time())})

    def bring(self, source: StageStore, source_dir: str, stage_dir: str,
              outputs: list[dict]) -> tuple[str, dict[str, str]]:
        return bring_objects(self.fs, self._object(stage_dir), source, source_dir, outputs)

    def fetch(self, stage_dir: str, rel: str, local: str) -> str:
        self.fs.get_file(f"{self._object(stage_dir)}/{rel}", local)
        return "copied"   # (downloaded)

    def _object(self, directory: str) -> str:
        """The bucket/key of a directory (under the root or not)."""
        return self.client.filesystem(directory)[1]

    def remove(self, path: str) -> None:
        rel = self._rel(path)
        if rel in self.objects:
            self.fs.rm_file(f"{self.base}/{rel}")
            self._index({n: i for n, i in self.objects.items() if n != rel})

    def remove_tree(self, path: str) -> None:
        """Remove every object below a directory (one batch delete)."""
        rel = self._rel(path)
        if not rel:
            raise ValueError(f"{path}: not a directory under the root {self.root}")
        names = self._under(rel)
        if names:
            self.fs.rm([f"{self.base}/{n}" for n in names])
        gone = set(names)
        self._index({n: i for n, i in self.objects.items() if n not in gone})
        for read in self._read.values():
            for name in names:
                read.pop(name, None)

    def remove_files(self, directory: str, names: list[str]) -> None:
        """Remove some objects below a directory (relative names; one batch delete)."""
        rel = self._rel(directory)
        if not rel:
            raise ValueError(f"{directory}: not a directory under the root {self.root}")
        gone = {self._in(rel, name) for name in names} & set(self.objects)
        if gone:
            self.fs.rm([f"{self.base}/{n}" for n in sorted(gone)])
        self._index({n: i for n, i in self.objects.items() if n not in gone})
        for read in self._read.values():
            for name in gone:
                read.pop(name, None)

    def sha256(self, path: str) -> str:
        """Reads the object (nothing else can: a bucket lists other digests, GCS its crc32c and md5)."""
        with self.fs.open(self.client.filesystem(path)[1], "rb") as f:
            return manifest.sha256_stream(f)

    def digests(self, path: str) -> tuple[str, str | None]:
        """The sha256 read from the object, the crc32c from the listing."""
        return self.sha256(path), self.crc32c(path)


def _stamp(info: dict) -> str:
    """What changes whenever an object does: its generation."""
    return str(info.get("generation") or f"{info.get('updated')}:{info.get('size')}")


def read_manifest(directory: str) -> records.Manifest | None:
    """The manifest of one stage directory in a bucket, read alone (at most
    ``trust.MAX_MANIFEST_BYTES``); None when there is none."""
    url = layout.join(directory.rstrip("/"), MANIFEST)
    try:
        fs, path = client_of(url).filesystem(url)
        text = fs.cat_file(path, start=0, end=trust.MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise manifest.ManifestError(str(explain(exc, url))) from None
    return manifest.parse(text, url)
