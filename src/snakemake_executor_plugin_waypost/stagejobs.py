"""Which of Snakemake's jobs are waypost's stage jobs, and what the
executor reads of one: how it may share a submission, its stage directory,
whether its series already ended."""

from __future__ import annotations

import os

from waypost import stores
from waypost.model import manifest
from waypost.model import spec as wspec
from waypost.planning.wiring.steps import needs_own_process
from waypost.scheduler import grouping
from waypost.snakemake import STEP_PARAM
from waypost.state import lifecycle


def stage_job(job) -> bool:
    """Is this a waypost stage job (its rule wired by ``wp.finish()``)?"""
    return not job.is_group() and STEP_PARAM in job.rule.params._names


def direct_step(job) -> bool:
    """Does the job's scheduler job run its step straight (or packed, or in
    a bundle), without a Snakemake process of its own? A stage job's does,
    and so does a rule's in its own layout unless it needs one
    (``needs_own_process``: ``conda:`` in effect, a benchmark...): then it
    runs as plain Snakemake runs it, its step runner inside."""
    return stage_job(job) and ('"own_layout":true' not in job.params[STEP_PARAM] or not needs_own_process(job))


def ask(job) -> grouping.Ask:
    """How a ready job may share a submission: its class's ``pack`` and
    ``bundle`` (workers.yaml), with jobs of its rule and request."""
    if not direct_step(job):
        return grouping.Ask(job, None)
    request = tuple(sorted((k, str(v)) for k, v in job.resources.items() if not k.startswith("_")))
    return grouping.Ask(job, (job.rule.name, request), int(job.resources.get("waypost_pack", 1) or 1),
                        int(job.resources.get("waypost_bundle", 1) or 1))


def series_ended(job) -> bool:
    """Did the policy end this stage's series in this run (its manifest,
    written by this run, is not SUCCESS, and no attempt goes on)?"""
    if job.attempt <= 1:
        return False
    directory = stage_dir(job)
    if directory is None or stores.needs_mirror(directory):
        return False           # the runner says so in the job (one listing is not worth it here)
    return lifecycle.at(directory).ended_in_run(os.environ.get(manifest.RUN_ID_ENV))


def stage_dir(job) -> str:
    return wspec.decode(job.params[STEP_PARAM]).stage_dir
