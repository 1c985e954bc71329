"""Where a step's process lives: a batch scheduler's job (``base.Scheduler``;
Slurm's is ``slurm.SLURM``) or a process group on this machine
(``stepgroup``: no scheduler). Imports only ``model``.

Everyone else asks here which scheduler a process, or a record, is in:
``current()`` (None: no scheduler's job), ``current_job()`` (as records
name it), ``for_record()`` (the one reader of the job a record names),
``by_name()`` and, for a worker pool's ``executor``, ``of_pool()`` and
``resource_names()``. A new scheduler is one module beside ``slurm.py``
implementing ``base.Scheduler``, listed in ``SCHEDULERS``, and a thin
Snakemake executor adapter that submits one job (and a job array, where it
has ``arrays``) under ``snakemake_executor_plugin_waypost.execution``'s
``WaypostExecution``, which holds the rest (grouping: ``grouping``).
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


def current_job(environ: dict | None = None) -> records.JobRef | None:
    """The scheduler's job this process runs in, as records name it
    (scheduler name, job id); None outside any."""
    scheduler = current(environ)
    job = scheduler.job_in_env(environ) if scheduler else None
    return (scheduler.name, job) if scheduler and job else None


def by_name(name: str) -> Scheduler:
    """The scheduler profiles and the executor name so (``slurm``)."""
    found = next((s for s in SCHEDULERS if s.name == name), None)
    if found is None:
        raise ValueError(f"no scheduler {name!r} (waypost knows: {', '.join(s.name for s in SCHEDULERS)})")
    return found


def of_pool(executor: str) -> Scheduler | None:
    """The scheduler a worker pool's ``executor`` names; None for ``local``
    (a process group on this machine)."""
    return None if executor == "local" else by_name(executor)


def resource_names(executor: str) -> dict[str, str]:
    """The resource names a pool's executor reads for workers.yaml's keys,
    where they are its scheduler's own (``workers.resources``' ``names``)."""
    scheduler = of_pool(executor)
    return dict(scheduler.resource_names) if scheduler else {}


def for_record(record: Mapping[str, Any]) -> tuple[Scheduler, str] | None:
    """The scheduler and job an attempt or running marker names (None: it
    ran outside any); an old record's ``slurm_job_id`` names a Slurm job
    (``records.job_of``)."""
    job = records.job_of(record)
    return (by_name(job[0]), job[1]) if job else None
