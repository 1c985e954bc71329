"""Stage directories in a ``gs://bucket/prefix``, through the bucket's API (gcsfs).

One listing of the prefix when the store is made; manifests and
``_running.json`` markers read in one concurrent batch the first time one is
asked for; archiving a stage a server-side copy + delete, resumable; a reuse
from the same service a server-side copy checked by crc32c. A bucket store is
a snapshot: what others write after it was listed is not in it (what it
archives or writes itself is). A GCS object is whole or absent (never half
written), and its listing is strongly consistent, so a stage is done on any
node once its manifest object is there.
"""

from __future__ import annotations

import json
import os
import time
from bisect import bisect_left

from waypost.model import layout, manifest, records, trust
from waypost.model.layout import ARCHIVING, ATTEMPTS, MANIFEST, RUNNING
from waypost.model.locations import is_bucket_url
from waypost.stores import gcs
from waypost.stores.base import StageStore, archive_number, walked


class BucketStore(StageStore):
    snapshot = True
    listed_crc32c = True
    links = False
    appends = False   # objects: written whole
    server_side_copy = True

    def __init__(self, root: str, found: dict[str, dict] | None = None):
        """A listing of ``root``; or, with ``found``, one made already
        (fsspec name → info: the planning's)."""
        self.root = self.bucket_url = root.rstrip("/")
        self.fs, self.base = gcs.filesystem(self.root)
        if found is None:
            gcs.check_bucket(self.root)
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

    def _index(self, objects: dict[str, dict]) -> None:
        self.objects = objects                      # relative name → object info
        self._sorted: list[str] | None = None       # their names, sorted (made when asked for)
        self.children: dict[str, set[str]] = {}     # relative dir ("" the root) → names in it
        for name in objects:
            parts = name.split("/")
            for depth in range(len(parts)):
                self.children.setdefault("/".join(parts[:depth]), set()).add(parts[depth])

    def _rel(self, path: str) -> str | None:
        """``path`` relative to the root ("" for the root); None if outside."""
        path = path.rstrip("/")
        if path == self.root:
            return ""
        return path[len(self.root) + 1:] if path.startswith(self.root + "/") else None

    @staticmethod
    def _in(rel: str, name: str) -> str:
        return f"{rel}/{name}" if rel else name

    def key(self, path: str) -> str:
        return path.rstrip("/")

    def relative(self, path: str) -> str:
        rel = self._rel(path)
        return path if rel is None else rel

    def entries(self, directory: str) -> list[str]:
        rel = self._rel(directory)
        return sorted(self.children.get(rel, set()) - {ATTEMPTS}) if rel is not None else []

    def isdir(self, path: str) -> bool:
        rel = self._rel(path)
        return rel is not None and rel in self.children

    def isfile(self, path: str) -> bool:
        return self._rel(path) in self.objects

    def exists(self, path: str) -> bool:
        return self._rel(path) in self.objects

    def escapes(self, stage_dir: str, rel: str) -> str | None:
        return None   # objects have no links

    def size(self, path: str) -> int | None:
        info = self.objects.get(self._rel(path))
        return None if info is None else info["size"]

    def files(self, directory: str) -> list[str]:
        rel = self._rel(directory)
        if rel is None:
            return []
        prefix = self._in(rel, "")
        return sorted(name[len(prefix):] for name in self.objects if name.startswith(prefix))

    def marker_dirs(self, leaf: str = MANIFEST) -> list[str]:
        found = []
        for name in self.objects:
            parts = name.split("/")
            if parts[-1] == leaf and len(parts) <= 7 and all(walked(p) for p in parts[:-1]):
                found.append(layout.join(self.root, *parts[:-1]))
        return sorted(found)

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
        got = gcs.read_many(self.fs, paths) if paths else {}
        for directory, path in zip(directories, paths):
            yield directory, (stamps or {}).get(directory), got[path]

    def _contents(self, leaf: str) -> dict[str, bytes | Exception]:
        """Every workspace file named ``leaf`` in the tree, read in one batch."""
        if leaf not in self._read:
            names = [n for n in self.objects
                     if n.rsplit("/", 1)[-1] == leaf and not any(p.startswith(".") for p in n.split("/"))]
            big = {n for n in names if int(self.objects[n].get("size") or 0) > trust.MAX_MANIFEST_BYTES}
            got = gcs.read_many(self.fs, [f"{self.base}/{n}" for n in names if n not in big]) if names else {}
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

    def mtime(self, path: str) -> float:
        info = self.objects.get(self._rel(path))
        if info is None:
            raise FileNotFoundError(path)
        return gcs.mtime_of(info)

    def marker(self, directory: str) -> tuple[bytes, float] | None:
        rel = self._rel(directory)
        name = self._in(rel, RUNNING) if rel is not None else None
        if name not in self.objects:
            return None
        text = self._contents(RUNNING).get(name)
        if not isinstance(text, bytes):
            return b"", 0.0   # listed, gone or unreadable since: its writer is gone
        return text, time.time() - gcs.mtime_of(self.objects[name])

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
                                                               "metadata": {gcs.MTIME_KEY: repr(time.time())}}})
        if MANIFEST in self._read:
            self._read[MANIFEST][self._in(rel, MANIFEST)] = data

    def write_marker(self, path: str, text: str) -> None:
        rel = self._rel(path)
        self.fs.pipe_file(f"{self.base}/{rel}", text.encode(), metadata={gcs.MTIME_KEY: repr(time.time())})
        self._index({**self.objects, rel: {"size": len(text.encode()), "metadata": {gcs.MTIME_KEY: repr(time.time())}}})

    def heartbeat(self, path: str) -> None:
        """Rewritten with its ``waypost-mtime`` now (a new generation: every reader's listing has it)."""
        rel = self._rel(path)
        data = self.fs.cat_file(f"{self.base}/{rel}")
        self.fs.pipe_file(f"{self.base}/{rel}", data, metadata={gcs.MTIME_KEY: repr(time.time())})

    def bring(self, source: StageStore, source_dir: str, stage_dir: str,
              outputs: list[dict]) -> tuple[str, dict[str, str]]:
        return bring_objects(self.fs, self._object(stage_dir), source, source_dir, outputs)

    def fetch(self, stage_dir: str, rel: str, local: str) -> str:
        self.fs.get_file(f"{self._object(stage_dir)}/{rel}", local)
        return "copied"   # (downloaded)

    def bucket_of(self, directory: str) -> str:
        return directory.rstrip("/")

    def _object(self, directory: str) -> str:
        """The bucket/key of a directory (under the root or not)."""
        return gcs.filesystem(directory)[1]

    def remove(self, path: str) -> None:
        rel = self._rel(path)
        if rel in self.objects:
            self.fs.rm_file(f"{self.base}/{rel}")
            self._index({n: i for n, i in self.objects.items() if n != rel})

    def _under(self, rel: str) -> list[str]:
        """The names of the objects below a directory (relative to the root)."""
        if self._sorted is None:
            self._sorted = sorted(self.objects)
        prefix = self._in(rel, "")
        start = bisect_left(self._sorted, prefix)
        end = bisect_left(self._sorted, prefix + "\U0010ffff", start)
        return self._sorted[start:end]

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

    def file_sizes(self, directory: str) -> dict[str, int]:
        rel = self._rel(directory)
        if not rel:
            return {}
        prefix = self._in(rel, "")
        return {name[len(prefix):]: int(self.objects[name].get("size") or 0) for name in self._under(rel)}

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

    def archives(self, directory: str) -> list[str]:
        rel = self._rel(directory)
        if rel is None:
            return []
        attempts = self._in(rel, ATTEMPTS)
        names = self.children.get(attempts, ())
        return sorted((n for n in names if n.isascii() and n.isdigit() and f"{attempts}/{n}" in self.children), key=int)

    def usage(self, path: str) -> tuple[int, int, float | None]:
        """(bytes, objects, newest object time) below a directory, from the
        listing (an archive's objects are written when it is made: a
        server-side move is a copy)."""
        rel = self._rel(path)
        if rel is None:
            return 0, 0, None
        total, count, newest = 0, 0, None
        for name in self._under(rel):
            info = self.objects[name]
            total, count = total + int(info.get("size") or 0), count + 1
            when = _epoch(info)
            if when is not None and (newest is None or when > newest):
                newest = when
        return total, count, newest

    def sha256(self, path: str) -> str:
        """Reads the object (nothing else can: GCS keeps crc32c and md5)."""
        with self.fs.open(gcs.filesystem(path)[1], "rb") as f:
            return manifest.sha256_stream(f)

    def crc32c(self, path: str) -> str | None:
        """The object's crc32c as the listing has it (base64 of the 4
        big-endian bytes, as manifests record it); None if it isn't there."""
        info = self.objects.get(self._rel(path))
        return None if info is None else info.get("crc32c")

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
        fs, path = gcs.filesystem(url)
        text = fs.cat_file(path, start=0, end=trust.MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise manifest.ManifestError(str(gcs.explain(exc, url))) from None
    return manifest.parse(text, url)


def _epoch(info: dict) -> float | None:
    """An object's last write (epoch seconds) from its listing info."""
    when = info.get("mtime") or info.get("updated")
    if when is None:
        return None
    if isinstance(when, str):
        from datetime import datetime
        try:
            when = datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            return None
    return when.timestamp() if hasattr(when, "timestamp") else float(when)



def archive_objects(fs, path: str, listing: dict[str, dict], keep: tuple[str, ...] = (),
                    uploads: dict[str, str] | None = None) -> tuple[str | None, list[str]]:
    """Move a stage directory's workspace in the bucket into ``.attempts/<n>/``
    server-side (a rewrite per object, nothing downloaded), all but the
    entries in ``keep``. ``path`` is the stage dir (bucket/key), ``listing``
    its objects (relative name → info, archives included); ``uploads``
    (relative name → local file) go up straight into the archive instead of
    their bucket copies (``move_into_archive``). Returns ``.attempts/<n>``
    (None when there was nothing to archive) and the relative names moved
    out of the workspace."""
    remote = [rel for rel in listing if not rel.startswith(ATTEMPTS + "/") and rel.split("/")[0] not in keep]
    return move_into_archive(fs, path, listing, path, remote, uploads or {}), remote


def move_into_archive(fs, record: str, listing: dict[str, dict], source: str, remote: list[str],
                      uploads: dict[str, str], into: str | None = None) -> str | None:
    """Move the objects ``remote`` (names relative to ``source``, bucket/key)
    into the ``.attempts/<n>/`` of the record directory ``record`` (whose
    objects ``listing`` lists, archives included), each at its name there,
    server-side; ``uploads`` (name → local file) go up straight into it.
    ``into``: an archive made just before (``.attempts/<n>``), to add to.
    Safe to cut short: a note (``layout.ARCHIVING``) goes into the archive
    first and goes last, every copy is made before any delete, and the
    next archive goes on into the same ``<n>``. Returns the archive, or
    ``into`` when there was nothing to move."""
    if not remote and not uploads:
        return into
    if into is None:
        archived = [rel.split("/") for rel in listing if rel.startswith(ATTEMPTS + "/")]
        names = {parts[1] for parts in archived if len(parts) > 2}
        cut = {parts[1] for parts in archived if len(parts) == 3 and parts[2] == ARCHIVING}
        into = f"{ATTEMPTS}/{archive_number(names, cut)}"
    fs.pipe_file(f"{record}/{into}/{ARCHIVING}", json.dumps(sorted({*remote, *uploads})).encode())
    moved = [rel for rel in remote if rel not in uploads]
    if moved:
        fs.copy([f"{source}/{r}" for r in moved], [f"{record}/{into}/{r}" for r in moved])
    if uploads:
        fs.put(list(uploads.values()), [f"{record}/{into}/{r}" for r in uploads])
    if remote:
        fs.rm([f"{source}/{r}" for r in remote])
    fs.rm_file(f"{record}/{into}/{ARCHIVING}")
    return into


def bring_objects(fs, target: str, source: StageStore, source_dir: str,
                  outputs: list[dict]) -> tuple[str, dict[str, str]]:
    """A reused stage's outputs into the stage dir at bucket/key ``target``
    (``copy_checked``): says how, and gives each copy's crc32c where seen."""
    if source.bucket_url is None:   # the source's files are local: checked, then uploaded
        copies = [(source.local_file(source_dir, o["path"]), f"{target}/{o['path']}", o) for o in outputs]
    else:
        base = source.bucket_of(source_dir)
        copies = [(f"{base}/{o['path']}", f"{target}/{o['path']}", o) for o in outputs]
    crc32cs = copy_checked(fs, copies)
    how = "uploaded" if source.bucket_url is None else "copied in the bucket"
    return how, {o["path"]: crc32cs[f"{target}/{o['path']}"] for o in outputs if f"{target}/{o['path']}" in crc32cs}


def _check_listed(url: str, info: dict, out: dict) -> None:
    """An object as its bucket lists it (``info``) against its manifest's
    entry ``out``: its size, and its crc32c where the manifest records one."""
    if info["size"] != out.get("size"):
        raise manifest.ManifestError(f"{url}: differs from its manifest (size {info['size']} vs {out.get('size')})")
    if out.get("crc32c") and info.get("crc32c") != out["crc32c"]:
        raise manifest.ManifestError(f"{url}: differs from its manifest (crc32c {info.get('crc32c')} vs "
                                     f"{out['crc32c']}): replaced since the manifest was written")


def copy_checked(fs, copies: list[tuple[str, str, dict]]) -> dict[str, str]:
    """Each (source: a local path or a gs:// URL, target: bucket/key, the
    source's manifest entry): every source checked against its entry (a
    local file: its size and sha256; in a bucket: the size and crc32c its
    listing has, where the manifest records one: nothing downloaded), then
    copied in (uploaded; server-side), each server-side copy checked against
    its source's crc32c. Nothing is copied unless every source checks out.
    Returns target → crc32c, for the server-side copies."""
    local = [(src, dst, out) for src, dst, out in copies if not is_bucket_url(src)]
    remote = [(gcs.filesystem(src)[1], dst, out) for src, dst, out in copies if is_bucket_url(src)]
    for path, _, out in local:
        if os.path.getsize(path) != out.get("size") or manifest.sha256_file(path) != out.get("sha256"):
            raise manifest.ManifestError(f"{path}: differs from its manifest (size or sha256)")
    found = {src: fs.info(src) for src, _, _ in remote}
    for src, _, out in remote:
        _check_listed(gcs.url_of(fs, src), found[src], out)
    if local:
        fs.put([src for src, _, _ in local], [dst for _, dst, _ in local])
    return _copy_server_side(fs, [(src, dst) for src, dst, _ in remote], found) if remote else {}


def _copy_server_side(fs, pairs: list[tuple[str, str]], found: dict[str, dict]) -> dict[str, str]:
    """Copy each (source, target) object in the service, then check each
    copy's crc32c against its source's as listed (``found``): a copy that
    differs removes them all. Target → crc32c."""
    targets = [dst for _, dst in pairs]
    fs.copy([src for src, _ in pairs], targets)
    copied = [fs.info(t) for t in targets]
    if any(c.get("crc32c") != found[src].get("crc32c") for c, (src, _) in zip(copied, pairs)):
        fs.rm(targets)
        raise manifest.ManifestError(f"{gcs.url_of(fs, pairs[0][0])}: a server-side copy differs from its "
                                     "source (crc32c)")
    return {dst: found[src]["crc32c"] for src, dst in pairs if found[src].get("crc32c")}
