"""The executor's status rounds, whatever the scheduler: one
``scheduler.check`` per round over every job in flight.

Its end decides: ``SUCCESS`` succeeds, every other end fails (a cancelled
or preempted job included: Snakemake's plugins may wait on those for ever);
a job pending for a reason that cannot clear (``scheduler.never_starts``)
is cancelled and fails with that reason; a bundled stage ends as its step's
exit status says (``bundles``). A stage job that ended without its runner
recording it (cancelled while pending, killed before or as it started,
never startable) is recorded by the runner in ``--lost-job`` mode, here,
and the stage's policy decides as after any attempt. Rounds come soon after
one where jobs ended and back off, to ``MAX_STATUS_INTERVAL``, while all
run on.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from waypost.model import spec as wspec
from waypost.runner import main as runner
from waypost.scheduler.base import JobState, Scheduler
from waypost.snakemake import STEP_PARAM

from . import bundles
from .stagejobs import stage_job

# The longest wait between two status rounds (the Slurm plugin's is 180 s).
MAX_STATUS_INTERVAL = 30
# How long a pending reason that no waiting clears must stand before the job
# is cancelled for it (Slurm may say one for a while before its scheduler looks).
NEVER_START_CONFIRM_S = 15


class StatusRounds:
    #: the scheduler its jobs are checked, cancelled, adopted and recorded in
    scheduler: Scheduler

    # --- what the adapter provides (each with a default) -------------------
    def initial_status_wait(self) -> float:
        """The profile's wait before the first status round (seconds)."""
        return self.workflow.executor_plugin.common_settings.init_seconds_before_status_checks

    def job_log(self, job_info) -> Path | None:
        """The log file of a submitted job, where the executor writes one."""
        return None

    def keeps_successful_logs(self) -> bool:
        """Is a job's log kept after it succeeded?"""
        return True

    # --- the rounds ---------------------------------------------------------
    def _start_rounds(self) -> None:
        # The status rounds keep the profile's pace from the start: unset,
        # the interface sleeps Snakemake's default (10 s) between rounds.
        self.next_seconds_between_status_checks = self._first_interval()
        self._never_seen: dict = {}   # job id → (the never-start reason the last round saw, since when)

    def _first_interval(self) -> float:
        # (at least 1 s: a round with nothing in flight asks nothing, so 0 would spin)
        return max(self.initial_status_wait(), 1)

    async def check_active_jobs(self, active_jobs):
        if not active_jobs:   # nothing in flight yet (or any more): a submission may come at any moment
            self.next_seconds_between_status_checks = self._first_interval()
            return
        ids = sorted({str(j.external_jobid) for j in active_jobs})
        async with self.status_rate_limiter:
            rows = await asyncio.to_thread(self.scheduler.check, ids)
        if rows is None:                      # the scheduler did not answer: unknown, never gone; ask again next round
            for job in active_jobs:
                yield job
            return
        finished = False
        for job in active_jobs:
            if await self._settled(job, rows.get(str(job.external_jobid))):
                finished = True
            else:
                yield job
        self._pace(finished)

    def _pace(self, finished: bool) -> None:
        # Ask again soon after a round where jobs ended (their dependents are
        # being submitted: a chain of short stages hops at this pace), and
        # back off geometrically, to MAX_STATUS_INTERVAL, while all run on.
        first = self._first_interval()
        if finished:
            self.next_seconds_between_status_checks = first
        else:
            now = self.next_seconds_between_status_checks or first
            self.next_seconds_between_status_checks = min(max(now, first) * 1.5, MAX_STATUS_INTERVAL)

    async def _settled(self, job, row: JobState | None) -> bool:
        """Has the job ended (and been reported), as ``row`` (its scheduler's
        word this round; None: not known to it yet) says?"""
        if bundles.STATUS_KEY in (job.aux or {}):
            return await self._bundled(job, row)
        if row is None or row.ended is None:     # not known to the scheduler yet, or not ended
            return await self._cancelled_never_starting(job, row)
        if row.ended != "SUCCESS":
            await self._failed(job, row)
            return True
        self.report_job_success(job)
        log = self.job_log(job)
        if log and not self.keeps_successful_logs() and log.exists():
            log.unlink()
        return True

    async def _cancelled_never_starting(self, job, row: JobState | None) -> bool:
        """Is a job that has not ended pending for a reason that cannot clear?
        Then it is cancelled and fails with that reason."""
        never = self.scheduler.never_starts(row) if row is not None else None
        # Slurm says `PartitionConfig` for a moment after any submission, before its
        # scheduler has looked (longer when slurmctld is busy): a reason counts once
        # two rounds in a row, NEVER_START_CONFIRM_S apart at least, say it.
        seen = self._never_seen.pop(job.external_jobid, None)
        if not never:
            return False
        now = time.monotonic()
        if seen is None or seen[0] != row.reason:
            seen = (row.reason, now)
        if now - seen[1] < NEVER_START_CONFIRM_S:
            self._never_seen[job.external_jobid] = seen
            return False
        await asyncio.to_thread(self.scheduler.cancel, str(job.external_jobid))
        await self._failed(job, JobState("CANCELLED", f"{self.scheduler.label} can never start "
                                         f"it ({row.reason}: {never})", row.raw, "CANCELLED"))
        return True

    async def _bundled(self, job, row: JobState | None) -> bool:
        """Has a bundled stage job ended (and been reported)? Its step's exit
        status says, as soon as it is written; a step that ended by a signal
        (the scheduler ending the job), or never ran, ends as the scheduler
        says the bundle ended, once it has."""
        status = bundles.status_of(job.aux[bundles.STATUS_KEY])
        if status == 0:
            self.report_job_success(job)
            return True
        if status is not None and status < 128:
            await self._failed(job, JobState("FAILED", f"its step exited {status}", row.raw if row else None, "FAILED"))
            return True
        if row is None or row.ended is None:
            return False
        if row.ended == "SUCCESS":   # the bundle's job ended well, but this step's status never came
            end = JobState("FAILED", "the bundle's job ended without this stage's step's exit status", row.raw,
                           "FAILED")
        else:
            end = JobState(row.state, row.reason or ("" if status else "the bundle's job ended before this "
                                                     "stage's step ran"), row.raw, row.ended)
        await self._failed(job, end)
        return True

    async def _failed(self, job, end: JobState) -> None:
        """Report a job's failure (``end``: how it ended, as its scheduler's
        ``check`` says), and record its end in the stage's manifest where no
        runner did (under ``end.raw``: the id its runner saw; an array
        task's may differ from the array's)."""
        log = self.job_log(job)
        if stage_job(job.job):
            await self._record_lost_end(job, end, log)
        self.report_job_error(job, msg=f"{self.scheduler.describe(job.external_jobid)} ended {end.state}"
                              + (f" ({end.reason})" if end.reason else ""),
                              aux_logs=[str(log)] if log else [])

    async def _record_lost_end(self, job, end: JobState, log: Path | None) -> None:
        """The runner's ``--lost-job`` mode records the end (the stage's
        policy decides as after any attempt); its lines, and the runner's
        own in the job's log, are shown as a local run shows them."""
        last = job.job.restart_times <= job.job.attempt - 1
        argv = [*runner.command(sys.executable), "--lost-job", end.raw or str(job.external_jobid),
                "--lost-scheduler", self.scheduler.name, "--lost-state", end.ended or "FAILED",
                "--lost-reason", end.reason or f"{self.scheduler.accounting}: {end.state}",
                *(["--last-chance"] if last else [])]
        step = wspec.decode(job.job.params[STEP_PARAM])
        code, out = await _run(argv, stdin=wspec.write(step))
        if code != 0:
            self.logger.warning(f"waypost: could not record {self.scheduler.describe(job.external_jobid)}'s "
                                f"end: {out[-500:]}")
        said = [] if bundles.STATUS_KEY in (job.aux or {}) or not log else log_tail(str(log))
        for line in runner_lines(said + (out.splitlines() if code == 0 else [])):
            self.logger.error(line)


def log_tail(path: str, size: int = 1 << 16) -> list[str]:
    """The last lines of a job's log (its last ``size`` bytes: the step's
    own output can be long); none when it can't be read."""
    try:
        with open(path, "rb") as f:
            length = f.seek(0, os.SEEK_END)
            f.seek(max(0, length - size))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return lines[1:] if length > size else lines   # (the first may be cut)


def runner_lines(lines: list[str]) -> list[str]:
    """The step runner's own lines among a job's output."""
    return [line for line in lines if line.startswith("waypost: ")]


async def _run(argv: list[str], stdin: bytes | None = None) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await process.communicate(stdin)
    return process.returncode, out.decode(errors="replace")
