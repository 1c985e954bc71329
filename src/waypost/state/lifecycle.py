"""Which state is a stage directory in: the one reader.

``read(store, stage_dir, now)`` answers it for everyone who asks: the
planner (is the stage redone, or its inputs looked at again), status and the
status page, ``waypost plan``, cron, the executor (is a dead driver's job at
work there: adopt it; did this run's policy end the series), the step runner
(what a killed runner left), rerun/retry/reuse and prune (never touch a
directory with a live attempt). ``store`` is a ``stores.StageStore``:
the same answers on disk and in a bucket, from what the store lists.

What it reads, lazily and once: which of waypost's own files are there
(``_running.json``, ``_manifest.json``, ``_unfinished``, ``_provisional``),
their dates when they matter, the manifest, and the running marker with its
liveness. An attempt's marker that is older than the manifest beside it was
closed (its runner died between writing the manifest and removing the
marker): the manifest has the last word. A live attempt is one whose
process or scheduler's job (Slurm's) is alive, or whose step's processes are (its runner
gone, its process group not: ``orphaned``), or whose liveness can't be
known yet: "unknown" is never "gone".
"""

from __future__ import annotations

import json
import os
import time
from functools import cached_property

from waypost import scheduler
from waypost.model import manifest, records, states
from waypost.model.job import outputs_base
from waypost.model.layout import MANIFEST, PROVISIONAL, RUNNING, UNFINISHED, join, stage_name
from waypost.model.records import Manifest
from waypost.scheduler import stepgroup

# A ``_running.json`` whose heartbeat (its mtime, refreshed every minute by
# the runner while the step runs) is older than this counts as left by a
# runner that is gone, from any host. Until then a runner that can't be asked
# (another host, no scheduler's job; the scheduler not answering) may still be at work.
LEASE_S = float(os.environ.get("WAYPOST_LEASE_SECONDS", "600"))


