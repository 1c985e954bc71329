"""waypost's Slurm executor for Snakemake: snakemake-executor-plugin-slurm's
submission under waypost's executor behaviour.

What waypost's executor does is the same on any scheduler, and lives in
``execution`` (``WaypostExecution``) and ``rounds``:

- **The step runner straight in the job.** A stage job's step is complete
  in Snakemake's main process (``waypost.planning.wiring.steps.job_command``:
  the step runner's line with the step spec and the rule's command), so it
  is written to a step file in the executor's temporary directory (under
  ``.snakemake``, shared with the nodes, removed when the run ends) and the
  job runs it directly (``waypost/scheduler/jobstep.py``) instead of a
  second Snakemake that re-parses the workflow to run one command. Other
  jobs go the plugin's way.
- **Packing.** A worker class with ``pack: N`` in workers.yaml submits up to
  N ready jobs of one rule with the same request as one job array (here the
  Slurm plugin's arrays; each task its own allocation of the class's size,
  no memory added). Each task is its own stage: its own manifest, attempts
  and policy; a task the scheduler ends is retried alone.
- **Bundles.** A worker class with ``bundle: N`` runs up to N ready jobs of
  one rule with the same request in one job, one after another, each its
  own stage with its own runner (``bundles``): short stages stop paying a
  scheduler job each. (Which jobs share a submission:
  ``waypost.scheduler.grouping``.)
- **One check per status round** (``scheduler.check``: for Slurm one sacct
  query, and squeue's word on pending jobs' reasons; ``rounds``).
- **Every end reaches the manifest**, through the runner's ``--lost-job``
  mode where no runner recorded it (``rounds``).
- **No futile resubmission.** A stage whose series the policy ended in this
  run is not submitted again by Snakemake's retries: its job fails at once.
- **A dead driver's jobs are adopted.** A stage whose attempt is still at
  work in a scheduler job (its ``_running.json`` names the job, and the
  scheduler says it pends or runs, or can't say yet) is not submitted again:
  that job is waited for as if this run had submitted it
  (``waypost.state.lifecycle``).

This module is the Slurm adapter: ``waypost.scheduler.slurm.SLURM`` and the
Slurm plugin's submission (its private members, in ``slurm_private``).
Select it with ``executor: waypost`` (the profiles do); its options are the
Slurm plugin's, spelled ``--waypost-...``.
"""

from __future__ import annotations

import sys

from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings, common_settings  # noqa: F401  (re-exported)

from waypost.scheduler.slurm import SLURM

from . import slurm_private
from .execution import WaypostExecution


class Executor(WaypostExecution, SlurmExecutor):
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

    def submit_single(self, job) -> None:
        slurm_private.submit_job(self, job)

    def submit_array(self, jobs: list) -> None:
        slurm_private.submit_array(self, jobs)

    def bind_event_loop(self) -> None:
        slurm_private.bind_event_loop(self)

    def initial_status_wait(self) -> float:
        return self.workflow.executor_settings.init_seconds_before_status_checks

    def job_log(self, job_info):
        return (job_info.aux or {}).get("slurm_logfile")

    def keeps_successful_logs(self) -> bool:
        return self.workflow.executor_settings.keep_successful_logs
