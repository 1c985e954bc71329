"""Stage directories on a ``gs://`` root.

Steps are ordinary programs that read and write local files, so on a gs://
root Snakemake works on a local copy of the bucket
(``.snakemake/storage/waypost/<bucket>/<prefix>/...``, through waypost's
storage plugin) and the step runner keeps each stage directory in the bucket
in step with its local copy:

- at the start, the stage's ``_manifest.json`` and ``_running.json`` come
  down (the whole workspace, checkpoints included, when Snakemake resubmits a
  job to go on with its series), and so do the manifests of the input stages,
  beside the inputs Snakemake fetched;
- archiving a workspace into ``.attempts/<n>/`` is a server-side move;
- when an attempt starts, the workspace goes up (logs, checkpoints, ...) but
  never the declared outputs, so a step killed mid-way never looks done;
- at the end the outputs go up, then ``_manifest.json`` last. Snakemake's
  own store of the outputs afterwards finds them there and uploads nothing.

Everything goes through gcsfs: credentials from Google's standard mechanisms,
transient errors retried with backoff.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from . import storage
from .layout import ATTEMPTS, MANIFEST, RUNNING

PROVIDER = "waypost"  # the storage plugin: src/snakemake_storage_plugin_waypost


class RemoteStage:
    """One stage directory in a bucket and the local copy its step works in."""

    def __init__(self, url: str, local: str):
        self.url = url.rstrip("/")
        self.local = os.path.abspath(local)
        self.fs, self.path = storage.filesystem(self.url)
        if not self.local.endswith("/" + self.path):
            raise ValueError(f"{local} is not a local copy of {url}")
        self.mirror = self.local[: -len(self.path) - 1]  # gs://B/K is mirrored at MIRROR/B/K
        self._synced: dict[str, tuple[int, int]] = {}    # local file → (size, mtime_ns) as in the bucket

    def url_of(self, local_path: str) -> str:
        """The gs:// URL of a file in the local copy of the bucket."""
        path = os.path.abspath(local_path)
        if path.startswith(self.mirror + "/"):
            return storage.GCS_PREFIX + path[len(self.mirror) + 1:]
        return local_path

    def locate(self, inputs: list[dict]) -> list[dict]:
        """Input records (``runner.describe_inputs``) naming where the inputs
        live, not where this run's copies were."""
        return [{**i, "path": self.url_of(i["path"]), "manifest": i["manifest"] and self.url_of(i["manifest"])}
                for i in inputs]

    def _remote(self, rel: str) -> str:
        return f"{self.path}/{rel}"

    def _listing(self) -> dict[str, dict]:
        """The stage's objects, archives included (relative name → info)."""
        try:
            found = self.fs.find(self.path, detail=True)
        except FileNotFoundError:
            return {}
        return {name[len(self.path) + 1:]: info for name, info in found.items()}

    @staticmethod
    def _workspace(listing: dict) -> dict:
        return {rel: info for rel, info in listing.items() if not rel.startswith(ATTEMPTS + "/")}

    def _local_files(self) -> dict[str, tuple[int, int]]:
        found = {}
        for directory, _, names in os.walk(self.local):
            for name in names:
                if not name.startswith(".tmp-"):  # a manifest being written
                    full = os.path.join(directory, name)
                    st = os.stat(full)
                    found[os.path.relpath(full, self.local)] = (st.st_size, st.st_mtime_ns)
        return found

    def _record(self, rels) -> None:
        for rel in rels:
            st = os.stat(os.path.join(self.local, rel))
            self._synced[rel] = (st.st_size, st.st_mtime_ns)

    def _upload(self, rels: list[str]) -> None:
        if rels:
            self.fs.put([os.path.join(self.local, r) for r in rels], [self._remote(r) for r in rels])
            self._record(rels)

    def pull(self, inputs: list[str], workspace: bool) -> None:
        """A fresh local copy of the stage dir: the engine's files, or the
        whole workspace (``workspace``: to go on with a series); and the
        manifest of each input's stage beside the input (or none, where the
        input was placed by hand)."""
        shutil.rmtree(self.local, ignore_errors=True)
        os.makedirs(self.local)
        remote = self._workspace(self._listing())
        wanted = [rel for rel in remote if workspace or rel in (MANIFEST, RUNNING)]
        if wanted:
            self.fs.get([self._remote(r) for r in wanted], [os.path.join(self.local, r) for r in wanted])
            self._record(wanted)
        manifests = {os.path.join(os.path.dirname(os.path.abspath(p)), MANIFEST) for p in inputs}
        names = [self.url_of(m)[len(storage.GCS_PREFIX):] for m in manifests]
        found = self.fs.cat(names, on_error="omit") if names else {}
        for local in manifests:
            data = found.get(self.url_of(local)[len(storage.GCS_PREFIX):])
            if data is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(local)  # an old copy must not outlive the bucket's
            else:
                with open(local, "wb") as f:
                    f.write(data)

    def push(self, outputs: list[str], final: bool = False) -> None:
        """Make the bucket's workspace what the local one is. The declared
        outputs go up only at the end (``final``); ``_manifest.json`` after
        everything else."""
        held = set() if final else {os.path.relpath(os.path.abspath(o), self.local) for o in outputs}
        local = {rel: st for rel, st in self._local_files().items() if rel not in held}
        remote = self._workspace(self._listing())
        self._upload([rel for rel, st in local.items()
                      if rel != MANIFEST and (rel not in remote or self._synced.get(rel) != st)])
        stale = [rel for rel in remote if rel not in local and rel not in held]
        if stale:
            self.fs.rm([self._remote(r) for r in stale])
        if MANIFEST in local:
            self._upload([MANIFEST])

    def archive(self, keep: tuple[str, ...] = ()) -> str | None:
        """Move the workspace (but the entries in ``keep``) into
        ``.attempts/<n>/``: server-side for what the bucket has, uploaded
        straight there for what is only local. Returns ``.attempts/<n>``."""
        listing = self._listing()
        remote = [rel for rel in self._workspace(listing) if rel.split("/")[0] not in keep]
        local = {rel: st for rel, st in self._local_files().items() if rel.split("/")[0] not in keep}
        if not remote and not local:
            return None
        numbers = [int(rel.split("/")[1]) for rel in listing
                   if rel.startswith(ATTEMPTS + "/") and rel.split("/")[1].isdigit()]
        target = f"{ATTEMPTS}/{1 + max(numbers, default=0)}"
        fresh = [rel for rel, st in local.items() if rel not in remote or self._synced.get(rel) != st]
        moved = [rel for rel in remote if rel not in fresh]
        if moved:
            self.fs.copy([self._remote(r) for r in moved], [self._remote(f"{target}/{r}") for r in moved])
        if fresh:
            self.fs.put([os.path.join(self.local, r) for r in fresh], [self._remote(f"{target}/{r}") for r in fresh])
        if remote:
            self.fs.rm([self._remote(r) for r in remote])
        for entry in {rel.split("/")[0] for rel in local}:
            path = os.path.join(self.local, entry)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        self._synced = {rel: st for rel, st in self._synced.items() if rel.split("/")[0] in keep}
        return target

    def put_marker(self, name: str, mtime: float) -> None:
        """Upload a marker file dated ``mtime`` for Snakemake (see the storage plugin)."""
        from snakemake_storage_plugin_waypost import MTIME_KEY
        with open(os.path.join(self.local, name), "rb") as f:
            self.fs.pipe_file(self._remote(name), f.read(), metadata={MTIME_KEY: repr(mtime)})

    def close(self, outputs: list[str]) -> None:
        """After the manifest: no attempt is in progress any more, and the local
        copy keeps only the outputs (Snakemake stores them, finding them there)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._remote(RUNNING))
        keep = {os.path.abspath(o) for o in outputs}
        for rel in self._local_files():
            if os.path.join(self.local, rel) not in keep:
                os.unlink(os.path.join(self.local, rel))


def for_runner(stage_dir: str, local_dir: str | None) -> RemoteStage | None:
    if not storage.is_remote(stage_dir):
        return None
    if not local_dir:
        raise SystemExit("waypost.runner: a gs:// --stage-dir needs --local-dir (the local copy to work in)")
    return RemoteStage(stage_dir, local_dir)


def check_bucket(root: str) -> None:
    """One clear line when the root's bucket is missing or can't be read."""
    fs, path = storage.filesystem(root)
    bucket = path.split("/")[0]
    try:
        fs.info(bucket)
    except FileNotFoundError:
        raise storage.StorageError(f"{root}: bucket {bucket!r} does not exist (waypost never creates "
                                   "buckets; check the name and the project)") from None
    except Exception as exc:  # noqa: BLE001 - whatever gcsfs raised, as one line
        raise storage.explain(exc, root) from None


def planning_mirror(root: str, workflow) -> str:
    """For a Snakemake run over a gs:// root: check that Snakemake stores
    stage files there through waypost's plugin, and that the bucket is
    there; returns the local copy of the bucket (a path)."""
    from snakemake.exceptions import WorkflowError

    settings = workflow.storage_settings
    prefix = (getattr(settings, "default_storage_prefix", None) or "").rstrip("/")
    if getattr(settings, "default_storage_provider", None) != PROVIDER or prefix != root.rstrip("/"):
        raise WorkflowError(f"root {root} is a bucket: run Snakemake with --default-storage-provider {PROVIDER} "
                            f"--default-storage-prefix {root} (or those two keys in the profile; "
                            "see 'Running with a bucket' in README.md)")
    try:
        check_bucket(root)
    except storage.StorageError as exc:
        raise WorkflowError(str(exc)) from None
    storage.register_root(root)
    return str(workflow.storage_registry.default_storage_provider.local_prefix)


@contextlib.contextmanager
def snapshot(root: str):
    """A local stand-in for the stage directories under a gs:// root, from one
    listing: manifests and in-progress markers with their contents (fetched
    together), every other object an empty file (status only asks whether
    they exist); archives left out. Yields its path."""
    check_bucket(root)
    fs, path = storage.filesystem(root)
    try:
        names = fs.find(path)
    except FileNotFoundError:
        names = []
    with tempfile.TemporaryDirectory(prefix="waypost-status-") as tmp:
        engine = []
        for name in names:
            rel = name[len(path) + 1:]
            if f"/{ATTEMPTS}/" in f"/{rel}":
                continue
            local = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            if os.path.basename(rel) in (MANIFEST, RUNNING):
                engine.append(name)
            else:
                open(local, "wb").close()
        for name, data in (fs.cat(engine) if engine else {}).items():
            with open(os.path.join(tmp, name[len(path) + 1:]), "wb") as f:
                f.write(data)
        yield tmp


def relocate(value, old: str, new: str):
    """``value`` with every string under the path ``old`` moved under ``new``."""
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {k: relocate(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [relocate(v, old, new) for v in value]
    return value
