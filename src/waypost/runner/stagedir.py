"""A stage directory as the runner keeps it: its ``_running.json`` and the
heartbeat, archived workspaces, the planner's markers, the root's registry of
stages on hold, placeholders. On a gs:// root the step works in a local copy
(``stores.mirror``) and what is written here is pushed to the bucket."""

from __future__ import annotations

import os
import sys
import time

from waypost import scheduler, stores
from waypost.model import manifest, records, writes
from waypost.model import spec as wspec
from waypost.model.job import Job
from waypost.model.layout import LOGS, RUNNING, held_entry, stage_root
from waypost.runner import workspace
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
        self.log_dirs = [local(d) for d in step.log_dirs]
        self.temporary, self.touched = [local(p) for p in step.temporary], [local(p) for p in step.touched]
        self.updated = {local(p) for p in step.updated}
        self.began = time.time()   # (what appeared in a shared directory since: ``workspace.left_in_shared``)
        # What its attempts work in and leave: the record directory (a stage),
        # or its outputs in place and its side files (a rule in its own
        # layout; each shared directory's local copy → its name, as the
        # patterns of what may be there have it).
        self.workspace = workspace.for_job(self, [local(d) for d in step.own_dirs],
                                           {local(d): (d, patterns) for d, patterns in step.shared_dirs.items()})

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
        marker.update(self.workspace.marker_fields())
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
        if self.workspace.logs_stay:
            keep = (*keep, LOGS)
        archived = self.workspace.archive(keep)
        if archived:
            for old in history:
                if old.get("workspace") == ".":
                    old["workspace"] = archived
                    for name in ("log", "script"):   # both under _logs/
                        if old.get(name) and LOGS not in keep:
                            old[name] = os.path.join(archived, old[name])
            print(f"waypost: {self.name}: earlier workspace archived in {archived}", file=sys.stderr)
        return archived

    def relative(self, paths) -> list[str]:
        """Paths as its records name them: from the outputs' base, sorted."""
        return sorted(os.path.relpath(p, self.base) for p in paths)

    def last_heard(self, attempt: records.Attempt) -> float | None:
        """When an attempt whose runner vanished was last seen at work: the
        latest write of its log, its heartbeat, its outputs and the files of
        its workspace (the stage directory but its archives; a rule in its
        own layout: the files beside its outputs). None where none is there."""
        paths = [self.path(rel) for rel in (attempt.get("log"), RUNNING) if rel] + list(self.outputs)
        paths += self.workspace.activity()
        times = []
        for path in paths:
            try:
                times.append(os.lstat(path).st_mtime)
            except OSError:
                continue
        return max(times, default=None)

    def replaced_outputs(self) -> list[str]:
        """The declared outputs a new attempt makes anew: all but its
        ``update()`` ones, which Snakemake leaves where they are for the
        job to update (not removed, moved or cleaned)."""
        return [o for o in self.outputs if o not in self.updated] if self.updated else self.outputs

    def clean(self) -> None:
        """Remove what the failed attempts of this series left (``workspace.clean``)."""
        self.workspace.clean()

    def done(self) -> bool:
        """Is the stage finished: a SUCCESS manifest whose outputs are there?"""
        data = self.life().manifest
        if data is None or data["state"] != "SUCCESS":
            return False
        return self.workspace.outputs_there(data)

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
