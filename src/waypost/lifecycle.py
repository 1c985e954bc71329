"""Is an attempt at work in a stage directory, and whose is it?

The question every part asks before it touches a stage directory: the
executor before it submits a job (a dead driver's Slurm job still at work
there is waited for, never doubled), the step runner before it starts an
attempt (it waits for a live one to end), the lost-job recorder before it
closes an attempt. An attempt is at work while its ``_running.json`` says so
(``manifest.marker_in_flight``: its process or its Slurm job is alive, or
its liveness can't be known yet — "unknown" is never "gone").
"""

from __future__ import annotations

import json
import os
import time

from . import manifest, stores
from .layout import RUNNING
from .stores import gcs


class LiveAttempt:
    """An attempt at work (or not known to be gone) in a stage directory:
    ``where`` says whose (``pid 12 on host``, ``Slurm job 66 (RUNNING)``,
    ``unknown: …``); ``slurm_job`` its Slurm job, if it runs in one."""

    __slots__ = ("pid", "slurm_job", "where")

    def __init__(self, where: str, slurm_job: str | None, pid: int | None):
        self.where, self.slurm_job, self.pid = where, slurm_job, pid

    @property
    def unknown(self) -> bool:
        return self.where.startswith("unknown")


def _marker(stage_dir: str) -> tuple[bytes, float] | None:
    """A stage directory's ``_running.json`` and its heartbeat's age; None
    without one. On a gs:// root the planning's listing says whether there
    is one (no request for the stages that have none)."""
    if stores.is_bucket_url(stage_dir):
        url = f"{stage_dir.rstrip('/')}/{RUNNING}"
        if gcs.root_of(url) is not None and gcs.listed_info(url) is None:
            return None
        from .stores.gcs import mtime_of
        fs, path = gcs.filesystem(url)
        try:
            return fs.cat_file(path), time.time() - mtime_of(fs.info(path))
        except FileNotFoundError:
            return None
    try:
        with open(os.path.join(stage_dir, RUNNING), "rb") as f:
            return f.read(), time.time() - os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None


def live_attempt(stage_dir: str, me: int | None = None) -> LiveAttempt | None:
    """The attempt at work in ``stage_dir`` (not this process's, ``me``),
    or None when there is none or it is gone."""
    try:
        found = _marker(stage_dir)
    except OSError:
        return None
    if found is None:
        return None
    text, age = found
    alive, where = manifest.marker_in_flight(text, me, age)
    if not alive:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        info = {}
    job = info.get("slurm_job_id") if isinstance(info, dict) else None
    pid = info.get("pid") if isinstance(info, dict) else None
    return LiveAttempt(where or "unknown", str(job) if job else None, pid if isinstance(pid, int) else None)


# How often a runner waiting for another attempt looks again: a process on
# this host ends visibly at once; a Slurm job is asked of sacct.
WAIT_LOCAL_S = 1.0
WAIT_SLURM_S = float(os.environ.get("WAYPOST_WAIT_SLURM_SECONDS", "10"))


def wait_until_gone(stage_dir: str, me: int | None = None, say=None) -> LiveAttempt | None:
    """Wait while an attempt is at work in ``stage_dir``; returns the one
    waited for (None if there was none). ``say`` is told once what is
    waited for."""
    first = live_attempt(stage_dir, me)
    if first is None:
        return None
    if say:
        say(first)
    current = first
    while current is not None:
        time.sleep(WAIT_LOCAL_S if current.pid and not current.slurm_job else WAIT_SLURM_S)
        current = live_attempt(stage_dir, me)
    return first
