"""The interface every root's store answers (``StageStore``).

A store is chosen from the root by ``stores.store_for``; the commands that
look at or steer the file state (status, rerun, adopt, plan, verify, cron,
prune), the catalog and the runner are written once against it. Paths in and
out are the user's: local paths as given (``results/...``), or bucket URLs
(``gs://...``) under the root.

A backend says what it can do with flags, never by its scheme:
``snapshot``, ``listed_crc32c``, ``links``, ``server_side_copy`` (a copy
between two of its locations moves no bytes through this machine). None
relies on hard links, symbolic links, xattrs or atomic directory renames.
"""

from __future__ import annotations

import abc

from waypost.model import layout, manifest
from waypost.model.errors import WaypostError
from waypost.model.job import Job
from waypost.model.layout import LOGS, MANIFEST
from waypost.model.records import Manifest

#: The object metadata waypost dates an object by (a marker's lease, a
#: Snakemake marker): an object's own time is when it was uploaded.
MTIME_KEY = "waypost-mtime"


class StorageError(WaypostError, RuntimeError):
    """A root that cannot be reached or is not served: one clear line for the user."""


def mtime_of(info: dict) -> float:
    """An object's mtime, from its listing info (as a bucket client lists
    it, ``bucketclient.BucketClient``): its ``waypost-mtime`` metadata, else
    when it was written."""
    stamp = (info.get("metadata") or {}).get(MTIME_KEY)
    return float(stamp) if stamp else info["mtime"].timestamp()


def archive_number(names, unfinished) -> int:
    """Which ``.attempts/<n>`` an archive goes into, from the names in
    ``.attempts``: the one an archive cut short left (``unfinished``, its
    ``layout.ARCHIVING`` note still there) to go on with, else the next."""
    numbers = [int(n) for n in names if n.isascii() and n.isdigit()]
    cut = [int(n) for n in unfinished if n.isascii() and n.isdigit()]
    return max(cut) if cut else 1 + max(numbers, default=0)


def walked(name: str) -> bool:
    """Directories a search for manifests goes into (not archives, not logs)."""
    return not name.startswith((".", LOGS))


