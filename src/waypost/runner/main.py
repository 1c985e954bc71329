"""The step runner: runs a stage's attempts and records what happened.

Every stage job runs it, with the job's step on its standard input (see
``waypost.model.spec``: one line of JSON, the step spec, then the rule's command
as Snakemake formatted it)::

    exec python -S .../waypost/runner/launch.py <<'WAYPOST_STEP_…'
    {"waypost_step": 1, "stage": …}
    the rule's command
    WAYPOST_STEP_…

It starts at every step, so it imports little (``subprocess`` and
``argparse`` only when checks or options need them) and skips the
interpreter's teardown at exit.

One invocation runs one *series* of attempts toward a finished stage:

1. A new series archives whatever an earlier one left in the stage directory
   (under ``.attempts/<n>/``, never deleted). If Snakemake is retrying the job
   after the runner itself was killed (the stage's last attempt belongs to
   this same run: ``$WAYPOST_RUN_ID``, set by Snakemake's main process), the
   series goes on where it stopped instead.
2. Parents are checked against the policy's ``depends``; a stage whose parents
   don't qualify is SKIPPED.
3. Each attempt writes its command into ``_logs/attempt-<n>.sh`` with
   Snakemake's shell prefix and suffix (``set -euo pipefail`` for bash) and
   runs that text with Snakemake's shell as its ``-c`` (from the file where
   it is too long for an argument), in its own process group with the stage's
   env, output teed to ``_logs/attempt-<n>.log`` (grown in a local scratch
   file, written whole into the stage directory: ``steplog``), under the policy's runtime
   (SIGTERM, then SIGKILL after a grace period). How it ended is classified,
   the checks run, and the policy decides: done, restart (same workspace),
   rerun (dirty/clean/new workspace) or fail.
4. ``_manifest.json`` is written last and atomically. On failure: when the
   step is ``tolerated`` (a downstream funnel accepts it) the declared outputs
   are made to exist as placeholders, an ``_unfinished`` marker newer than
   them makes the next run redo the stage, and the runner exits 0 so
   Snakemake goes on to the funnel; otherwise it exits non-zero.

The step's own exit status is kept as it was; checks never overwrite it.

Nothing in a stage directory is appended to or written in place: every
record is written whole (``writes``), so a root on a bucket mount works as
one on disk. A full, read-only or failing filesystem under one of those
writes ends the runner with one line (``writes.line``), not a traceback.

This module is the command line. The series is ``stagerun.StageRun``'s; how
it begins, ``series``; one attempt, ``stageattempt``, and its process,
``attempt``; the stage directory's records, ``stagedir``; the producers of
the inputs, ``parents``.
"""

from __future__ import annotations

import os
import sys

from waypost import stores, with_site
from waypost.model import locations, writes
from waypost.model import policy as wpolicy
from waypost.model import spec as wspec
from waypost.model.layout import stage_name
from waypost.runner.stagerun import LostJob, StageRun

# The runner's status when the filesystem failed one of its writes (sysexits' EX_IOERR).
EX_IOERR = 74


