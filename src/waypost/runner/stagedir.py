"""A stage directory as the runner keeps it: its ``_running.json`` and the
heartbeat, archived workspaces, the planner's markers, the root's registry of
stages on hold, placeholders. On a gs:// root the step works in a local copy
(``stores.mirror``) and what is written here is pushed to the bucket."""

from __future__ import annotations

import os
import sys
import time

from waypost import scheduler, stores
from waypost.model import locations, manifest, records, writes
from waypost.model import spec as wspec
from waypost.model.job import Job
from waypost.model.layout import ATTEMPTS, LOGS, RUNNING, held_entry, stage_root
from waypost.state import lifecycle


class StageDirectory:
    """One stage's directory (or its local copy), for one runner."""

    def __init__(self, step: wspec.StepSpec):
        self.stage_dir, self.instance = step.stage_dir, step.instance
        self.remote = None
        # The paths the step works with: on a bucket root, the local copies.
        self.inputs, self.outputs = step.inputs, step.outputs
        local = str
        if stores.needs_mirror(step.stage_dir):   # only then: the runner starts at every step
            self.remote, self.inputs, self.outputs = stores.workspace_for(step)
            local = self.remote.local_of
        self.dir = self.remote.local if self.remote else step.stage_dir
        # Where the stage dir is, as a store (disk, or a mount): archives and heartbeats, nothing read.
        self.store = None if self.remote else stores.store_for(stage_root(step.stage_dir, step.instance), quiet=True,
                                                               reads=False)
        # Can a file here be appended to (disk, NFS, the local copy of a gs://
        # root's stage), or only written whole (a bucket mount)?
        self.appends = self.store is None or self.store.appends
        # The job: its record here, its outputs here too (a stage) or where its
        # rule puts them (a rule in its own layout, whose directory holds only
        # its record); the records name them from ``base``.
        self.job = Job.of_step(step, local)
        self.base, self.name = self.job.base, self.job.name
        self.own_dirs = [local(d) for d in step.own_dirs]
        # (each shared directory's local copy → its name, as the patterns of what may be there have it)
        self.shared_dirs = {local(d): (d, patterns) for d, patterns in step.shared_dirs.items()}
        self.log_dirs = [local(d) for d in step.log_dirs]
        self.temporary, self.touched = [local(p) for p in step.temporary], [local(p) for p in step.touched]
        self.updated = {local(p) for p in step.updated}
        self.began = time.time()   # (what appeared in a shared directory since: see left_in_shared)
        # A rule in its own layout: its side files are the files that appeared
        # beside its outputs while one of its attempts ran (``written``), never
        # what was there before (the Snakefile, a config, an input); and what
        # was there as the attempt under way began (``_before``).
        self.written: set[str] = set()
        self._before: set[str] | None = None
        self._not_side = {os.path.abspath(p) for p in [*self.outputs, *self.inputs]}
        if self.remote:
            self.remote.outside.mine = self.written

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def life(self) -> lifecycle.Life:
        """What the last runner left here, as the lifecycle reader reads it
        (a marker is taken whether or not a manifest closed it, since a
        local copy's dates are the copy's)."""
        return lifecycle.read(stores.LocalStore(self.dir), self.dir)

    def save_running(self, series, lost_job: records.JobRef | None = None, push: bool = True,
                     group: records.StepGroup | None = None) -> None:
        """``_running.json``: this runner at work on ``series`` (``group``:
        its step's process group, while a step runs); or, with ``lost_job``,
        the series a scheduler's job that ended left (gone, as its scheduler says).
        ``push``: to the bucket too, on a gs:// root."""
        marker = records.marker(
            pid=None if lost_job else os.getpid(), host=None if lost_job else manifest.hostname(),
            run=series.run_id, series=series.number, series_base=series.base,
            outputs=[self.job.relative(o) for o in self.outputs],
            job=lost_job or scheduler.current_job(), attempts=series.history, step_group=group)
        if self.job.outputs_dir:
            marker["outputs_dir"] = self.job.outputs_dir
            if self._before is not None:
                marker["before"] = self._relative(self._before)
        manifest.write_json_atomic(self.path(RUNNING), records.checked("marker", marker, self.path(RUNNING)),
                                   durable=False)  # a marker of work in progress: the manifest is what must survive a crash
        if self.remote and push:
            self.remote.push(self.outputs)

    def heartbeat(self) -> None:
        """Show that this runner is alive: refresh ``_running.json``'s time."""
        try:
            if self.remote:
                os.utime(self.path(RUNNING))
            else:
                self.store.heartbeat(self.path(RUNNING))
        except OSError:
            return
        if self.remote:
            self.remote.put_marker(RUNNING, time.time())

    def remove_running(self) -> None:
        if os.path.exists(self.path(RUNNING)):
            os.unlink(self.path(RUNNING))

    def archive(self, history: list[records.Attempt], keep: tuple[str, ...] = ()) -> str | None:
        """Move the workspace under ``.attempts/<n>/`` (but ``keep``), and point
        the attempts of ``history`` that worked in it there."""
        if not self.job.outputs_in_record:   # (its logs stay where they are, in the record)
            archived, keep = self._archive_outputs(), (*keep, LOGS)
        else:
            archived = self.remote.archive(keep) if self.remote else self.store.archive(self.dir, keep=keep)
        if archived:
            for old in history:
                if old.get("workspace") == ".":
                    old["workspace"] = archived
                    for name in ("log", "script"):   # both under _logs/
                        if old.get(name) and LOGS not in keep:
                            old[name] = os.path.join(archived, old[name])
            print(f"waypost: {self.name}: earlier workspace archived in {archived}", file=sys.stderr)
        return archived

    def _written_in(self, directories) -> list[str]:
        """The files in ``directories`` (not below) that are not the job's declared outputs."""
        return manifest.files_beside(directories, {os.path.abspath(o) for o in self.outputs})

    def _beside(self) -> set[str]:
        """The files now in the directories only this job writes (not below),
        but its declared outputs and its inputs."""
        return set(manifest.files_beside(self.own_dirs, self._not_side))   # (none for a stage: no own_dirs)

    def _relative(self, paths) -> list[str]:
        return sorted(os.path.relpath(p, self.base) for p in paths)

    def attempt_begins(self) -> None:
        """A rule in its own layout: note what is beside its outputs as an
        attempt begins (kept in the running marker too, for a runner that
        vanishes): none of it is the attempt's."""
        self._before = self._beside()

    def attempt_ended(self, record: records.Attempt) -> None:
        """What appeared beside the outputs while the attempt ran is the
        job's: recorded in the attempt (``wrote``)."""
        if self._before is None:
            return
        wrote = self._beside() - self._before
        self._before = None
        if wrote:
            record["wrote"] = self._relative(wrote)
            self.written |= wrote

    def last_heard(self, attempt: records.Attempt) -> float | None:
        """When an attempt whose runner vanished was last seen at work: the
        latest write of its log, its heartbeat, its outputs and the files of
        its workspace (the stage directory but its archives; a rule in its
        own layout: the files beside its outputs). None where none is there."""
        paths = [self.path(rel) for rel in (attempt.get("log"), RUNNING) if rel] + list(self.outputs)
        paths += self._beside()
        if self.job.outputs_in_record:
            for top, dirs, files in os.walk(self.dir):
                dirs[:] = [d for d in dirs if d != ATTEMPTS]
                paths += [os.path.join(top, name) for name in files]
        times = []
        for path in paths:
            try:
                times.append(os.lstat(path).st_mtime)
            except OSError:
                continue
        return max(times, default=None)

    def vanished_attempt(self, marker: dict, record: records.Attempt) -> None:
        """An attempt whose runner vanished: what appeared since its marker's
        listing (``before``) is its."""
        before = marker.get("before")
        if before is None or self.remote:
            return
        self._before = {os.path.join(self.base, p) for p in before}
        self.attempt_ended(record)

    def learn_side_files(self, attempts: list[records.Attempt], previous: records.Manifest | None) -> None:
        """The side files earlier attempts wrote (their ``wrote``) and the
        last manifest records (``side``): this job's, wherever they are now."""
        for attempt in attempts:   # (a stage's have none of either)
            self.written |= {os.path.join(self.base, p) for p in attempt.get("wrote") or ()}
        for out in (previous or {}).get("outputs") or ():
            if out.get("side"):
                self.written.add(os.path.abspath(os.path.join(self.base, out["path"])))

    def side_files(self) -> list[str]:
        """A rule in its own layout: the files its attempts wrote beside its
        outputs, in the directories only its job writes, that are there now."""
        return sorted(p for p in self.written if p not in self._not_side and os.path.lexists(p)
                      and not os.path.isdir(p))

    def replaced_outputs(self) -> list[str]:
        """The declared outputs a new attempt makes anew: all but its
        ``update()`` ones, which Snakemake leaves where they are for the
        job to update (not removed, moved or cleaned)."""
        return [o for o in self.outputs if o not in self.updated] if self.updated else self.outputs

    def prepare_outputs(self) -> None:
        """A rule in its own layout, before its step runs here: what the
        job's own Snakemake process does before it runs a job (its
        ``Job.prepare``): the declared outputs an earlier run left removed,
        their directories and its logs' made. Where that process runs the
        job (locally, or on a node for a job that needs it) this finds it
        done; a step the executor runs straight has only this."""
        for out in self.replaced_outputs():
            if os.path.isdir(out) and not os.path.islink(out):
                import shutil  # here: the runner starts at every step, and this is rare
                shutil.rmtree(out)
            elif os.path.lexists(out):
                os.unlink(out)
        for directory in sorted({os.path.dirname(o) for o in self.outputs} | set(self.log_dirs)):
            if directory:
                os.makedirs(directory, exist_ok=True)

    def left_in_shared(self) -> list[str]:
        """A rule in its own layout: the files that appeared, since this
        runner began, in its outputs' directories that other jobs write too
        (``shared_dirs``) and that no rule declares there (its patterns):
        not the job's own, only said (``StageRun.finish``). On a gs:// root
        they still go up with the outputs: they stay where the job left
        them, as on disk."""
        import re

        found, local = [], []
        inputs = {os.path.abspath(i) for i in self.inputs}   # (on a gs:// root, fetched there)
        for directory, (named, patterns) in self.shared_dirs.items():
            declared = [re.compile(pattern) for pattern in patterns]
            for path in self._written_in([directory]):
                if path in inputs:
                    continue
                shown = locations.join(named, os.path.basename(path))
                try:
                    fresh = os.lstat(path).st_mtime >= self.began
                except OSError:
                    continue
                if fresh and not any(rx.match(locations.normalised(shown)) for rx in declared):
                    found.append(shown)
                    local.append(path)
        if self.remote:
            self.remote.outside.left_beside = local
        return found

    def _archive_outputs(self) -> str | None:
        """A rule in its own layout: move the outputs an earlier attempt left
        (its declared ones, and its side files) into this record's
        ``.attempts/<n>/``, each at its path from ``base``."""
        if self.remote:
            return self.remote.outside.archive(self.base)
        present = [o for o in self.replaced_outputs() if os.path.lexists(o)] + self.side_files()
        return stores.LocalStore(self.dir).archive_from(self.dir, self.base, [
            os.path.relpath(os.path.abspath(path), self.base) for path in present])

    def clean(self) -> None:
        """Remove what the failed attempts of this series left (only those:
        a series starts from an archived, empty workspace; a rule in its own
        layout: its declared outputs)."""
        entries = manifest.workspace_entries(self.dir) if self.job.outputs_in_record else []
        if self.remote:
            self.remote.outside.remove()
        paths = [] if self.job.outputs_in_record else \
            [o for o in self.replaced_outputs() if os.path.lexists(o)] + self.side_files()
        for entry in entries:
            if manifest.is_engine_file(entry):
                continue
            paths.append(self.path(entry))
        for path in paths:
            if os.path.isdir(path) and not os.path.islink(path):
                import shutil  # here: the runner starts at every step, most never need it
                shutil.rmtree(path)
            else:
                os.unlink(path)

    def done(self) -> bool:
        """Is the stage finished: a SUCCESS manifest whose outputs are there?"""
        data = self.life().manifest
        if data is None or data["state"] != "SUCCESS":
            return False
        if self.remote and not self.job.outputs_in_record:   # (its outputs' local copies are not fetched)
            return self.remote.outside.there()
        return not manifest.verify_outputs(self.dir, data, checksums=False)

    def recorded_job(self, job: records.JobRef) -> str | None:
        """Does a runner's record name this scheduler's job: "open" (its
        attempt has no end yet), "closed", or None."""
        life = self.life()
        attempts = [*((life.marker or {}).get("attempts") or []), *((life.manifest or {}).get("attempts") or [])]
        states = [a.get("state") for a in attempts if isinstance(a, dict) and records.job_of(a) == job]
        if not states:
            return None
        return "closed" if all(states) else "open"

    def register_hold(self, until: float | None) -> None:
        """Keep the root's registry of stages on hold (layout.HELD) true: an
        entry dated ``until`` (0: given up), or none."""
        entry = held_entry(stage_root(self.stage_dir, self.instance), self.stage_dir)
        if self.remote:
            self.remote.registry(entry, until)
        elif until is not None:
            with writes.writing(entry):
                os.makedirs(os.path.dirname(entry), exist_ok=True)
                open(entry, "w").close()
                os.utime(entry, (until, until))
        elif os.path.lexists(entry):
            os.unlink(entry)

    def set_marker(self, name: str, when: float | None, state: str) -> None:
        """Write (dated ``when``, saying ``state``) or remove one of the
        planner's markers.

        ``_unfinished``: the stage ended without success but a funnel went on
        over its placeholders; the next run redoes it from the time the marker
        is dated (its series backoff). ``_provisional``: the stage succeeded
        over parents that did not; the next run looks at them again. Neither
        is an input of a job: the planner forces the job (see
        ``waypost.snakemake``), so no timestamp has to beat another."""
        path = self.path(name)
        if when is None:
            if os.path.lexists(path):
                os.unlink(path)
                if self.remote:
                    self.remote.remove_marker(name)
            return
        with writes.writing(path):
            writes.whole(path, f"{state}\n".encode())
            os.utime(path, (when, when))
        if self.remote:
            self.remote.put_marker(name, when)

    def placeholders(self) -> None:
        """Declared outputs Snakemake needs to see; empty where the step wrote
        none. The manifest (not SUCCESS) and the marker say what they are."""
        for path in self.outputs:
            if not os.path.exists(path):
                with writes.writing(path):
                    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                    open(path, "wb").close()
