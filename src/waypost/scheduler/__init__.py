"""Where a step's process lives: a batch scheduler's job (``base.Scheduler``;
Slurm's is ``slurm.SLURM``) or a process group on this machine
(``stepgroup``: no scheduler). Imports only ``model``.

Everyone else asks here which scheduler a process, or a record, is in:
``current()`` (None: no scheduler's job), ``current_job()``, and
``for_record()``. A new scheduler is one module beside ``slurm.py``
implementing ``base.Scheduler``, listed in ``SCHEDULERS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from waypost.model import records
from waypost.scheduler.base import Scheduler
from waypost.scheduler.slurm import SLURM

#: the schedulers a process may run under, asked in this order
SCHEDULERS: tuple[Scheduler, ...] = (SLURM,)


def current(environ: dict | None = None) -> Scheduler | None:
    """The scheduler whose job this process runs in; None outside any."""
    return next((s for s in SCHEDULERS if s.job_in_env(environ)), None)


def current_job(environ: dict | None = None) -> str | None:
    """The id of the scheduler's job this process runs in; None outside any."""
    scheduler = current(environ)
    return scheduler.job_in_env(environ) if scheduler else None


def by_name(name: str) -> Scheduler:
    """The scheduler profiles and the executor name so (``slurm``)."""
    found = next((s for s in SCHEDULERS if s.name == name), None)
    if found is None:
        raise ValueError(f"no scheduler {name!r} (waypost knows: {', '.join(s.name for s in SCHEDULERS)})")
    return found


def for_record(record: Mapping[str, Any]) -> tuple[Scheduler, str] | None:
    """The scheduler and job an attempt or running marker names (None: it
    ran outside any). Records name their job under one key
    (``records.job_of``), which has always been Slurm's."""
    job = records.job_of(record)
    return (SLURM, job) if job else None