def _parser():
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m waypost.runner", usage="%(prog)s [options] < STEP",
        description="Run one stage job's step: its attempts, checks and policy, then its manifest. "
                    "The step comes on standard input (or from --spec FILE): one line of JSON, the step spec "
                    "(waypost.model.spec), then the command to its end. Snakemake's main process writes it; "
                    "see 'What the step sees' in waypost's manual (docs/reliability.md).",
        # A set width: argparse would import shutil to measure the terminal.
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=100))
    parser.add_argument("--spec", metavar="FILE", help="read the step from FILE instead of standard input")
    # Snakemake's main process records a scheduler's job of the stage that
    # ended without a runner recording it (killed pending, before or as it started).
    parser.add_argument("--lost-job", metavar="JOB", help="record how this job of the stage (a job of "
                        "--lost-scheduler's) ended; run no command")
    parser.add_argument("--lost-scheduler", metavar="NAME", help="the scheduler --lost-job's job is one of (slurm)")
    # A driver from before schedulers had names passes this spelling.
    parser.add_argument("--lost-slurm-job", metavar="JOB", help="--lost-job JOB --lost-scheduler slurm")
    parser.add_argument("--lost-state", default="CANCELLED", help="its end, as a waypost state")
    parser.add_argument("--lost-reason", default="", help="why, in the scheduler's words")
    parser.add_argument("--last-chance", action="store_true",
                        help="Snakemake will not submit the stage again this run: end its series")
    return parser


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _lost_job(options) -> LostJob | None:
    """The lost-job mode's job, if asked for; a mistake in its options is one line."""
    job, name = options.lost_job, options.lost_scheduler
    if options.lost_slurm_job:
        job, name = options.lost_slurm_job, "slurm"
    if not job:
        return None
    if not name:
        raise SystemExit("waypost.runner: --lost-job needs --lost-scheduler (the scheduler the job is one of)")
    try:
        return LostJob(job, options.lost_state, options.lost_reason, options.last_chance, scheduler=name)
    except ValueError as exc:
        raise SystemExit(f"waypost.runner: --lost-scheduler: {exc}") from None


def parse_args(argv: list[str], data: bytes | None = None) -> tuple[wspec.StepSpec, LostJob | None]:
    """The step (``data``, else from standard input, or ``--spec FILE``) and
    the lost-job mode's options. A job's runner has no options: argparse (and
    its import) is only for the executor's lost-job mode, ``--spec`` and ``--help``."""
    lost, source = None, None
    if argv:
        options = _parser().parse_args(argv)
        source = options.spec
        lost = _lost_job(options)
    if source:
        with open(source, "rb") as f:
            data = f.read()
    elif data is None:
        data = _read_all(0)
    if not data.strip():
        raise SystemExit("waypost.runner: no step on standard input (see --help)")
    try:
        return wspec.read(data), lost
    except wspec.SpecError as exc:
        raise SystemExit(f"waypost.runner: {exc}") from None


def main(argv: list[str] | None = None, data: bytes | None = None) -> int:
    step, lost = parse_args(sys.argv[1:] if argv is None else argv, data)
    if step.mounts:   # which bucket a mount serves, as the config says (stores.mounted)
        locations.declare_mounts(step.mounts)
    if step.reuse_from or stores.needs_mirror(step.stage_dir) or stores.on_a_bucket_mount(step.stage_dir):
        with_site()   # gcsfs and the rest of what they import are site-packages'
    try:
        if step.reuse_from and not lost:
            from waypost.state import reuse
            return reuse.take(step)
        return StageRun(step, lost).run()
    except wpolicy.PolicyError as exc:
        print(f"waypost: invalid policy for {step.stage}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # The one place a full (or read-only, or failing) filesystem under
        # waypost's own records becomes one line (see ``writes``).
        said = writes.line(stage_name(step.pair, step.experiment, step.stage, step.instance), exc, step.stage_dir)
        if said is None:
            raise
        print(said, file=sys.stderr)
        return EX_IOERR


def command(python: str) -> list[str]:
    """How a job starts the runner: without ``site``, which costs each step
    ~3 ms (``launch.py``); a step that needs installed packages (a bucket, a
    reuse) brings them in itself (``waypost.with_site``)."""
    return [python, "-S", os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")]


def run_and_exit(data: bytes | None = None) -> None:
    """``main()`` (the step: ``data``, else standard input; a bundle's forked
    runner gets it as ``data``), then exit with its status. A local stage leaves nothing for
    the interpreter's teardown (files closed, the manifest synced), and that
    teardown (freeing every module, a last collection) costs each step
    ~5 ms: skip it. A gs:// stage's client may still have work at exit.

    Steps run side by side write to the run's one terminal or pipe: each
    line of the runner's goes out in one write (``print`` writes its text
    and its newline apart, and another runner's line tore in between)."""
    sys.stderr.reconfigure(line_buffering=True, write_through=False)
    status = main([] if data is not None else None, data)
    if "waypost.stores.mirror" in sys.modules or "gcsfs" in sys.modules:
        sys.exit(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    run_and_exit()
