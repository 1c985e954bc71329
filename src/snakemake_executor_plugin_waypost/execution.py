"""waypost's executor behaviour, whatever the scheduler: what a job runs,
how ready jobs are submitted (alone, packed into arrays, in bundles;
``waypost.scheduler.grouping``), adopting a live attempt and refusing a
futile resubmission. The status rounds are ``rounds.StatusRounds``'.

``WaypostExecution`` sits before a Snakemake remote executor in a class's
bases (``class Executor(WaypostExecution, SlurmExecutor)``) and asks it for
the few things that are the scheduler's (``submit_single``, ``submit_array``
where ``scheduler.arrays``, ``bind_event_loop``, and the ``rounds`` hooks);
it reports through ``snakemake-interface-executor-plugins``' public API.
"""

from __future__ import annotations

import os
import shlex
import sys

from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from waypost.model import spec as wspec
from waypost.planning.wiring.steps import job_command
from waypost.runner import main as runner
from waypost.runner.bundle import BUNDLE_OPTION
from waypost.scheduler import grouping, jobstep
from waypost.snakemake import STEP_PARAM
from waypost.state import lifecycle

from . import bundles
from .rounds import StatusRounds
from .stagejobs import ask, direct_step, series_ended, stage_dir, stage_job

JOBSTEP = os.path.join(os.path.dirname(os.path.abspath(jobstep.__file__)), "jobstep.py")


class WaypostExecution(StatusRounds):
    """waypost's executor over any scheduler (its ``scheduler``, a
    ``waypost.scheduler.base.Scheduler``); a subclass adapts one scheduler's
    Snakemake executor by providing the methods of the next section."""

    # --- what the adapter provides: its scheduler, and submission there ----
    def submit_single(self, job: JobExecutorInterface) -> None:
        """Submit one job (reporting it submitted, or failed)."""
        raise NotImplementedError

    def submit_array(self, jobs: list[JobExecutorInterface]) -> None:
        """Submit jobs as one job array (only asked where ``scheduler.arrays``)."""
        raise NotImplementedError

    def bind_event_loop(self) -> None:
        """Ready the submissions' reporting for this ``run_jobs`` (the loop
        they report to, say); nothing by default."""

    def __post_init__(self, *args, **kwargs):
        super().__post_init__(*args, **kwargs)
        self._start_rounds()
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
        attempt: an array task's command may be formatted twice)."""
        path = os.path.join(self.tmpdir, f"step-{job.rule.name}-{job.jobid}-{job.attempt}.sh")
        if not os.path.exists(path):
            command = job_command(job, wspec.decode(job.params[STEP_PARAM]).mirror)
            with open(path + ".tmp", "w") as f:
                f.write(command + "\n")
            os.replace(path + ".tmp", path)
        return path

    # --- submission: grouping, adoption, no futile resubmission ----------
    def run_jobs(self, jobs: list[JobExecutorInterface]):
        self.bind_event_loop()
        ready = [job for job in jobs if self._to_submit(job)]
        for submission in grouping.plan(map(ask, ready), arrays=self.scheduler.arrays):
            if submission.kind == grouping.ARRAY:
                self.submit_array(submission.jobs)
            elif submission.kind == grouping.BUNDLE:
                self._submit_bundle(submission.jobs)
            else:
                self.submit_single(submission.jobs[0])

    def _to_submit(self, job) -> bool:
        """Is this ready job to be submitted? Not where it is adopted or
        refused (and reported so)."""
        return not (stage_job(job) and (self._adopted(job) or self._refused(job)))

    def _submit_bundle(self, members: list) -> None:
        """One scheduler job for these stage jobs (the first one's
        submission, running every one's step in turn: see ``bundles``)."""
        self._bundles[bundles.key(members[0])] = members
        for job in members[1:]:
            self.run_job_pre(job)
        self.submit_single(members[0])

    def report_job_submission(self, job_info) -> None:
        members = self._bundles.pop(bundles.key(job_info.job), None) if stage_job(job_info.job) else None
        if not members:
            return super().report_job_submission(job_info)
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
            super().report_job_error(SubmittedJobInfo(job), msg=msg, **kwargs)

    def _adopted(self, job) -> bool:
        """Is an attempt of this stage still at work in a scheduler job of
        its own (a run whose driver died, say: a login node rebooted while
        its jobs went on)? Then that job is waited for as if this run had
        submitted it, and no second one is submitted: one live attempt per
        stage directory. Its end is read from its scheduler like any job's."""
        live = lifecycle.live_attempt(stage_dir(job))
        if live is None or live.job is None:
            return False   # none; or a process the job's runner waits for
        self.run_job_pre(job)
        self.logger.info(f"waypost: {job.rule.name} {dict(job.wildcards.items())}: {self.scheduler.describe(live.job)} "
                         f"of an earlier run is still at work there ({live.where}); waiting for it instead of "
                         "submitting another")
        self.report_job_submission(SubmittedJobInfo(job, external_jobid=live.job,
                                                    aux={"waypost_adopted": True}))
        return True

    def _refused(self, job) -> bool:
        """Did the policy end this stage's series in this run? Then Snakemake's
        retry is not submitted: the job fails at once."""
        if not series_ended(job):
            return False
        self.run_job_pre(job)
        self.report_job_error(SubmittedJobInfo(job), msg="waypost: the stage's policy already ended its "
                              "series in this run (see its manifest); not submitted again")
        return True
