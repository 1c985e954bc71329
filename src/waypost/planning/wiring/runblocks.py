"""A ``run:`` block's step: the step runner, reading the job's spec, runs
the block in a fork of the job's own Snakemake process, or in a Snakemake
process of its own for the one job (``_this_job_again``), so that a ``run:``
job gets its record, attempts and policy as a ``shell:`` job does.
"""

from __future__ import annotations

import inspect
import os

from waypost.model import spec as wspec
from waypost.planning.wiring.bucket import local_files
from waypost.planning.wiring.steps import SPEC_LINE, job_and_spec

RUN_BLOCK_ENV = wspec.RUN_BLOCK_ENV


def run_block_func(snake, original, name: str, head: str, runner: str, step_param: str,
                   mirror: str | None):
    """A ``run:`` rule's run function. Snakemake runs a ``run:`` job's block
    in a Snakemake process of the job's own (locally, a subprocess it
    spawns; on a cluster, the job's process on its node). There this
    function runs the step, so the job gets its record, attempts and policy
    as a ``shell:`` job does: the step runner, reading the job's spec,
    forked from this process (``snake.run_here``), its attempts each calling
    the block in a fork of it (``_block_call``). The step's command (its
    attempt's ``.sh``) is this same process's command for this one job
    (``_this_job_again``), marked with ``RUN_BLOCK_ENV``: the block run by
    hand, and how it runs where a fork can't (no ``run_here``,
    ``WAYPOST_STEP_SERVER=off``, a ``benchmark:``), at the cost of one more
    Snakemake process. In the run's main process (``--force-use-threads``;
    said at the start) the block runs as in plain Snakemake."""
    import functools
    from subprocess import CalledProcessError

    from snakemake.shell import shell

    from waypost.scheduler import stepserver
    signature = inspect.signature(original)
    # A failure is raised through a frame at the rule's line in its Snakefile:
    # Snakemake reports it as the rule's, with no traceback.
    filename, line = original.__code__.co_filename, original.__code__.co_firstlineno
    namespace: dict = {}
    for source in ("def at_the_rule(call): return call()", "def fail_at_the_rule(error): raise error"):
        exec(compile("\n" * (line - 1) + source, filename, "exec"), namespace)
    failed_block = (f"the run: block of rule {name} (its error is above, and in the attempt's log in the "
                    "job's record)")

    @functools.wraps(original)
    def run(*args, **kwargs):
        bound, spec_line = job_and_spec(original, signature.bind(*args, **kwargs), step_param, mirror)
        job = bound.arguments
        if not _in_job_process():
            return original(*bound.args, **bound.kwargs)
        command = _this_job_again(name, dict(job["wildcards"].items()))
        if snake.run_here is not None and job.get("bench_record") is None and stepserver.wanted():
            status = snake.run_here(f"{spec_line}\n{command}\n".encode(),
                                    _block_call(original, bound, snake.workflow.linemaps), dict(os.environ))
            if status:
                namespace["fail_at_the_rule"](CalledProcessError(status, failed_block))
            return
        command = command.replace("{", "{{").replace("}", "}}")
        try:
            namespace["at_the_rule"](lambda: shell(f"{head}\n{{{SPEC_LINE}}}\n{command}\n{wspec.DELIMITER}\n",
                                                   bench_record=job.get("bench_record"), **{SPEC_LINE: spec_line}))
        except CalledProcessError as failure:
            failure.cmd = failed_block
            raise
    run.step_param = step_param
    return run


def on_local_copies(original, mirror: str):
    """A rule's run function that gets its job's files' local copies
    (``local_files``): a ``run:`` block's, in the process the step runs it in."""
    import functools
    signature = inspect.signature(original)

    @functools.wraps(original)
    def run(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        for name in ("input", "output", "log"):
            bound.arguments[name] = local_files(bound.arguments[name], mirror)
        return original(*bound.args, **bound.kwargs)
    return run


def _block_call(original, bound, linemaps):
    """What an attempt of a ``run:`` job calls in its step's process (a fork
    of the job's own Snakemake process): the block, then its exit status.
    An error in it is written as Snakemake writes a failing block's (the
    error, the file and line in the Snakefile, and where it came from), with
    status 1; ``sys.exit(N)`` is status N."""
    import sys

    def call() -> int:
        from snakemake.exceptions import format_error, get_exception_origin
        try:
            original(*bound.args, **bound.kwargs)
        except SystemExit as exc:
            if isinstance(exc.code, int) or exc.code is None:
                return exc.code or 0
            print(exc.code, file=sys.stderr)
            return 1
        except BaseException as exc:   # (the block's error, whatever it is: said as Snakemake says it)
            exc.__traceback__ = exc.__traceback__.tb_next   # (from the block on, not this function)
            origin = get_exception_origin(exc, linemaps)
            lineno, file = origin if origin is not None else (None, None)
            said = format_error(exc, lineno, linemaps=linemaps, snakefile=file, show_traceback=True)
            sys.stderr.write(f"RuleException:\n{said}\n")
            return 1
        return 0
    return call


def running_the_block(rule: str) -> bool:
    """Is this the Snakemake process the step runner runs a job of ``rule``
    (a ``run:`` rule) in (``_this_job_again``)?"""
    import json
    return os.environ.get(RUN_BLOCK_ENV) == json.dumps(rule)


def _in_job_process() -> bool:
    """Is this Snakemake process one job's own (``--mode subprocess`` or
    ``remote``: what ``_this_job_again`` can run again for one job)?"""
    import sys
    argv = sys.orig_argv
    mode = argv[argv.index("--mode") + 1:][:1] if "--mode" in argv else []
    return mode in (["subprocess"], ["remote"]) and "--target-jobs" in argv


def _this_job_again(rule: str, wildcards: dict) -> str:
    """The command line of this Snakemake process (one job's own:
    ``_in_job_process``) for one job of it, ``rule`` with ``wildcards``, as
    a subprocess whose ``RUN_BLOCK_ENV`` names the rule: the process the
    step runner runs a ``run:`` job's block in."""
    import json
    import shlex
    import sys

    from snakemake_interface_executor_plugins.utils import TargetSpec, encode_target_jobs_cli_args
    argv, again = list(sys.orig_argv), []
    skipping = False
    for arg in argv:
        if skipping and not arg.startswith("--"):
            continue
        skipping = arg in ("--target-jobs", "--mode")
        if arg == "--target-jobs":
            again += [arg, *encode_target_jobs_cli_args([TargetSpec(rule, wildcards)])]
        elif arg == "--mode":
            again += [arg, "subprocess"]
        else:
            again.append(arg)
    if "--force-use-threads" not in again:
        again.append("--force-use-threads")
    return f"{RUN_BLOCK_ENV}={shlex.quote(json.dumps(rule))} {shlex.join(again)}"