class StageStore(abc.ABC):
    """The stage directories under one root, and what waypost does to them.

    The abstract methods are what a backend implements (a fourth backend is
    one subclass plus one subclass of ``tests/store_contract.py``); the rest
    is written once here over them."""

    root: str
    # What the backend can do (callers ask these, never the root's scheme).
    snapshot = False          # answers from one listing made when it was opened
    listed_crc32c = False     # each file's crc32c comes with the listing (verify reads nothing)
    links = True              # may hold symbolic links (never followed out of a stage dir)
    server_side_copy = False  # a copy within the service moves no bytes through this machine
    appends = True            # a file can be appended to in place (not an object written whole)
    # The bucket URL a copy from this store can start from server-side (None: none).
    bucket_url: str | None = None

    # --- naming ----------------------------------------------------------
    @abc.abstractmethod
    def key(self, path: str) -> str:
        """One spelling per directory (to compare paths)."""

    @abc.abstractmethod
    def relative(self, path: str) -> str:
        """``path`` relative to the root."""

    # --- listing -----------------------------------------------------------
    @abc.abstractmethod
    def entries(self, directory: str) -> list[str]:
        """Names in a directory but the archive, sorted."""

    @abc.abstractmethod
    def isdir(self, path: str) -> bool: ...

    @abc.abstractmethod
    def isfile(self, path: str) -> bool: ...

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def size(self, path: str) -> int | None:
        """A file's size; None when it isn't there."""

    @abc.abstractmethod
    def files(self, directory: str) -> list[str]:
        """Every file below a directory (archives too), relative to it, sorted."""

    @abc.abstractmethod
    def file_sizes(self, directory: str) -> dict[str, int]:
        """Every file below a directory (a link counts as itself), relative to it, with its size."""

    @abc.abstractmethod
    def marker_dirs(self, leaf: str = MANIFEST) -> list[str]:
        """Every directory holding an engine file ``leaf`` (not archives), sorted."""

    def manifest_dirs(self) -> list[str]:
        """Every directory with a manifest (stages and instances; not archives)."""
        return self.marker_dirs(MANIFEST)

    # --- the catalog's view: every manifest, archived ones too ---------------
    # many manifests are read fastest by worker processes (each reads on its
    # own); such a store also has manifest_groups() and listed_in(group)
    parallel_reads = False

    @abc.abstractmethod
    def listed_manifests(self, refused: dict | None = None) -> dict[str, str]:
        """{directory: stamp} of every manifest below the root, the current
        ones (``pair/experiment/stage[/instance]``) and the archived ones
        (``.attempts/<n>``), from a fresh listing; a stamp changes whenever
        its manifest does. One that must not be read (too big, a name no path can
        stand for) goes into ``refused`` instead: {directory: (stamp, why)}."""

    @abc.abstractmethod
    def read_manifests(self, directories: list[str], stamps: dict | None = None):
        """(directory, stamp, bytes or the exception) for each directory's
        manifest, read as they come or in batches (``stamps``: the listing's)."""

    @abc.abstractmethod
    def archives(self, directory: str) -> list[str]:
        """The numbers of a stage dir's archived attempts (``.attempts/<n>``), ascending."""

    @abc.abstractmethod
    def usage(self, path: str) -> tuple[int, int, float | None]:
        """(bytes, files, newest file time) below a directory."""

    @abc.abstractmethod
    def escapes(self, stage_dir: str, rel: str) -> str | None:
        """Where a stage dir's file (``rel``) really is, when a symbolic link
        takes it out of the stage dir; None when it is inside."""

    # --- engine records ------------------------------------------------------
    @abc.abstractmethod
    def manifest(self, directory: str) -> Manifest | None:
        """A directory's manifest; None if none; ManifestError if unusable."""

    @abc.abstractmethod
    def mtime(self, path: str) -> float:
        """A file's modification time, as every node sees it (a bucket's
        ``waypost-mtime``); OSError when it isn't there."""

    @abc.abstractmethod
    def marker(self, directory: str) -> tuple[bytes, float] | None:
        """A stage dir's ``_running.json`` and the age of its heartbeat (for
        ``waypost.state.lifecycle``, the one reader of what it means); None without one."""

    @abc.abstractmethod
    def write_manifest(self, directory: str, record: dict) -> None:
        """Write a manifest whole: a reader sees the old one or the new one."""

    @abc.abstractmethod
    def write_marker(self, path: str, text: str) -> None:
        """A small engine file, written whole and dated now."""

    @abc.abstractmethod
    def heartbeat(self, path: str) -> None:
        """Date an engine file now, so that every node sees it fresh (the lease)."""

    # --- changing ------------------------------------------------------------
    @abc.abstractmethod
    def remove(self, path: str) -> None: ...

    @abc.abstractmethod
    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything below it (links as links)."""

    @abc.abstractmethod
    def remove_files(self, directory: str, names: list[str]) -> None:
        """Remove some files below a directory (relative names)."""

    @abc.abstractmethod
    def archive(self, directory: str, keep: tuple[str, ...] = ()) -> str | None:
        """Move what is in a stage directory (but ``keep``) into
        ``.attempts/<n>/``; returns ``.attempts/<n>``, or None when there was
        nothing. Never deletes; an archive cut short is finished by the next."""

    def archive_job(self, directory: str, data: Manifest | None) -> str | None:
        """``archive`` a stage directory, whose manifest is ``data`` (None:
        none readable); a rule in its own layout's record (``outputs_dir``)
        with its outputs too, where its rule put them, into the same archive
        (``archive_from``)."""
        job = Job.of_record(directory, data)
        archived = self.archive(directory)
        elsewhere = [job.relative(out) for out in job.outputs_outside_record]
        if archived and elsewhere:
            self.archive_from(directory, job.base, elsewhere, into=archived)
        return archived

    def set_aside_outputs(self, directory: str, record: dict | None) -> str | None:
        """An interrupted attempt's outputs (those its record, the running
        marker, lists and that are there) moved into the record directory's
        ``.attempts/<n>/``, wherever its job keeps them; its record and logs
        stay. Returns the archive, or None when none was there."""
        job = Job.of_record(directory, record)
        present = {job.relative(out).split("/")[0] for out in job.outputs_inside_record if self.exists(out)}
        archived = None
        if present:
            archived = self.archive(directory, keep=tuple(e for e in self.entries(directory) if e not in present))
        elsewhere = [job.relative(out) for out in job.outputs_outside_record]
        if elsewhere:
            archived = self.archive_from(directory, job.base, elsewhere, into=archived)
        return archived

    @abc.abstractmethod
    def archive_from(self, directory: str, base: str, paths: list[str], into: str | None = None) -> str | None:
        """The record ``directory`` of a job of a rule in its own layout:
        move its files at ``paths`` (relative to ``base``, where its outputs
        are; those not there skipped) into its ``.attempts/<n>/``, each at
        its path from ``base`` (``into``: an archive ``archive`` just made,
        relative to ``directory``, to add them to). Returns the archive, or
        ``into`` when none of them was there."""

    @abc.abstractmethod
    def bring(self, source: StageStore, source_dir: str, stage_dir: str,
              outputs: list[dict]) -> tuple[str, dict[str, str]]:
        """Copy a stage's outputs (its manifest's ``outputs``) from ``source``
        into ``stage_dir``, each checked against the manifest (size; sha256,
        or the listed crc32c) and put in place only once checked; the source
        is never changed. Returns how ("copied", "copied in the bucket", ...)
        and the crc32c of each copy where it was seen; ManifestError when a
        file differs (then nothing was put in place)."""

    # --- checksums -----------------------------------------------------------
    @abc.abstractmethod
    def digests(self, path: str) -> tuple[str, str | None]:
        """(sha256, crc32c) of a file."""

    def crc32c(self, path: str) -> str | None:
        """A file's crc32c as the listing has it (None: not listed)."""
        return None

    def sha256(self, path: str) -> str:
        return self.digests(path)[0]

    def state_dirs(self, stage_dir: str) -> list[tuple[str | None, str]]:
        """The directories that hold a stage's state: ``[(None, stage_dir)]``,
        or ``(instance, dir)`` for each instance of a stage with instances
        (and no files of its own)."""
        entries = self.entries(stage_dir)
        if any(manifest.is_engine_file(e) or self.isfile(layout.join(stage_dir, e)) for e in entries):
            return [(None, stage_dir)]
        instances = [e for e in entries if layout.is_valid_name(e) and self.isdir(layout.join(stage_dir, e))]
        return [(name, layout.join(stage_dir, name)) for name in instances] or [(None, stage_dir)]

    def describe(self, stage_dir: str, files: list[str]) -> list[dict]:
        """Size, sha256 and crc32c of files of a stage dir (relative paths),
        as a manifest's ``outputs`` (see manifest.describe_outputs)."""
        described = []
        for f in files:
            path = layout.join(stage_dir, f)
            sha256, crc32c = self.digests(path)
            described.append({"path": f, "size": self.size(path), "sha256": sha256,
                              **({"crc32c": crc32c} if crc32c else {})})
        return described


