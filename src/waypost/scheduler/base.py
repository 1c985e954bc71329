"""What waypost asks of a batch scheduler (Maestro-style: one small
interface, one implementation per scheduler; Slurm's is ``slurm.SLURM``).

A job's whole life is asked here or decided once for every scheduler:

- submitting: which ready jobs share a submission (alone, a job array, a
  bundle) is ``grouping``'s, the same for all; ``arrays`` says whether the
  scheduler can run a job array (where it can't, packed jobs go one each).
  The submission itself is the Snakemake executor plugin's thin adapter
  (``snakemake_executor_plugin_waypost``: its ``Executor`` puts a
  scheduler's submit-one and submit-array under ``execution.WaypostExecution``,
  which also holds bundles, adopting a live attempt, the status rounds and
  recording lost ends, through the methods below);
- ``check``: a batch of jobs' states in one question (a status round),
  each a ``JobState``; ``never_starts``: why a pending job can never start;
- ``cancel``: end a job;

- ``job_in_env``: the job the current process runs in (None: none of this
  scheduler's);
- ``final_state``: how a job ended, as a waypost end state
  (``waypost.model.states``), with the scheduler's own word for it;
- ``alive``: is a job pending or running (None: the scheduler can't say);
- ``describe``: how messages name a job (``Slurm job 66``);
- ``array_index_env``/``array_index_in_env``: an array task's index
  (``jobstep``);
- ``resource_names``: the resource names its executor reads for
  workers.yaml's keys, where they are its own;
- ``cluster_facts``/``class_mismatches``: a pool's classes checked against
  what the cluster has (``waypost workers --check``).

A process with no scheduler's job is a process group on this machine
(``stepgroup``): ``waypost.scheduler.current()`` is None there.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import ClassVar


class JobState:
    """A job as its scheduler says in one ``check``: its ``state`` (the
    scheduler's word), ``reason`` ('' for none), ``raw`` id (the one its
    runner saw in its environment; None while that is not known) and
    ``ended``: its waypost end state, None while it has not ended."""

    __slots__ = ("ended", "raw", "reason", "state")

    def __init__(self, state: str, reason: str = "", raw: str | None = None, ended: str | None = None):
        self.state, self.reason, self.raw, self.ended = state, reason, raw, ended


class Scheduler(ABC):
    #: how profiles and workers.yaml name it (an ``executor:``)
    name: str
    #: how messages name it (``Slurm is ending this job``)
    label: str
    #: where a job's end is read, as messages name it (``sacct will say why``)
    accounting: str
    #: the environment variable that holds the id of the job a process runs in
    job_env: str
    #: the one that holds an array task's index, in a job array's task
    array_index_env: str
    #: can it run jobs as one job array (workers.yaml's ``pack``)? Where it
    #: can't, packed jobs are submitted one each (``grouping``)
    arrays: bool = False
    #: workers.yaml keys its executor reads under names of its own (beyond
    #: ``waypost.model.workers.RESOURCE_NAMES``: ``partition`` → ``slurm_partition``)
    resource_names: ClassVar[dict[str, str]] = {}

    def job_in_env(self, environ: dict | None = None) -> str | None:
        """The id of the job this process (or ``environ``'s) runs in; None
        outside this scheduler's jobs."""
        return (os.environ if environ is None else environ).get(self.job_env) or None

    def array_index_in_env(self, environ: dict | None = None) -> str | None:
        """This process's task index in a job array; None outside one."""
        return (os.environ if environ is None else environ).get(self.array_index_env) or None

    @abstractmethod
    def final_state(self, job: str) -> tuple[str | None, str | None]:
        """(waypost end state, the scheduler's state) of a job that ended;
        (None, its state) while it has not; (None, None) when the scheduler
        does not know the job or did not answer: unknown, never gone."""

    @abstractmethod
    def check(self, jobs: list[str]) -> dict[str, JobState] | None:
        """The state of each of ``jobs`` the scheduler knows, by id, in one
        question; None when it did not answer: unknown, never gone."""

    def never_starts(self, job: JobState) -> str | None:
        """Why a job ``check`` says is pending can never start, in words
        (the scheduler's reason is ``job.reason``); None while it may."""
        return None

    @abstractmethod
    def cancel(self, job: str) -> None:
        """End the job (pending or running); a job already gone is no fault."""

    def alive(self, job: str) -> bool | None:
        """Is the job pending or running? None when that can't be known."""
        state, raw = self.final_state(job)
        if state is None and raw is None:
            return None
        return state is None

    def describe(self, job: str) -> str:
        return f"{self.label} job {job}"

    def cluster_facts(self) -> dict | None:
        """What the cluster offers, for ``class_mismatches`` (``waypost
        workers --check``); None when it does not answer."""
        return None

    def class_mismatches(self, spec: dict, facts: dict) -> list[str]:
        """What in a worker class (workers.yaml keys) the cluster can never
        give, one line each."""
        return []
