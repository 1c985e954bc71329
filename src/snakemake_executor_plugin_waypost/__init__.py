"""waypost's Slurm executor for Snakemake: snakemake-executor-plugin-slurm,
plus the two end states it otherwise waits on forever.

With a real cluster, the Slurm plugin (2.8) never sees a job cancelled from
outside as failed (sacct prints ``CANCELLED by 0``, not in its list) and
leaves a ``PREEMPTED`` job "to Slurm to resume" even when the partition's
PreemptMode cancels it: Snakemake then polls forever. This executor asks
sacct about the active jobs first and reports those two as errors, so
Snakemake fails them (and retries them if told to); everything else is the
Slurm plugin's own logic. Select it with ``executor: waypost`` (the
profiles do); its options are the Slurm plugin's, spelled ``--waypost-...``.
"""

from __future__ import annotations

from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings, common_settings  # noqa: F401  (re-exported)

from waypost import slurm as wslurm


class Executor(SlurmExecutor):
    async def check_active_jobs(self, active_jobs):
        caught = set()
        if active_jobs:
            # Preempted jobs come back by themselves only where Slurm requeues them.
            watch = {"CANCELLED"} if self.workflow.executor_settings.requeue else {"CANCELLED", "PREEMPTED"}
            states = wslurm.sacct_states([str(j.external_jobid) for j in active_jobs])
            for job in active_jobs:
                state = states.get(str(job.external_jobid))
                if state in watch:
                    caught.add(job.external_jobid)
                    log = job.aux.get("slurm_logfile")
                    self.report_job_error(
                        job, msg=f"SLURM-job '{job.external_jobid}' ended {state} (seen by waypost's executor)",
                        aux_logs=[str(log)] if log else [])
        rest = [job for job in active_jobs if job.external_jobid not in caught]
        async for job in super().check_active_jobs(rest):
            yield job
