"""The outputs of a job whose outputs are not in its record directory (a
rule in its own layout) on a bucket root (``gs://``): where its rule puts them,
elsewhere in the bucket (Snakemake's default storage under the root), with
the side files its attempts leave beside them.

One part of the job's one workspace (``mirror.BucketWorkspace``), which
keeps the record's local copy; this keeps the outputs' local copies at their
own places in the same local copy of the bucket:

- a fresh runner drops the local copies of the job's outputs and of what is
  beside them in the directories only it writes (``own_dirs``): the bucket's
  are the job's, not what an earlier run left on this machine; a series that
  goes on fetches them (checkpoints and all);
- while the step runs, what it writes beside its outputs there goes up with
  the workspace; the declared outputs only at the end, where they count,
  and before the manifest;
- an archive moves the job's outputs and side files into the record's
  ``.attempts/<n>/``, each at its path from the outputs' directory, as on
  disk (server-side for what the bucket has).
"""

from __future__ import annotations

import contextlib
import os
import shutil

from waypost.model import manifest
from waypost.model.layout import is_in_progress
from waypost.stores.bucketmoves import move_into_archive


class OutputsInBucket:
    """The job's declared outputs (local copies, ``outputs``) and the
    directories only it writes (``own_dirs``, local copies too), kept in
    step with the bucket through ``workspace`` (its ``fs``, object names,
    the record's listing)."""

    def __init__(self, workspace, outputs: list[str], own_dirs: list[str]):
        self.workspace = workspace
        self.outputs = [os.path.abspath(o) for o in outputs]
        self.own_dirs = [os.path.abspath(d) for d in own_dirs]
        self._sent: dict[str, tuple[int, int]] = {}   # local file → (size, mtime_ns) as the bucket has it
        self.logs: list[str] = []   # its log files (``log:``): up with the workspace, however it ends
        # What the step left in directories other jobs write too (not the
        # job's: not recorded), which goes up with the outputs all the same.
        self.left_beside: list[str] = []
        # The side files the job's attempts wrote (local copies; the runner's
        # ``runner.workspace.OutputsInPlace.written``): only these are archived or removed with
        # its outputs, never what else is in its directories.
        self.mine: set[str] = set()

    # --- what is where ------------------------------------------------------------
    def side_files(self) -> list[str]:
        """Local files in the own directories (not below) that are not declared outputs."""
        return manifest.files_beside(self.own_dirs, set(self.outputs))

    def _own_side(self) -> dict[str, str]:
        """The bucket's side files that are the job's (``mine``): local copy → object name."""
        return {local: name for local, name in objects_beside(self.workspace, self.own_dirs, self.outputs).items()
                if local in self.mine}

    def _remote_outputs(self) -> dict[str, str]:
        """The declared outputs the bucket has (a ``directory()``'s every
        object): local copy → object name."""
        fs, found = self.workspace.fs, {}
        for out in self.outputs:
            try:
                objects = fs.find(self.workspace.object_name(out), withdirs=False)
            except FileNotFoundError:
                continue
            for obj in objects:
                found[self.workspace.local_of_object(obj)] = obj
        return found

    @staticmethod
    def _files(paths: list[str]) -> list[str]:
        """Local files: each path that is there, or every file below a directory."""
        return [f for f in manifest.files_of(paths) if os.path.lexists(f)]

    # --- the workspace's ----------------------------------------------------------------
    def drop_local(self) -> None:
        """No local copy of the outputs or of what is beside them (a fresh runner's)."""
        for path in [*self.outputs, *self.side_files()]:
            _remove(path)

    def to_fetch(self) -> dict[str, str]:
        """The bucket's outputs and side files, to go on with a series
        (local copy → object name; ``note_sent`` once fetched)."""
        return {**self._remote_outputs(), **objects_beside(self.workspace, self.own_dirs, self.outputs)}

    def push(self, final: bool) -> None:
        """The side files and logs (changed since they last went up), with
        the declared outputs and what it left beside them at the end (``final``)."""
        files = self.side_files() + [f for f in self.logs if os.path.exists(f)] \
            + (self._files(self.outputs) + self.left_beside if final else [])
        changed = [f for f in files if self._sent.get(f) != _stat(f)]
        if changed:
            self.workspace.fs.put(changed, [self.workspace.object_name(f) for f in changed])
            self.note_sent(changed)

    def archive(self, base: str) -> str | None:
        """Move the job's outputs and side files (what the bucket has, and
        what is only here) into the record's ``.attempts/<n>/``, each at its
        path from ``base`` (the local copy of the outputs' directory); the
        local copies go. The archive, or None when there was nothing."""
        work = self.workspace
        remote = {**self._remote_outputs(), **self._own_side()}
        side = [f for f in self.side_files() if f in self.mine]
        local = self._files([*self.outputs, *side])
        rel = {path: os.path.relpath(path, base) for path in [*remote, *local]}
        uploads = {rel[f]: f for f in local if f not in remote or self._sent.get(f) != _stat(f)}
        into = move_into_archive(work.fs, work.path, work.listing(), work.object_name(base),
                                 [rel[f] for f in remote], uploads)
        for path in [*self.outputs, *side]:
            _remove(path)
        self._sent.clear()
        return into

    def remove(self) -> None:
        """The job's outputs and side files gone, here and in the bucket (a clean rerun)."""
        remote = {**self._remote_outputs(), **self._own_side()}
        if remote:
            self.workspace.fs.rm(list(remote.values()))
        self._sent.clear()

    def there(self) -> bool:
        """Does the bucket have every declared output?"""
        return all(self.workspace.fs.exists(self.workspace.object_name(o)) for o in self.outputs)

    def note_sent(self, paths) -> None:
        """Local copies that are as the bucket has them now."""
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                self._sent[path] = _stat(path)


def objects_beside(workspace, directories: list[str], declared: list[str]) -> dict[str, str]:
    """The bucket's objects (through ``workspace``) in ``directories``
    (local copies; not below) that are not ``declared`` (local copies) nor
    being written: local copy → object name."""
    declared_set, found = set(declared), {}
    for directory in directories:
        try:
            listed = workspace.fs.ls(workspace.object_name(directory), detail=True, refresh=True)
        except FileNotFoundError:
            continue
        for info in listed:
            if info.get("type") != "file":
                continue
            local = workspace.local_of_object(info["name"])
            if local not in declared_set and not is_in_progress(os.path.basename(local)):
                found[local] = info["name"]
    return found


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
