"""A job of a rule in its own layout on a ``gs://`` root: its record in one
directory of the bucket, its outputs where its rule puts them, elsewhere in
the bucket (Snakemake's default storage under the root).

The step works on local copies, as a stage's does (``stores.mirror``): the
record's is the stage directory's; the outputs' are at their own places in
the same local copy of the bucket. On top of what a stage's workspace does:

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
from waypost.stores.bucket import move_into_archive
from waypost.stores.mirror import BucketWorkspace, download


class OwnBucketWorkspace(BucketWorkspace):
    """The record's local copy and bucket directory (``BucketWorkspace``),
    and the job's outputs (local copies, ``outputs``) with their directories
    only it writes (``own_dirs``, local copies too)."""

    def __init__(self, url: str, local: str, outputs: list[str], own_dirs: list[str], input_dirs: list[str]):
        super().__init__(url, local)
        self.outputs = [os.path.abspath(o) for o in outputs]
        self.own_dirs = [os.path.abspath(d) for d in own_dirs]
        self.input_dirs = [os.path.abspath(d) for d in input_dirs]
        self._sent: dict[str, tuple[int, int]] = {}   # local file → (size, mtime_ns) as the bucket has it
        # What the step left in directories other jobs write too (not the
        # job's: not recorded), which goes up with the outputs all the same.
        self.left_beside: list[str] = []
        self.logs: list[str] = []   # its log files (Snakemake's ``log:``): up with the workspace, however it ends
        # The side files the job's attempts wrote (local copies; the runner's
        # ``StageDirectory.written``): only these are archived or removed with
        # its outputs, never what else is in its directories.
        self.mine: set[str] = set()

    # --- what is where ------------------------------------------------------------
    def side_files(self) -> list[str]:
        """Local files in the own directories (not below) that are not declared outputs."""
        return manifest.files_beside(self.own_dirs, set(self.outputs))

    def _remote_side(self, directories: list[str] | None = None) -> dict[str, str]:
        """The bucket's objects in the own directories (or ``directories``;
        not below) that are not declared outputs: local copy → object name."""
        declared, found = set(self.outputs), {}
        for directory in self.own_dirs if directories is None else directories:
            try:
                listed = self.fs.ls(self._name(directory), detail=True, refresh=True)
            except FileNotFoundError:
                continue
            for info in listed:
                if info.get("type") != "file":
                    continue
                local = self.local_of("gs://" + info["name"])
                if local not in declared and not is_in_progress(os.path.basename(local)):
                    found[local] = info["name"]
        return found

    def _own_side(self) -> dict[str, str]:
        """The bucket's side files that are the job's (``mine``): local copy → object name."""
        return {local: name for local, name in self._remote_side().items() if local in self.mine}

    def _remote_outputs(self) -> dict[str, str]:
        """The declared outputs the bucket has (a ``directory()``'s every
        object): local copy → object name."""
        found = {}
        for out in self.outputs:
            name = self._name(out)
            try:
                objects = self.fs.find(name, withdirs=False)
            except FileNotFoundError:
                continue
            for obj in objects:
                found[self.local_of("gs://" + obj)] = obj
        return found

    @staticmethod
    def _files(paths: list[str]) -> list[str]:
        """Local files: each path that is there, or every file below a directory."""
        return [f for f in manifest.files_of(paths) if os.path.lexists(f)]

    # --- the runner's ----------------------------------------------------------------
    def pull(self, inputs: list[str]) -> None:
        """The record's engine files and the inputs (``BucketWorkspace.pull``),
        with what is beside the inputs in the directories the jobs that made
        them write alone (``input_dirs``: their side files)."""
        super().pull(inputs)
        for path in [*self.outputs, *self.side_files()]:
            _remove(path)
        fetched = {os.path.abspath(i) for i in inputs}
        beside = {local: name for local, name in self._remote_side(self.input_dirs).items() if local not in fetched}
        download(self.fs, list(beside.values()), list(beside))

    def pull_workspace(self) -> None:
        super().pull_workspace()
        wanted = {**self._remote_outputs(), **self._remote_side()}
        download(self.fs, list(wanted.values()), list(wanted))
        self._note_sent(wanted)

    def push(self, outputs: list[str], final: bool = False) -> None:
        """The side files (changed since they last went up), with the
        declared outputs at the end (``final``), then the record's workspace
        and its manifest last (``BucketWorkspace.push``)."""
        files = self.side_files() + [f for f in self.logs if os.path.exists(f)] \
            + (self._files(self.outputs) + self.left_beside if final else [])
        changed = [f for f in files if self._sent.get(f) != _stat(f)]
        if changed:
            self.fs.put(changed, [self._name(f) for f in changed])
            self._note_sent(changed)
        super().push(outputs, final)

    def archive_outputs(self, base: str) -> str | None:
        """Move the job's outputs and side files (what the bucket has, and
        what is only here) into the record's ``.attempts/<n>/``, each at its
        path from ``base`` (the local copy of the outputs' directory); the
        local copies go. The archive, or None when there was nothing."""
        remote = {**self._remote_outputs(), **self._own_side()}
        side = [f for f in self.side_files() if f in self.mine]
        local = self._files([*self.outputs, *side])
        rel = {path: os.path.relpath(path, base) for path in [*remote, *local]}
        uploads = {rel[f]: f for f in local if f not in remote or self._sent.get(f) != _stat(f)}
        into = move_into_archive(self.fs, self.path, self._listing(), self._name(base),
                                 [rel[f] for f in remote], uploads)
        for path in [*self.outputs, *side]:
            _remove(path)
        self._sent.clear()
        return into

    def remove_outputs(self) -> None:
        """The job's outputs and side files gone, here and in the bucket (a clean rerun)."""
        remote = {**self._remote_outputs(), **self._own_side()}
        if remote:
            self.fs.rm(list(remote.values()))
        self._sent.clear()

    def outputs_there(self) -> bool:
        """Does the bucket have every declared output?"""
        return all(self.fs.exists(self._name(o)) for o in self.outputs)

    def _note_sent(self, paths) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                self._sent[path] = _stat(path)


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
