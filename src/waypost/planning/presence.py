"""Is a job done? Presence, written once over the one ``Job``
(``waypost.model.job``), for a stage (``StateView.needs_inputs``) and a rule
in its own layout (``OwnPresence``) alike.

A job is done when its record's markers (``lifecycle.Life.redo`` /
``recheck``) say neither to redo it (an attempt left open, or a series
whose next one is due: the job is forced) nor to look at its inputs again,
and every output is there (on a gs:// root: in the planning's one listing
of it). Whether presence mode applies and what ``--forcerun``/``--forceall``
force are each caller's to say: they differ (a stage follows presence mode
by default and is forced with what is downstream of a forced rule; a rule in
its own layout only where its config asks, and under any forcing keeps
Snakemake's answer). Each record directory's lifecycle is read once per
planning from one snapshot store over the root (a bucket root: its one
listing): files don't change while the DAG is built.
"""

from __future__ import annotations

import os

from waypost import stores
from waypost.model.job import Job
from waypost.model.records import Manifest
from waypost.planning.mountlag import MountLag
from waypost.state import lifecycle


class Presence:
    """The records and outputs of one planning's jobs, under ``root``
    (``mirror``: not None on a gs:// root); ``snake`` forces a job marked
    to redo (``waypost.planning.wiring.snake``)."""

    def __init__(self, snake, root: str, mirror: str | None):
        self.snake, self.root, self.mirror = snake, root, mirror
        self._lives: dict[str, lifecycle.Life] = {}
        self._nothing: set[str] = set()   # record directories not there, or empty (a local root)
        self._store = None   # the root's store, for a root read directory by directory (life)
        self._mount_lag = MountLag()   # on a bucket mount: waits for what it lists late

    # --- the question --------------------------------------------------------------
    def done(self, job: Job) -> bool:
        """Is a job done: its record marking nothing to redo or look at
        again (an attempt to redo forces it: ``marked``), every output there?"""
        redo, recheck = self.marked(job)
        return not (redo or recheck) and not self.missing(job)

    def marked(self, job: Job) -> tuple[bool, bool]:
        """(redo, recheck) of a job's record (``markers``); a job marked to
        redo is forced, whatever its outputs' state."""
        redo, recheck = self.markers(job.record_dir)
        if redo:
            self.snake.force(job.rule, job.wildcards)
        return redo, recheck

    def missing(self, job: Job) -> list[str]:
        """The outputs of a job that are not there. A stage's are all in its
        record directory: where that is absent or empty (on a local root,
        read once per planning, as for its markers) none is looked up."""
        if job.outputs_in_record and self.empty(job.record_dir):
            return list(job.outputs)
        return [location for location in job.outputs if not self.present(location)]

    def present(self, location: str) -> bool:
        """Is a job's file (a path, or a gs:// URL) there? A URL: is it (or
        objects below it, a ``directory()`` output) in the one listing of
        the root this planning makes."""
        if not stores.is_bucket_url(location):
            return os.path.exists(location)
        name = stores.filesystem(location)[1]
        return name in stores.listing(self.root) or name in stores.directories(self.root)

    # --- what records say ------------------------------------------------------------
    def life(self, record_dir: str) -> lifecycle.Life:
        """The lifecycle of a record directory (on a bucket root, relative
        to it or its URL), read once per planning."""
        if self.mirror is not None:   # (one entry per directory, however it is spelled)
            record_dir = stores.resolve(self.root, record_dir)
        if record_dir not in self._lives:
            if self.mirror is None:
                if self._store is None:   # one store over the root for the whole planning, listing
                    # each directory once (a directory not there is known from its parent's;
                    # an unknown mount: said once)
                    self._store = stores.store_for(self.root, snapshot=True)
                life = lifecycle.read(self._store, record_dir)
                if not life.entries:   # nothing there (kept as a name only: fewer objects)
                    self._nothing.add(record_dir)
                    return life
                if self._store.bucket_url is not None:
                    self._mount_lag.wait_for(life)
                self._lives[record_dir] = life
            else:
                self._lives[record_dir] = lifecycle.read(stores.over(record_dir), record_dir)
        return self._lives[record_dir]

    def markers(self, record_dir: str) -> tuple[bool, bool]:
        """(redo, recheck) of a record directory (``lifecycle.Life.redo`` /
        ``recheck``): an attempt left open, or a series whose next one is
        due, is redone; a job made over parents that did not succeed, or
        in its backoff, has its inputs looked at again."""
        if record_dir in self._nothing:
            return False, False
        life = self.life(record_dir)
        return life.redo, life.recheck

    def recorded(self, record_dir: str) -> Manifest | None:
        """A record directory's manifest; None when there is none or it can't be read."""
        if record_dir in self._nothing:
            return None
        try:
            return self.life(record_dir).manifest
        except (OSError, stores.StorageError):
            return None

    def empty(self, record_dir: str) -> bool:
        """Is a record directory on a local root absent or empty (read once,
        by ``life``)? Never said of a bucket root's."""
        if self.mirror is not None:
            return False
        if record_dir not in self._nothing and record_dir not in self._lives:
            self.life(record_dir)
        return record_dir in self._nothing