class Backend(abc.ABC):
    """What waypost does with one kind of root, found by its URL's scheme
    (``stores.registry``): its stores, the manifest of one stage directory,
    whether it answers, where a step works on it. A kind of root is one
    module with a subclass of this (importing its store and client only
    when asked, so that choosing a backend costs no import) and one line in
    the registry. The defaults here are those of a root whose stage
    directories a step reads and writes itself, as no other node sees them."""

    @abc.abstractmethod
    def store(self, root: str, snapshot: bool = False, quiet: bool = False, reads: bool = True) -> StageStore:
        """The store of ``root`` (see ``stores.store_for``)."""

    @abc.abstractmethod
    def manifest_at(self, location: str) -> Manifest | None:
        """The manifest of one stage directory, read alone (see ``stores.manifest_at``)."""

    def over(self, stage_dir: str) -> StageStore:
        """A store to look at one stage directory (see ``stores.over``)."""
        return self.store(stage_dir)

    def reach(self, root: str) -> None:
        """StorageError (within seconds) when the root can't be reached."""
        return None   # (the default: nothing to do)

    def listed_at_once(self, root: str) -> bool:
        """Is the root read from one listing, rather than directory by
        directory (so, fastest by worker processes)?"""
        return not self.store(root, quiet=True).parallel_reads

    def on_a_bucket_mount(self, stage_dir: str) -> bool:
        """Is ``stage_dir`` a path on a mount that may serve a bucket?"""
        return False

    def consistent(self, stage_dir: str) -> str:
        """Where to read ``stage_dir``'s state to see what other nodes wrote."""
        return stage_dir

    def catch_up(self, stage_dir: str) -> None:
        """Wait until what this node sees of ``stage_dir`` is what the service holds."""
        return None   # (the default: nothing to do)

    def workspace(self, step) -> tuple[object | None, list[str], list[str]]:
        """(the workspace a step runner keeps in step with the stage directory,
        None when the step works in it directly; the step's inputs and
        outputs as it works with them)."""
        return None, step.inputs, step.outputs

    def preload(self) -> None:
        """Import now what a forked step runner on such a root imports as it goes."""
        return None   # (the default: nothing to do)
