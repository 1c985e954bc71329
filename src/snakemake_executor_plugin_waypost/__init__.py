"""waypost's Slurm executor for Snakemake: snakemake-executor-plugin-slurm's
submission, with waypost's stage jobs run without a Snakemake in the job.

- **The step runner straight in the job.** A stage job's step is complete
  in Snakemake's main process (``waypost.planning.wiring.steps.job_command``: the step
  runner's line with the step spec and the rule's command), so it is written
  to a step file in the executor's temporary directory (under
  ``.snakemake``, shared with the nodes, removed when the run ends) and the
  job runs it directly (``waypost/scheduler/jobstep.py``) instead of a second
  Snakemake that re-parses the workflow to run one command. Other jobs go
  the plugin's way.
- **Packing.** A worker class with ``pack: N`` in workers.yaml submits up to
  N ready jobs of one rule with the same request as one Slurm job array (the
  plugin's arrays; each task its own allocation of the class's size, no
  memory added). Each task is its own stage: its own manifest, attempts and
  policy; a task Slurm ends is retried alone.
- **Bundles.** A worker class with ``bundle: N`` runs up to N ready jobs
  of one rule with the same request in one Slurm job, one after another,
  each its own stage with its own runner (``bundles``): short stages stop
  paying a Slurm job each.
- **One check per status round** (``Executor.scheduler.check``: for
  Slurm one sacct query, and squeue's word on pending jobs' reasons):
  ``COMPLETED`` succeeds, every other end fails (``CANCELLED by 0`` and a
  ``PREEMPTED`` job included: the plugin would wait on those for ever), and
  a job pending for a reason that cannot clear (a time limit over the
  partition's, a feature or GRES no node has, an invalid partition, account
  or QOS) is cancelled and fails with that reason.
- **Every end reaches the manifest.** A stage job that ended without its
  runner recording it (cancelled while pending, killed before or as it
  started, never startable) is recorded by the runner in ``--lost-job``
  mode, here, and the stage's policy decides as after any attempt.
- **No futile resubmission.** A stage whose series the policy ended in this
  run is not submitted again by Snakemake's retries: its job fails at once.
- **A dead driver's jobs are adopted.** A stage whose attempt is still at
  work in a Slurm job (its ``_running.json`` names the job, and Slurm says it
  pends or runs, or can't say yet) is not submitted again: that job is
  waited for as if this run had submitted it (``waypost.state.lifecycle``).

Select it with ``executor: waypost`` (the profiles do); its options are the
Slurm plugin's, spelled ``--waypost-...``.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys

from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings, common_settings  # noqa: F401  (re-exported)
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from waypost import stores
from waypost.model import manifest
from waypost.model import spec as wspec
from waypost.planning.wiring.steps import job_command, needs_own_process
from waypost.runner import main as runner
from waypost.runner.bundle import BUNDLE_OPTION
from waypost.scheduler import jobstep
from waypost.scheduler.base import JobState
from waypost.scheduler.slurm import SLURM
from waypost.snakemake import STEP_PARAM
from waypost.state import lifecycle

from . import bundles, slurm_private

# The longest wait between two status rounds (the Slurm plugin's is 180 s).
MAX_STATUS_INTERVAL = 30
JOBSTEP = os.path.join(os.path.dirname(os.path.abspath(jobstep.__file__)), "jobstep.py")


def stage_job(job) -> bool:
    """Is this a waypost stage job (its rule wired by ``wp.finish()``)?"""
    return not job.is_group() and STEP_PARAM in job.rule.params._names


def direct_step(job) -> bool:
    """Does the job's Slurm job run its step straight (or packed, or in a
    bundle), without a Snakemake process of its own? A stage job's does,
    and so does a rule's in its own layout unless it needs one
    (``needs_own_process``: ``conda:`` in effect, a benchmark...): then it
    runs as plain Snakemake runs it, its step runner inside."""
    return stage_job(job) and ('"own_layout":true' not in job.params[STEP_PARAM] or not needs_own_process(job))


class Executor(SlurmExecutor):
    #: the scheduler its jobs are checked, cancelled, adopted and recorded in
    scheduler = SLURM

    def __post_init__(self, *args, **kwargs):
        try:
            slurm_private.check()
        except slurm_private.UntestedPlugin as exc:
            # one line, as waypost says a fault (a WorkflowError would add
            # Snakemake's frame line); before any job is submitted
            print(f"waypost: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
        super().__post_init__(*args, **kwargs)
        # The status rounds keep the profile's pace from the start: unset,
        # the interface sleeps Snakemake's default (10 s) between rounds.
        self.next_seconds_between_status_checks = self._first_interval()
        self._lost_checked: set[str] = set()
        self._never_seen: dict = {}   # Slurm job id → the never-start reason the last round saw
        self._bundles: dict[tuple, list] = {}   # a bundle's leader (bundles.key) → its jobs, until submitted

    # --- what a job runs -------------------------------------------------
    def format_job_exec(self, job: JobExecutorInterface) -> str:
        if not direct_step(job):
            return super().format_job_exec(job)
        members = self._bundles.get(bundles.key(job))
        if members:   # the step runner's own entry runs the bundle (waypost.runner.bundle)
            return (f"{shlex.join(runner.command(sys.executable))} {BUNDLE_OPTION} "
                    f"{shlex.quote(self._bundle_list(members))}")
        return (f"{shlex.quote(sys.executable)} -S {shlex.quote(JOBSTEP)} "
                f"{jobstep.INDEX_OPTION}{self.scheduler.array_index_env} {shlex.quote(self._step_file(job))}")

    def _status_file(self, job) -> str:
        return os.path.join(self.tmpdir, f"step-{job.rule.name}-{job.jobid}-{job.attempt}.status")

    def _bundle_list(self, members: list) -> str:
        leader = members[0]
        path = os.path.join(self.tmpdir, f"bundle-{leader.rule.name}-{leader.jobid}-{leader.attempt}.list")
        if not os.path.exists(path):
            bundles.write_list(path, [(self._step_file(m), self._status_file(m)) for m in members])
        return path

    def _step_file(self, job) -> str:
        """The job's step, written where its node reads it (once per job and
        attempt: the plugin formats an array task's command twice)."""
        path = os.path.join(self.tmpdir, f"step-{job.rule.name}-{job.jobid}-{job.attempt}.sh")
        if not os.path.exists(path):
            command = job_command(job, wspec.decode(job.params[STEP_PARAM]).mirror)
            with open(path + ".tmp", "w") as f:
                f.write(command + "\n")
            os.replace(path + ".tmp", path)
        return path

    # --- submission: packing, and no futile resubmission -----------------
    def run_jobs(self, jobs: list[JobExecutorInterface]):
        slurm_private.bind_event_loop(self)
        packs: dict[tuple, list] = {}
        bundled: dict[tuple, list] = {}
        for job in jobs:
            if stage_job(job) and self._adopted(job):
                continue
            if stage_job(job) and self._series_ended(job):
                self.run_job_pre(job)
                self.report_job_error(self._info(job), msg="waypost: the stage's policy already ended its "
                                      "series in this run (see its manifest); not submitted again")
                continue
            bundle = int(job.resources.get("waypost_bundle", 1) or 1) if direct_step(job) else 1
            size = int(job.resources.get("waypost_pack", 1) or 1) if direct_step(job) else 1
            if size < 2 and bundle < 2:
                slurm_private.submit_job(self, job)
                continue
            request = tuple(sorted((k, str(v)) for k, v in job.resources.items() if not k.startswith("_")))
            (bundled if bundle >= 2 else packs).setdefault((job.rule.name, request, max(bundle, size)), []).append(job)
        for groups, submit in ((packs, self._submit_array), (bundled, self._submit_bundle)):
            for (_, _, size), group in groups.items():
                for start in range(0, len(group), size):
                    chunk = group[start:start + size]
                    if len(chunk) == 1:
                        slurm_private.submit_job(self, chunk[0])
                    else:
                        submit(chunk)

    def _submit_bundle(self, members: list) -> None:
        """One Slurm job for these stage jobs (the first one's submission,
        running every one's step in turn: see ``bundles``)."""
        self._bundles[bundles.key(members[0])] = members
        for job in members[1:]:
            self.run_job_pre(job)
        slurm_private.submit_job(self, members[0])

    def _submit_array(self, members: list) -> None:
        slurm_private.submit_array(self, members)

    def report_job_submission(self, job_info) -> None:
        members = self._bundles.pop(bundles.key(job_info.job), None) if stage_job(job_info.job) else None
        if not members:
            return super().report_job_submission(job_info)
        from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
        for job in members:
            aux = {**(job_info.aux or {}), bundles.STATUS_KEY: self._status_file(job)}
            if job is job_info.job:
                job_info.aux = aux
                super().report_job_submission(job_info)
            else:
                super().report_job_submission(SubmittedJobInfo(job, external_jobid=job_info.external_jobid, aux=aux))

    def report_job_error(self, job_info, msg=None, **kwargs) -> None:
        members = self._bundles.pop(bundles.key(job_info.job), None) if stage_job(job_info.job) else None
        super().report_job_error(job_info, msg=msg, **kwargs)
        for job in (members or [])[1:]:   # the bundle's submission failed: so did each of its jobs
            super().report_job_error(self._info(job), msg=msg, **kwargs)

    def _adopted(self, job) -> bool:
        """Is an attempt of this stage still at work in a Slurm job of its own
        (a run whose driver died, say: a login node rebooted while its jobs
        went on)? Then that job is waited for as if this run had submitted
        it, and no second one is submitted: one live attempt per stage
        directory. Its end is read from its scheduler like any job's."""
        live = lifecycle.live_attempt(self._stage_dir(job))
        if live is None or live.job is None:
            return False   # none; or a process the job's runner waits for
        from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
        self.run_job_pre(job)
        self.logger.info(f"waypost: {job.rule.name} {dict(job.wildcards.items())}: {self.scheduler.describe(live.job)} "
                         f"of an earlier run is still at work there ({live.where}); waiting for it instead of "
                         "submitting another")
        self.report_job_submission(SubmittedJobInfo(job, external_jobid=live.job,
                                                    aux={"waypost_adopted": True}))
        return True

    def _info(self, job):
        from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
        return SubmittedJobInfo(job)

    def _series_ended(self, job) -> bool:
        """Did the policy end this stage's series in this run (its manifest,
        written by this run, is not SUCCESS, and no attempt goes on)?"""
        if job.attempt <= 1:
            return False
        directory = self._stage_dir(job)
        if directory is None or stores.needs_mirror(directory):
            return False           # the runner says so in the job (one listing is not worth it here)
        return lifecycle.at(directory).ended_in_run(os.environ.get(manifest.RUN_ID_ENV))

    @staticmethod
    def _stage_dir(job) -> str:
        return wspec.decode(job.params[STEP_PARAM]).stage_dir

    # --- status: one scheduler check per round ------------------------------
    def _first_interval(self) -> float:
        # (at least 1 s: a round with nothing in flight asks nothing, so 0 would spin)
        return max(self.workflow.executor_settings.init_seconds_before_status_checks, 1)

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
            row = rows.get(str(job.external_jobid))
            if bundles.STATUS_KEY in (job.aux or {}):
                ended = await self._bundled(job, row)
                finished |= ended
                if not ended:
                    yield job
                continue
            if row is None or row.ended is None:     # not known to the scheduler yet, or not ended
                never = self.scheduler.never_starts(row) if row is not None else None
                # Slurm says `PartitionConfig` for a moment after any submission, before its
                # scheduler has looked: a reason counts once two rounds in a row say it.
                seen = self._never_seen.pop(job.external_jobid, None)
                if never and seen != row.reason:
                    self._never_seen[job.external_jobid] = row.reason
                    never = None
                if never:
                    await asyncio.to_thread(self.scheduler.cancel, str(job.external_jobid))
                    finished = True
                    await self._failed(job, JobState("CANCELLED", f"{self.scheduler.label} can never start "
                                                     f"it ({row.reason}: {never})", row.raw, "CANCELLED"))
                    continue
                yield job
                continue
            finished = True
            if row.ended == "SUCCESS":
                self.report_job_success(job)
                log = job.aux.get("slurm_logfile")
                if log and not self.workflow.executor_settings.keep_successful_logs and log.exists():
                    log.unlink()
            else:
                await self._failed(job, row)
        # Ask again soon after a round where jobs ended (their dependents are
        # being submitted: a chain of short stages hops at this pace), and
        # back off geometrically, to MAX_STATUS_INTERVAL, while all run on.
        first = self._first_interval()
        if finished:
            self.next_seconds_between_status_checks = first
        else:
            now = self.next_seconds_between_status_checks or first
            self.next_seconds_between_status_checks = min(max(now, first) * 1.5, MAX_STATUS_INTERVAL)

    async def _bundled(self, job, row) -> bool:
        """Has a bundled stage job ended (and been reported)? Its step's exit
        status says, as soon as it is written; a step that ended by a signal
        (Slurm ending the job), or never ran, ends as sacct says the bundle
        ended, once it has."""
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
        task's differs from ``<array>_<task>``)."""
        log = job.aux.get("slurm_logfile")
        state, reason = end.state, end.reason
        if stage_job(job.job):
            last = job.job.restart_times <= job.job.attempt - 1
            argv = [*runner.command(sys.executable), "--lost-job", end.raw or str(job.external_jobid),
                    "--lost-scheduler", self.scheduler.name, "--lost-state", end.ended or "FAILED",
                    "--lost-reason", reason or f"{self.scheduler.accounting}: {state}",
                    *(["--last-chance"] if last else [])]
            step = wspec.decode(job.job.params[STEP_PARAM])
            code, out = await _run(argv, stdin=wspec.write(step))
            if code != 0:
                self.logger.warning(f"waypost: could not record {self.scheduler.describe(job.external_jobid)}'s "
                                    f"end: {out[-500:]}")
            # The runner's end state and decision, as a local run shows them:
            # its own lines in the job's log, or those of the end just recorded.
            said = [] if bundles.STATUS_KEY in (job.aux or {}) or not log else log_tail(str(log))
            for line in runner_lines(said + (out.splitlines() if code == 0 else [])):
                self.logger.error(line)
        self.report_job_error(job, msg=f"{self.scheduler.describe(job.external_jobid)} ended {state}"
                              + (f" ({reason})" if reason else ""),
                              aux_logs=[str(log)] if log else [])


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
