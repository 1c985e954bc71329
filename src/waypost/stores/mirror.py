"""Stage directories on a bucket root (``gs://``, or any scheme with a
client in ``bucketclient.CLIENTS``).

On a gs:// root Snakemake only looks at the bucket (through waypost's storage
plugin) and gives jobs gs:// URLs. Steps are ordinary programs that read and
write local files, so the step runner runs each step on a local copy of its
stage directory (``.snakemake/storage/waypost/<bucket>/<key>``, the same
layout) and keeps the bucket in step with it:

- the step's command has local paths for the job's inputs and outputs:
  Snakemake formats it with them (``waypost.snakemake``: each of the job's
  files, whole, never a search through the command's text);
- at the start the inputs come down, with the manifests of their stages
  beside them (past an input whose stage did not succeed, the manifests of
  the stages upstream that kept it from success too, for a step that
  reports the first failure), and so do the stage's ``_manifest.json`` and
  ``_running.json`` (the whole workspace, checkpoints included, when
  Snakemake resubmits a job to go on with its series), and the side files
  beside an input that a rule in its own layout's job made, in a directory
  only it writes (as they sit beside it on disk);
- archiving a workspace into ``.attempts/<n>/`` is a server-side move;
- when an attempt starts, and every ``WAYPOST_SYNC_SECONDS`` (default 60)
  while it runs, the workspace goes up (logs, checkpoints, ...) but never the
  declared outputs, so a step killed mid-way never looks done while a lost
  machine loses at most that much of its checkpoints;
- at the end the outputs go up (only if they count: a success, or the
  placeholders a funnel needs), then ``_manifest.json`` last.

Everything goes through the root's client (``bucketclient``; on gs://,
gcsfs: credentials from Google's standard mechanisms, transient errors
retried with backoff).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading

from waypost.model import trust
from waypost.model.job import Job
from waypost.model.layout import ATTEMPTS, COPY_NOTE, MANIFEST, RUNNING
from waypost.model.locations import is_bucket_url, object_name, prefix_of
from waypost.model.states import SOUND_INPUTS, SUCCESS
from waypost.stores.base import MTIME_KEY, StageStore
from waypost.stores.bucketclient import client_of
from waypost.stores.bucketmoves import archive_objects
from waypost.stores.bucketoutputs import OutputsInBucket, objects_beside

PROVIDER = "waypost"  # the storage plugin: src/snakemake_storage_plugin_waypost
SYNC_SECONDS = float(os.environ.get("WAYPOST_SYNC_SECONDS", "60"))


def local_of(mirror: str, url: str) -> str:
    """Where a bucket's URL is copied locally under ``mirror`` (gs://B/K at
    MIRROR/B/K, the layout of Snakemake's own local copies of storage files):
    the one mapping the step's command, the runner and the planner share. A
    path is its own."""
    return os.path.join(mirror, object_name(url)) if is_bucket_url(url) else url


def url_of(mirror: str, local_path: str, scheme: str) -> str:
    """The URL (``scheme``: the root's, which its local copies leave out) of
    a file in the local copy of the bucket under ``mirror`` (``local_of``'s
    other way); any other path as it is."""
    path, top = os.path.abspath(local_path), os.path.abspath(mirror)
    return scheme + path[len(top) + 1:] if path.startswith(top + "/") else local_path


class BucketWorkspace:
    """One job's record directory in a bucket and the local copy its step
    works in: a stage's whole workspace, outputs and all; for a job whose
    outputs are elsewhere (``job``: a rule in its own layout's), its record,
    and its outputs where its rule puts them (``outside``), with the side
    files its attempts leave in the directories only it writes
    (``own_dirs``). ``input_dirs``: the directories of its inputs that the
    jobs that made them write alone (rules in their own layout), whose side
    files come down with the inputs, as they sit beside them on disk."""

    def __init__(self, url: str, local: str, job: Job | None = None, own_dirs: list[str] = (),
                 input_dirs: list[str] = ()):
        self.url = url.rstrip("/")
        self.local = os.path.abspath(local)
        self.fs, self.path = client_of(self.url).filesystem(self.url)
        if not self.local.endswith("/" + self.path):
            raise ValueError(f"{local} is not a local copy of {url}")
        self.mirror = self.local[: -len(self.path) - 1]  # gs://B/K is mirrored at MIRROR/B/K
        self._synced: dict[str, tuple[int, int]] = {}    # local file → (size, mtime_ns) as in the bucket
        self._pulled: dict[str, dict] = {}   # the stage's workspace in the bucket when pulled
        self.root_local: str | None = None   # the local copy of the root it is under, when known (``runnerstage.for_runner``)
        self.input_dirs = [os.path.abspath(d) for d in input_dirs]
        elsewhere = list(job.outputs_outside_record) if job else []
        self.outside = OutputsInBucket(self, elsewhere, list(own_dirs))   # (none for a stage)

    def local_of(self, url: str) -> str:
        """Where a bucket's URL is copied locally."""
        return local_of(self.mirror, url)

    def local_of_object(self, name: str) -> str:
        """Where an object (its name in ``fs``: bucket/key) is copied locally."""
        return os.path.join(self.mirror, name)

    def url_of(self, local_path: str) -> str:
        """The URL of a file in the local copy of the bucket."""
        return url_of(self.mirror, local_path, prefix_of(self.url))

    def object_name(self, local_path: str) -> str:
        """The object name (bucket/key) of a file in the local copy of the bucket."""
        return object_name(self.url_of(local_path))

    def locate(self, inputs: list[dict]) -> list[dict]:
        """Input records (``parents.describe_inputs``) naming where the inputs
        live, not where this run's copies were."""
        return [{**i, "path": self.url_of(i["path"]), "manifest": i["manifest"] and self.url_of(i["manifest"])}
                for i in inputs]

    def _remote(self, rel: str) -> str:
        return f"{self.path}/{rel}"

    def listing(self) -> dict[str, dict]:
        """The stage's objects, archives included (relative name → info).
        An object whose name no local path can stand for (``..``, an empty
        or ``.`` part, a backslash: trust.relative_problem) is left out, and
        so left alone: never pulled, archived or removed."""
        try:
            found = self.fs.find(self.path, detail=True)
        except FileNotFoundError:
            return {}
        listing = {}
        for name, info in found.items():
            rel = name[len(self.path) + 1:]
            problem = trust.relative_problem(rel) if name.startswith(self.path + "/") else "is not below it"
            if problem:
                print(f"waypost: {self.url}: object {rel or name!r} {problem}; left alone (not pulled, archived "
                      "or removed)", file=sys.stderr)
                continue
            listing[rel] = info
        return listing

    @staticmethod
    def _workspace(listing: dict) -> dict:
        return {rel: info for rel, info in listing.items() if not rel.startswith(ATTEMPTS + "/")}

    def _local_files(self) -> dict[str, tuple[int, int]]:
        found = {}
        for directory, _, names in os.walk(self.local):
            for name in names:
                if not name.startswith(".tmp-"):  # a file being written or fetched
                    full = os.path.join(directory, name)
                    st = os.stat(full)
                    found[os.path.relpath(full, self.local)] = (st.st_size, st.st_mtime_ns)
        return found

    def _record(self, rels) -> None:
        for rel in rels:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(self.local, rel))
                self._synced[rel] = (st.st_size, st.st_mtime_ns)

    def _upload(self, rels: list[str]) -> None:
        if rels:
            self.fs.put([os.path.join(self.local, r) for r in rels], [self._remote(r) for r in rels])
            self._record(rels)

    def pull(self, inputs: list[str]) -> None:
        """A fresh local copy of the stage dir's engine files (its manifest and
        running record); the inputs (local paths); and the manifest of each
        input's stage beside the input (or none, where the input was placed
        by hand). Where an input's stage did not succeed, also the manifests
        of the stages upstream that kept it from success (``blocking_manifests``,
        transitively; only through stages that did not succeed), at their
        local copies (``local_of``; a step finds them through
        ``$WAYPOST_MIRROR``): nothing more when every input succeeded."""
        shutil.rmtree(self.local, ignore_errors=True)
        os.makedirs(self.local)
        self._pulled = self._workspace(self.listing())
        wanted = [rel for rel in self._pulled if rel in (MANIFEST, RUNNING)]
        download(self.fs, [self._remote(r) for r in wanted], [os.path.join(self.local, r) for r in wanted])
        self._record(wanted)
        download(self.fs, [self.object_name(p) for p in inputs], inputs)
        manifests = {os.path.join(os.path.dirname(os.path.abspath(p)), MANIFEST) for p in inputs}
        seen = set(manifests)
        while manifests:
            found = self.fs.cat([self.object_name(m) for m in manifests], on_error="omit")
            upstream = set()
            for local in manifests:
                data = found.get(self.object_name(local))
                if data is None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(local)  # an old copy must not outlive the bucket's
                    above = self._manifest_above(local)
                    if above is not None:   # an input in a directory() output: its stage's, further up
                        upstream.add(above)
                else:
                    with open(_temp(local), "wb") as f:
                        f.write(data)
                    os.replace(_temp(local), local)
                    for url in blocking_manifests(data, self.url_of(local)):
                        if trust.inside(os.path.abspath(self.local_of(url)), self.mirror):   # (parse saw to it)
                            upstream.add(self.local_of(url))
            # Past an input that did not succeed: the manifests of the stages
            # that blocked it, and so on upstream (at their local copies, for
            # a step that reports the first failure: the reference report).
            manifests = upstream - seen
            seen |= manifests
        self.outside.drop_local()
        self._pull_beside(inputs)

    def _pull_beside(self, inputs: list[str]) -> None:
        """What is beside the inputs in the directories the jobs that made
        them write alone (``input_dirs``: their side files)."""
        fetched = {os.path.abspath(i) for i in inputs}
        side = {local: name for local, name in objects_beside(self, self.input_dirs, self.outside.outputs).items()
                if local not in fetched}
        download(self.fs, list(side.values()), list(side))

    def _manifest_above(self, local: str) -> str | None:
        """The manifest one directory up from a missing one, while that
        directory is a stage directory or below one (pair/experiment/stage
        under the root): where an input in a ``directory()`` output (a
        checkpoint's parts) finds the manifest of the stage that made it."""
        if self.root_local is None:
            return None
        directory = os.path.dirname(os.path.dirname(local))
        rel = os.path.relpath(directory, self.root_local)
        if rel.startswith("..") or rel.count("/") < 2:
            return None
        return os.path.join(directory, MANIFEST)

    def refresh(self) -> None:
        """The stage's ``_manifest.json`` and ``_running.json`` as the bucket
        has them now (a local copy of one it no longer has is removed)."""
        for rel in (MANIFEST, RUNNING):
            local = os.path.join(self.local, rel)
            try:
                data = self.fs.cat_file(self._remote(rel))
            except FileNotFoundError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(local)
                continue
            with open(_temp(local), "wb") as f:
                f.write(data)
            os.replace(_temp(local), local)

    def pull_workspace(self) -> None:
        """The rest of the stage's workspace (as listed by ``pull``), to go on with a series."""
        wanted = [rel for rel in self._pulled if rel not in self._synced]
        download(self.fs, [self._remote(r) for r in wanted], [os.path.join(self.local, r) for r in wanted])
        self._record(wanted)
        outside = self.outside.to_fetch()   # (the job's outputs elsewhere in the bucket, if any)
        download(self.fs, list(outside.values()), list(outside))
        self.outside.note_sent(outside)

    def push(self, outputs: list[str], final: bool = False) -> None:
        """Make the bucket's workspace what the local one is, and the
        job's files outside it (``outside``, its logs, what it left beside
        its outputs): the declared outputs go up only at the end
        (``final``); ``_manifest.json`` after everything else."""
        self.outside.push(final)
        held = set() if final else {os.path.relpath(os.path.abspath(o), self.local) for o in outputs}

        def is_held(rel: str) -> bool:   # a declared output, or a file of a directory() one
            return rel in held or any(rel.startswith(h + "/") for h in held)
        local = {rel: st for rel, st in self._local_files().items() if not is_held(rel)}
        remote = self._workspace(self.listing())
        self._upload([rel for rel, st in local.items()
                      if rel != MANIFEST and (rel not in remote or self._synced.get(rel) != st)])
        stale = [rel for rel in remote if rel not in local and not is_held(rel)]
        if stale:
            self.fs.rm([self._remote(r) for r in stale])
        # (only when it changed: an unchanged one uploaded again would look
        # newer than the running marker of an attempt that goes on in place)
        if MANIFEST in local and (MANIFEST not in remote or self._synced.get(MANIFEST) != local[MANIFEST]):
            self._upload_manifest()

    def _upload_manifest(self) -> None:
        """``_manifest.json`` up, with the set of inputs it records as the
        object's metadata (``manifest.INPUT_SET_KEY``: a planning compares it
        from the listing, without a download)."""
        from waypost.model import manifest
        metadata = {}
        try:
            data = manifest.read(self.local) or {}
            metadata[manifest.INPUT_SET_KEY] = manifest.input_set(
                str(i.get("path")) for i in data.get("inputs") or [] if isinstance(i, dict))
        except manifest.ManifestError:
            pass
        self.fs.put_file(os.path.join(self.local, MANIFEST), self._remote(MANIFEST), metadata=metadata)
        self._record([MANIFEST])

    @contextlib.contextmanager
    def syncing(self, outputs: list[str]):
        """Push the workspace every SYNC_SECONDS while a step runs."""
        stop = threading.Event()

        def loop():
            while not stop.wait(SYNC_SECONDS):
                try:
                    self.push(outputs)
                except Exception as exc:
                    print(f"waypost: syncing {self.url} failed ({exc}); trying again later", file=sys.stderr)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def archive(self, keep: tuple[str, ...] = ()) -> str | None:
        """Move the workspace (but the entries in ``keep``) into
        ``.attempts/<n>/``: server-side for what the bucket has, uploaded
        straight there for what is only local. Returns ``.attempts/<n>``."""
        listing = self.listing()
        remote = self._workspace(listing)
        local = {rel: st for rel, st in self._local_files().items() if rel.split("/")[0] not in keep}
        fresh = {rel: os.path.join(self.local, rel) for rel, st in local.items()
                 if rel not in remote or self._synced.get(rel) != st}
        for rel in [rel for rel in fresh if trust.escapes(self.local, rel)]:   # a link out: never followed
            print(f"waypost: {self.url}: {rel} is a symbolic link out of the stage directory; not archived",
                  file=sys.stderr)
            del fresh[rel]
        target, _ = archive_objects(self.fs, self.path, listing, keep, fresh)
        if target is None:
            return None
        for entry in {rel.split("/")[0] for rel in local}:
            path = os.path.join(self.local, entry)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        self._synced = {rel: st for rel, st in self._synced.items() if rel.split("/")[0] in keep}
        return target

    def copy_in(self, store: StageStore, source_dir: str,
                places: list[tuple[str, dict]]) -> tuple[str, dict[str, str]]:
        """Bring a reused job's files into the bucket: each (local copy of
        its place, its entry in the source's manifest, whose ``path`` is from
        ``source_dir`` in ``store``), checked (``bucketmoves.copy_checked``:
        server-side from a bucket, checked by crc32c; uploaded from disk,
        checked by sha256). Says how, and gives the crc32c of each copy
        where seen, by its entry's path."""
        from waypost.stores.bucketmoves import copy_checked
        if store.bucket_url is None:   # the source's files are local: checked, then uploaded
            copies = [(store.local_file(source_dir, e["path"]), self.object_name(t), e) for t, e in places]
        else:
            base = store.bucket_of(source_dir)
            copies = [(f"{base}/{e['path']}", self.object_name(t), e) for t, e in places]
        crc32cs = copy_checked(self.fs, copies)
        how = "uploaded" if store.bucket_url is None else "copied in the bucket"
        return how, {e["path"]: crc32cs[target] for _, target, e in copies if target in crc32cs}

    def put_marker(self, name: str, mtime: float) -> None:
        """Upload a marker file dated ``mtime`` for Snakemake (see the storage plugin)."""
        with open(os.path.join(self.local, name), "rb") as f:
            self.fs.pipe_file(self._remote(name), f.read(), metadata={MTIME_KEY: repr(mtime)})

    def registry(self, url: str, until: float | None) -> None:
        """Create (dated ``until``) or remove an empty object at ``url`` (a bucket's URL)."""
        path = client_of(url).filesystem(url)[1]
        if until is not None:
            self.fs.pipe_file(path, b"", metadata={MTIME_KEY: repr(until)})
        else:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)

    def remove_marker(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._remote(name))

    def close(self) -> None:
        """After the manifest: no attempt is in progress any more, and the
        local copy of the stage dir is not needed (the bucket has it all)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._remote(RUNNING))
        shutil.rmtree(self.local, ignore_errors=True)


def blocking_manifests(text: bytes, url: str = "manifest") -> list[str]:
    """The manifests (bucket URLs) of the inputs that kept a stage from
    success, from its manifest (at ``url``): none for a SUCCESS stage, or one
    that can't be read or used (``manifest.parse``: every URL it lists is a
    normalised one, so its local copy stays in the mirror)."""
    from waypost.model.manifest import ManifestError, parse

    try:
        data = parse(text, url)
    except ManifestError:
        return []
    if data.get("state") == SUCCESS:
        return []
    return [os.path.dirname(i["path"]) + "/" + MANIFEST for i in data.get("inputs") or []
            if isinstance(i, dict) and i.get("state") not in SOUND_INPUTS
            and is_bucket_url(str(i.get("path")))]


def snakemake_options(root: str) -> list[str]:
    """The Snakemake options a run over ``root`` needs (none for a local root)."""
    if not is_bucket_url(root):
        return []
    return ["--default-storage-provider", PROVIDER, "--default-storage-prefix", root]


def _temp(path: str) -> str:
    return os.path.join(os.path.dirname(path), f".tmp-{os.getpid()}-{os.path.basename(path)}")


def download(fs, remote: list[str], local: list[str]) -> None:
    """Download, all at once, each file under a temporary name renamed into
    place (jobs running side by side fetch the same inputs). One that is
    missing (deleted meanwhile) is left for the runner to find missing."""
    for path in local:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    temps = [_temp(p) for p in local]
    try:
        if remote:
            fs.get(remote, temps)
    except FileNotFoundError:
        for one, temp, path in zip(remote, temps, local):
            try:
                fs.get_file(one, temp)
            except FileNotFoundError:
                fetch_folder(fs, one, path)
    for temp, path in zip(temps, local):
        if os.path.exists(temp):
            os.replace(temp, path)


def fetch_folder(fs, remote: str, local: str) -> None:
    """A ``directory()`` (a prefix, no object of its own) made the bucket's
    at its local copy: every object below it, into a fresh directory put in
    place of the old copy (whose files the bucket may no longer have); the
    copy left alone when it is the bucket's already. Nothing when there are none."""
    found = {n: i for n, i in fs.find(remote, detail=True).items() if n.startswith(remote.rstrip("/") + "/")}
    if not found:
        return
    names = sorted(found)
    # Each object's generation, kept beside the copy: a copy that is the
    # bucket's is left alone (jobs side by side may be reading it).
    generations = {n[len(remote.rstrip("/")) + 1:]: str(found[n].get("generation") or found[n].get("updated"))
                   for n in names}
    listed = os.path.join(os.path.dirname(local), COPY_NOTE.format(os.path.basename(local)))
    with contextlib.suppress(OSError, ValueError), open(listed) as f:
        if os.path.isdir(local) and json.load(f) == generations \
                and all(os.path.exists(os.path.join(local, rel)) for rel in generations):
            return
    fresh = _temp(local)
    shutil.rmtree(fresh, ignore_errors=True)
    targets = [os.path.join(fresh, n[len(remote.rstrip("/")) + 1:]) for n in names]
    for target in targets:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    fs.get(names, targets)
    old = _temp(local) + ".old"
    if os.path.isdir(local):
        os.rename(local, old)
    os.rename(fresh, local)
    shutil.rmtree(old, ignore_errors=True)
    with open(_temp(listed), "w") as f:
        json.dump(generations, f)
    os.replace(_temp(listed), listed)
