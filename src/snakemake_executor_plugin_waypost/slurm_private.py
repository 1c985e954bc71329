"""The Slurm executor plugin's private parts that waypost's executor uses,
in one place, with the plugin versions they were tested on.

waypost's executor subclasses snakemake-executor-plugin-slurm and drives
three of its private members: ``_submit_job`` (one job), ``_submit_array_jobs``
(packed stages as one job array) and ``_main_event_loop`` (the loop its
submissions report to). The array's per-task payload
(``--slurm-jobstep-array-execs=``) is decoded by ``waypost.scheduler.jobstep``
in the job (stdlib only, so not from here; the same versions apply).
A plugin of another version may have changed any of them: ``check()``
stops the executor at its start with one line that says so.
"""

from __future__ import annotations

from importlib import metadata

PLUGIN = "snakemake-executor-plugin-slurm"
#: plugin versions (major.minor) these calls were tested on
TESTED = ("2.8",)


class UntestedPlugin(Exception):
    """The installed Slurm executor plugin is not a version tested here."""


def check(installed: str | None = None) -> None:
    """Raise ``UntestedPlugin`` (one line) unless the installed plugin's
    version is one ``TESTED``."""
    version = installed if installed is not None else metadata.version(PLUGIN)
    if ".".join(version.split(".")[:2]) not in TESTED:
        raise UntestedPlugin(
            f"waypost's executor uses private parts of {PLUGIN}, tested on {', '.join(v + '.x' for v in TESTED)}; "
            f"{version} is installed: install a tested one (pip install '{PLUGIN}=={TESTED[-1]}.*')")


def submit_job(executor, job) -> None:
    executor._submit_job(job)


def submit_array(executor, jobs: list) -> None:
    executor._submit_array_jobs(jobs)


def bind_event_loop(executor) -> None:
    """As the plugin does in ``run_jobs``: its submissions report to the
    running loop."""
    import asyncio
    if executor._main_event_loop is None:
        try:
            executor._main_event_loop = asyncio.get_running_loop()
        except RuntimeError:
            executor._main_event_loop = None
