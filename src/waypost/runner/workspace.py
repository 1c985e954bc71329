"""What a job's attempts work in and leave behind, for its runner: the one
place the runner meets the difference of layout (``Job.outputs_in_record``),
chosen once per stage directory (``for_job``).

- ``RecordWorkspace``: a ``wp.out`` stage. Its record directory is its
  workspace: the step may run there (``workdir: stage``), with waypost's
  Python first on its PATH; everything in it but the engine's files is the
  attempts' (archived whole, manifest and logs too, as a series starts
  anew; cleaned for a ``clean`` rerun); its outputs are checked there.
- ``OutputsInPlace``: a rule in its own layout. Its outputs stay where its
  rule puts them and its step runs where Snakemake runs its jobs, with the
  PATH plain Snakemake gives it. What its attempts own is its declared
  outputs (but ``update()`` ones) and the *side files* it writes beside
  them, in the directories only its job writes: the files that appeared
  there while one of its attempts ran (never what was there before: the
  Snakefile, a config, an input). Those are archived into its record's
  ``.attempts/N/`` (its logs stay in the record), removed for a ``clean``
  rerun, and recorded in its manifest.

The two answer the same questions; the runner asks them without asking
which layout it has.
"""

from __future__ import annotations

import os
import re
import sys

from waypost import stores
from waypost.model import locations, manifest, records
from waypost.model.layout import ATTEMPTS, MANIFEST


