"""Bundles: several short stages in one Slurm job.

A worker class with ``bundle: N`` in workers.yaml has up to N ready jobs of
one rule with the same request run in one Slurm job, one after another,
each with its own step runner (its own attempts, manifest and policy): a
stage that takes a fraction of a second no longer pays a Slurm job of its
own (the scheduler's start, the step daemon, the accounting). The job's time
limit is N times the class's runtime; each stage's runner keeps its own.

The first job of a bundle (its *leader*) is submitted as any job, with a
command that runs the bundle's list (``waypost/runner/launch.py --bundle LIST``: ``waypost.runner.bundle``);
the others are reported submitted with the same Slurm job id. Each stage's
end is its own: the bundle writes the exit status of each stage's step to
its status file as the step ends, and the executor reads these, so a stage
done early lets its dependents go on while the rest of the bundle runs. A
stage whose step never ran (the job cancelled, ended at its time limit or
with its node) ends as Slurm says the job ended, recorded in its manifest
like any job's lost end.
"""

from __future__ import annotations

import os

STATUS_KEY = "waypost_status_file"   # a bundled job's SubmittedJobInfo.aux: its status file


def key(job) -> tuple[int, int]:
    return job.jobid, job.attempt


def write_list(path: str, entries: list[tuple[str, str]]) -> None:
    """The bundle's list: one ``STEP_FILE<TAB>STATUS_FILE`` line per stage,
    run in this order. Stale status files (an earlier attempt's) go first."""
    for _, status in entries:
        if os.path.exists(status):
            os.unlink(status)
    with open(path + ".tmp", "w") as f:
        f.write("".join(f"{step}\t{status}\n" for step, status in entries))
    os.replace(path + ".tmp", path)


def status_of(path: str) -> int | None:
    """A bundled stage's step's exit status, once it ended (None before)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None