class LiveAttempt:
    """An attempt at work (or not known to be gone) in a stage directory:
    ``where`` says whose (``pid 12 on host``, ``Slurm job 66 (RUNNING)``,
    ``unknown: …``); ``job`` its scheduler's job, if it runs in one;
    ``group`` the step's process group (``stepgroup.record``) when its
    runner is gone and that is what is at work."""

    __slots__ = ("group", "job", "pid", "where")

    def __init__(self, where: str, job: str | None, pid: int | None, group: dict | None = None):
        self.where, self.job, self.pid, self.group = where, job, pid, group

    @property
    def unknown(self) -> bool:
        return self.where.startswith("unknown")

    @property
    def orphaned(self) -> bool:
        """Its runner is gone but its step's processes are not: nobody will
        record them, so nobody waits for them (``waypost.state.leftovers``)."""
        return self.group is not None


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _alive(pid: int) -> bool:
    """Is ``pid`` (on this host) at work: there, and not a zombie (killed,
    not yet reaped by its parent: it does no more work)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _zombie(pid)


def judge(info: dict, me: int | None = None, age: float | None = None) -> LiveAttempt | None:
    """Is the attempt a running marker (``info``; ``age``: seconds since its
    last heartbeat) records at work? A LiveAttempt when its process (on this
    host, not ``me``) or its scheduler's job is alive, or its runner's gone but
    its step's process group lives on (on this host), or when that can't be
    known yet (another host without a scheduler's job, or the scheduler not
    answering, while the heartbeat is younger than the lease); None when it is gone."""
    pid, host = info.get("pid"), info.get("host")
    sched, job = scheduler_of(info)
    pid = pid if isinstance(pid, int) else None
    if host == manifest.hostname() and pid and pid != me:
        if _alive(pid):
            return LiveAttempt(f"pid {pid} on {host}", job, pid)
        group = info.get("step_group")
        left = stepgroup.members(group) if isinstance(group, dict) else []
        if left:
            return LiveAttempt(f"its runner, pid {pid} on {host}, is gone but its step is not: "
                               + stepgroup.describe(group, left), job, pid, group)
        return None
    if job and job != sched.job_in_env():
        state, raw = sched.final_state(job)
        if state is None and raw:
            return LiveAttempt(f"{sched.describe(job)} ({raw})", job, pid)
        if state is not None:
            return None
    if host == manifest.hostname() and (not pid or pid == me):
        return None
    if age is not None and age > LEASE_S:
        return None
    beat = "" if age is None else f", last heartbeat {age:.0f} s ago"
    asked = f", {sched.describe(job)} ({sched.accounting} did not answer)" if job else ""
    return LiveAttempt(f"unknown: pid {pid} on {host}{asked}{beat}; counted as gone once its heartbeat is "
                       f"{LEASE_S:.0f} s old", job, pid)


def scheduler_of(info: dict) -> tuple:
    """(scheduler, job) a record names; (None, None) outside any."""
    return scheduler.for_record(info) or (None, None)


class Life:
    """A stage (or instance) directory's lifecycle, read from ``store`` at
    ``now``. Everything is read when first asked and kept: one Life is one
    look at the directory."""

    def __init__(self, store, stage_dir: str, now: float | None = None, me: int | None = None):
        self.store, self.dir, self.me = store, stage_dir, me
        self.now = time.time() if now is None else now

    # --- what is there ----------------------------------------------------
    @cached_property
    def entries(self) -> list[str]:
        """Names in the directory (not its archive)."""
        return self.store.entries(self.dir)

    @cached_property
    def _engine(self) -> set[str]:
        return {name for name in self.entries if name in (RUNNING, MANIFEST, UNFINISHED, PROVISIONAL)}

    def _stamp(self, name: str) -> float:
        return self.store.mtime(join(self.dir, name))

    @cached_property
    def _manifest(self) -> tuple[Manifest | None, str | None]:
        if MANIFEST not in self._engine:
            return None, None
        try:
            return self.store.manifest(self.dir), None
        except manifest.ManifestError as exc:
            return None, str(exc)

    @property
    def manifest(self) -> Manifest | None:
        """The manifest (None without one, or when it can't be used: see ``error``)."""
        return self._manifest[0]

    @property
    def error(self) -> str | None:
        """Why the manifest can't be used, when it can't."""
        return self._manifest[1]

    @cached_property
    def _marker(self) -> tuple[dict | None, float | None]:
        if RUNNING not in self._engine:
            return None, None
        found = self.store.marker(self.dir)
        if found is None:
            return None, None
        text, age = found
        try:
            info = json.loads(text)
        except ValueError:
            info = None
        return (records.upgrade(info) if isinstance(info, dict) else {}), age

    @property
    def marker(self) -> dict | None:
        """What the running marker says (``{}`` when it can't be read; None without one)."""
        return self._marker[0]

    # --- the answers --------------------------------------------------------
    @cached_property
    def open_attempt(self) -> bool:
        """Is an attempt's marker there that no later manifest closed?"""
        if RUNNING not in self._engine:
            return False
        if MANIFEST not in self._engine:
            return True
        try:
            return self._stamp(MANIFEST) < self._stamp(RUNNING)
        except OSError:   # one of them went while we looked: ask again as it is now
            return RUNNING in self.store.entries(self.dir)

    @cached_property
    def live(self) -> LiveAttempt | None:
        """The attempt at work here (not ``me``'s), or None. Nothing may
        archive, prune, rerun or write in a directory with one."""
        if not self.open_attempt or self.marker is None:
            return None
        if not self.marker:   # a marker that can't be read: its writer is gone
            return None
        return judge(self.marker, self.me, self._marker[1])

    @property
    def interrupted(self) -> bool:
        """An attempt was under way and its runner is gone."""
        return self.open_attempt and self.live is None

    @cached_property
    def next_series_due(self) -> bool | None:
        """With an ``_unfinished`` marker (a series ended, a funnel went on
        over it): may the next series start now (its date has come)? None
        without one."""
        if UNFINISHED not in self._engine:
            return None
        try:
            return self._stamp(UNFINISHED) <= self.now
        except OSError:
            return None

    @property
    def redo(self) -> bool:
        """Must the planner redo this stage whatever its outputs say: an
        attempt left open (interrupted, or at work: its job then waits for
        it), or a series whose next one is due."""
        return self.open_attempt or self.next_series_due is True

    @property
    def recheck(self) -> bool:
        """Must the planner look at this stage's inputs again (made over
        parents that did not succeed, or a series in its backoff)?"""
        if self.open_attempt:
            return False
        if self.next_series_due is not None:
            return not self.next_series_due
        return PROVISIONAL in self._engine

    @property
    def given_up(self) -> bool:
        return bool((self.manifest or {}).get("given_up"))

    @property
    def provisional(self) -> bool:
        return bool((self.manifest or {}).get("provisional"))

    def ended_in_run(self, run_id: str | None) -> bool:
        """Did run ``run_id``'s policy end this stage's series (its manifest,
        written in that run, is not SUCCESS, and no attempt goes on)?"""
        data = self.manifest
        return (not self.open_attempt and data is not None and run_id is not None and data.get("run") == run_id
                and data["state"] != states.SUCCESS)

    def missing_outputs(self) -> list[str]:
        """The outputs a SUCCESS manifest records that aren't there."""
        return self._missing

    @cached_property
    def _missing(self) -> list[str]:
        base = outputs_base(self.dir, self.manifest)   # (a rule in its own layout: where its outputs are)
        return [o["path"] for o in (self.manifest or {}).get("outputs", [])   # (a temp() one Snakemake removed is not)
                if not (o.get("temp") or o.get("side")) and not self.store.exists(join(base, o["path"]))]

    def has_files(self) -> bool:
        """Does the directory hold anything but the engine's files?"""
        return any(not manifest.is_engine_file(e) for e in self.entries)

    def state(self, expected: dict | None = None) -> str:
        """The directory's state: ``running`` / ``interrupted`` (an open
        attempt), ``corrupt``, an end state (its manifest), ``adopted``
        (files but no manifest of this stage: ``expected`` holds the
        experiment/pair/stage/instance it is for) or ``missing`` (nothing,
        or a SUCCESS whose outputs are gone)."""
        if self.open_attempt:
            return states.RUNNING if self.live else states.INTERRUPTED
        if self.error:
            return states.CORRUPT
        data = self.manifest
        if data is None:
            return states.ADOPTED if self.has_files() else states.MISSING
        if expected and not all(data.get(k) == v for k, v in expected.items()):
            return states.ADOPTED if self.has_files() else states.MISSING
        if data["state"] == states.SUCCESS:
            if self.missing_outputs():
                return states.MISSING
            return states.ADOPTED if data.get("adopted") else states.SUCCESS
        return data["state"]


def read(store, stage_dir: str, now: float | None = None, me: int | None = None) -> Life:
    """The lifecycle of ``stage_dir`` in ``store`` (see Life)."""
    return Life(store, stage_dir, now, me)


def at(stage_dir: str, me: int | None = None) -> Life:
    """The lifecycle of one stage directory, from a store over it (in a
    bucket: the planning's listing when this process has one; on a mount
    served through its bucket's API, the bucket's listing, not this node's
    maybe older view: ``stores.consistent``)."""
    from waypost import stores
    where = stores.consistent(stage_dir)
    return read(stores.over(where), where, me=me)


def _manifest_at(stage_dir: str) -> Manifest | None:
    """The manifest of one stage directory, None when it has none or can't be read."""
    try:
        return at(stage_dir).manifest
    except OSError:
        return None


def succeeded_since(stage_dir: str, when: float) -> bool:
    """Does ``stage_dir`` record a SUCCESS whose series began at or after
    ``when`` (epoch seconds)? Its runner recorded it last, after the outputs
    were in place: a job started at ``when`` and left unfinished in its
    driver's eyes (the driver killed, its runner not) is complete."""
    found = _manifest_at(stage_dir)
    if not found or found.get("state") != states.SUCCESS or not found.get("attempts"):
        return False
    series = found["attempts"][-1].get("series")
    began = [a.get("start") for a in found["attempts"] if a.get("series") == series]
    try:
        return bool(began) and all(began) and manifest.iso_to_epoch(began[0]) >= when
    except ValueError:
        return False


def stopped_run(stage_dir: str, run: str | None) -> str | None:
    """How ``stage_dir``'s record names itself and the stop cue that ended
    the run ``run`` (``stopped_run``); None when it ended no run, or another."""
    found = _manifest_at(stage_dir)
    if not found or not found.get("stopped_run") or found.get("run") != run:
        return None
    name = stage_name(found["pair"], found["experiment"], found["stage"], found.get("instance"))
    return f"{name} stopped the run ({found['stopped_run']})"


def live_attempt(stage_dir: str, me: int | None = None) -> LiveAttempt | None:
    """The attempt at work in ``stage_dir`` (not this process's, ``me``),
    or None when there is none or it is gone."""
    try:
        return at(stage_dir, me).live
    except OSError:
        return None


# How often a runner waiting for another attempt looks again: a process on
# this host ends visibly at once; a scheduler's job is asked of the scheduler.
WAIT_LOCAL_S = 1.0
WAIT_SLURM_S = float(os.environ.get("WAYPOST_WAIT_SLURM_SECONDS", "10"))


def wait_until_gone(stage_dir: str, me: int | None = None, say=None) -> LiveAttempt | None:
    """Wait while an attempt is at work in ``stage_dir``; returns the one
    waited for (None if there was none). ``say`` is told once what is
    waited for. An attempt whose runner is gone (``orphaned``) is not
    waited for: nobody would record its end (``waypost.state.leftovers``)."""
    first = live_attempt(stage_dir, me)
    if first is None or first.orphaned:
        return None
    if say:
        say(first)
    current = first
    while current is not None and not current.orphaned:
        time.sleep(WAIT_LOCAL_S if current.pid and not current.job else WAIT_SLURM_S)
        current = live_attempt(stage_dir, me)
    return first