def _remove(paths: list[str]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            import shutil  # here: the runner starts at every step, most never need it
            shutil.rmtree(path)
        else:
            os.unlink(path)


class RecordWorkspace:
    """A ``wp.out`` stage's workspace: its record directory (``directory``:
    the runner's ``StageDirectory``)."""

    #: may the step run in the record directory (``workdir: stage``)?
    runs_in_record = True
    #: does the step find waypost's Python first on its PATH?
    python_first = True
    #: does a series that starts with the step's command archive what the
    #: last one left (else it starts where plain Snakemake starts a job:
    #: its declared outputs removed, the rest in place)?
    archived_as_series_starts = True
    #: do its logs stay in the record as its attempts' files are archived?
    logs_stay = False

    def __init__(self, directory):
        self.directory = directory

    def archive(self, keep: tuple[str, ...]) -> str | None:
        """Move the workspace under ``.attempts/<n>/`` (but ``keep``)."""
        d = self.directory
        return d.remote.archive(keep) if d.remote else d.store.archive(d.dir, keep=keep)

    def activity(self) -> list[str]:
        """The files whose last write says when an attempt was last at work
        (beyond its log, heartbeat and outputs): the workspace's, but its archives."""
        paths = []
        for top, dirs, files in os.walk(self.directory.dir):
            dirs[:] = [d for d in dirs if d != ATTEMPTS]
            paths += [os.path.join(top, name) for name in files]
        return paths

    def clean(self) -> None:
        """Remove what the failed attempts of this series left (a series
        starts from an archived, empty workspace: only those)."""
        d = self.directory
        if d.remote:
            d.remote.outside.remove()
        _remove([d.path(entry) for entry in manifest.workspace_entries(d.dir) if not manifest.is_engine_file(entry)])

    def outputs_there(self, data: records.Manifest) -> bool:
        """Are a SUCCESS manifest's outputs there?"""
        return not manifest.verify_outputs(self.directory.dir, data, checksums=False)

    def before_step(self) -> None:
        """Before the step runs (nothing: its workspace is ready)."""

    def before_attempt(self) -> None:
        """Before an attempt's workspace is set (nothing: the step makes its outputs' directories)."""

    def set_aside_record_without_attempts(self, previous: records.Manifest) -> None:
        """A new series over a manifest with no attempts (nothing: the
        workspace's archive takes the manifest too)."""

    # --- side files: a stage has none --------------------------------------
    def attempt_begins(self) -> None:
        pass

    def attempt_ended(self, record: records.Attempt) -> None:
        pass

    def vanished_attempt(self, marker: dict, record: records.Attempt) -> None:
        pass

    def learn_side_files(self, attempts: list[records.Attempt], previous: records.Manifest | None) -> None:
        pass

    def side_files(self) -> list[str]:
        return []

    def marker_fields(self) -> dict:
        """What the running marker says beyond the outputs (nothing)."""
        return {}

    def left_in_shared(self) -> list[str]:
        return []


class OutputsInPlace(RecordWorkspace):
    """A rule in its own layout's: its outputs where its rule puts them, and
    the side files its attempts write beside them."""

    runs_in_record = False
    python_first = False
    archived_as_series_starts = False
    logs_stay = True

    def __init__(self, directory, own_dirs: list[str], shared_dirs: dict):
        super().__init__(directory)
        self.own_dirs, self.shared_dirs = own_dirs, shared_dirs
        # its side files: what appeared beside its outputs while one of its
        # attempts ran; and what was there as the attempt under way began
        self.written: set[str] = set()
        self._before: set[str] | None = None
        self._not_side = {os.path.abspath(p) for p in [*directory.outputs, *directory.inputs]}
        if directory.remote:
            directory.remote.outside.mine = self.written

    # --- the attempts' files --------------------------------------------------
    def archive(self, keep: tuple[str, ...]) -> str | None:
        """Move the outputs an earlier attempt left (its declared ones, and
        its side files) into the record's ``.attempts/<n>/``, each at its
        path from ``base``."""
        d = self.directory
        if d.remote:
            return d.remote.outside.archive(d.base)
        return stores.LocalStore(d.dir).archive_from(d.dir, d.base, [
            os.path.relpath(os.path.abspath(path), d.base) for path in self._left()])

    def activity(self) -> list[str]:
        """The files now beside its outputs."""
        return sorted(self._beside())

    def clean(self) -> None:
        """Remove what the failed attempts of this series left: its declared
        outputs (but ``update()`` ones) and side files."""
        d = self.directory
        if d.remote:
            d.remote.outside.remove()
        _remove(self._left())

    def _left(self) -> list[str]:
        return [o for o in self.directory.replaced_outputs() if os.path.lexists(o)] + self.side_files()

    def outputs_there(self, data: records.Manifest) -> bool:
        d = self.directory
        if d.remote:   # (its outputs' local copies are not fetched)
            return d.remote.outside.there()
        return super().outputs_there(data)

    def before_step(self) -> None:
        """What the job's own Snakemake process does before it runs a job
        (its ``Job.prepare``): the declared outputs an earlier run left
        removed, their directories and its logs' made. Where that process
        runs the job (locally, or on a node for a job that needs it) this
        finds it done; a step the executor runs straight has only this."""
        d = self.directory
        _remove([out for out in d.replaced_outputs() if os.path.lexists(out)])
        for directory in sorted({os.path.dirname(o) for o in d.outputs} | set(d.log_dirs)):
            if directory:
                os.makedirs(directory, exist_ok=True)

    def before_attempt(self) -> None:
        """Its outputs' directories made, as Snakemake makes them before a job runs."""
        for path in self.directory.outputs:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def set_aside_record_without_attempts(self, previous: records.Manifest) -> None:
        """A new series over a manifest with no attempt for it to carry on
        (an adopted job's: its outputs made by hand) sets that manifest
        aside in the record's ``.attempts/N/`` first, and says so, so a
        record is never replaced unkept (the new manifest's attempts are the
        history of the others)."""
        d = self.directory
        tree = stores.store_for(d.stage_dir, quiet=True)
        archived = tree.archive_from(d.stage_dir, d.stage_dir, [MANIFEST])
        what = "adopted by hand" if previous.get("adopted") else "a record with no attempt"
        print(f"waypost: {d.name}: {what}; redone now: its record set aside in {archived}", file=sys.stderr)

    # --- side files ---------------------------------------------------------
    def _beside(self) -> set[str]:
        """The files now in the directories only this job writes (not below),
        but its declared outputs and its inputs."""
        return set(manifest.files_beside(self.own_dirs, self._not_side))

    def attempt_begins(self) -> None:
        """Note what is beside its outputs as an attempt begins (kept in the
        running marker too, for a runner that vanishes): none of it is the attempt's."""
        self._before = self._beside()

    def attempt_ended(self, record: records.Attempt) -> None:
        """What appeared beside the outputs while the attempt ran is the
        job's: recorded in the attempt (``wrote``)."""
        if self._before is None:
            return
        wrote = self._beside() - self._before
        self._before = None
        if wrote:
            record["wrote"] = self.directory.relative(wrote)
            self.written |= wrote

    def vanished_attempt(self, marker: dict, record: records.Attempt) -> None:
        """An attempt whose runner vanished: what appeared since its
        marker's listing (``before``) is its."""
        before = marker.get("before")
        if before is None or self.directory.remote:
            return
        self._before = {os.path.join(self.directory.base, p) for p in before}
        self.attempt_ended(record)

    def learn_side_files(self, attempts: list[records.Attempt], previous: records.Manifest | None) -> None:
        """The side files earlier attempts wrote (their ``wrote``) and the
        last manifest records (``side``): this job's, wherever they are now."""
        base = self.directory.base
        for attempt in attempts:
            self.written |= {os.path.join(base, p) for p in attempt.get("wrote") or ()}
        for out in (previous or {}).get("outputs") or ():
            if out.get("side"):
                self.written.add(os.path.abspath(os.path.join(base, out["path"])))

    def side_files(self) -> list[str]:
        """The files its attempts wrote beside its outputs, in the
        directories only its job writes, that are there now."""
        return sorted(p for p in self.written if p not in self._not_side and os.path.lexists(p)
                      and not os.path.isdir(p))

    def marker_fields(self) -> dict:
        """Its outputs' place, and what was beside them as the attempt under way began."""
        d = self.directory
        fields = d.job.marker_fields()
        if self._before is not None:
            fields["before"] = d.relative(self._before)
        return fields

    def left_in_shared(self) -> list[str]:
        """The files that appeared, since this runner began, in its outputs'
        directories that other jobs write too (``shared_dirs``) and that no
        rule declares there (its patterns): not the job's own, only said
        (``StageRun.finish``). On a gs:// root they still go up with the
        outputs: they stay where the job left them, as on disk."""
        d = self.directory
        found, local = [], []
        inputs = {os.path.abspath(i) for i in d.inputs}   # (on a gs:// root, fetched there)
        for directory, (named, patterns) in self.shared_dirs.items():
            declared = [re.compile(pattern) for pattern in patterns]
            for path in manifest.files_beside([directory], {os.path.abspath(o) for o in d.outputs}):
                if path in inputs:
                    continue
                shown = locations.join(named, os.path.basename(path))
                try:
                    fresh = os.lstat(path).st_mtime >= d.began
                except OSError:
                    continue
                if fresh and not any(rx.match(locations.normalised(shown)) for rx in declared):
                    found.append(shown)
                    local.append(path)
        if d.remote:
            d.remote.outside.left_beside = local
        return found


def for_job(directory, own_dirs: list[str], shared_dirs: dict) -> RecordWorkspace:
    """The workspace of the job a ``StageDirectory`` holds: the layout's one choice."""
    if directory.job.outputs_in_record:
        return RecordWorkspace(directory)
    return OutputsInPlace(directory, own_dirs, shared_dirs)
