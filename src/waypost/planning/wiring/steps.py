"""The steps: how a job's rule runs its command through waypost's step
runner, which reads the job's step spec and then the command, as Snakemake
formats it, from a here-document.

A ``shell:`` rule's run function runs the step instead of the command
(``shell_run_func``, the command evaluated as the job runs: ``command_now``);
a ``script:``, ``notebook:`` or ``wrapper:`` job's script command goes
through the step (``script_run_func``, ``_step_shell``); in Snakemake's main
process a step may go to the local step server (``LocalSteps``). A job the
executor submits runs ``job_command``. (A ``run:`` block's step: ``runblocks``.)
"""

from __future__ import annotations

import contextvars
import inspect
import os
import threading

from snakemake.exceptions import WorkflowError
from snakemake.io import is_flagged

from waypost.model import spec as wspec
from waypost.planning.wiring import internals
from waypost.planning.wiring.bucket import local_files

# The step's placeholder for the job's spec line (its params, with the
# policy's restart command formatted in: ``with_restart``).
SPEC_LINE = "waypost_spec_line"


# The one name a step's run function adds to those its command sees (the
# Snakefile's globals and the rule function's arguments): its helpers.
STEP_HELPERS = "waypost_step"


class LocalSteps:
    """The steps Snakemake's main process runs itself (its local executor's
    jobs), through the local step server (``waypost.scheduler.stepserver``):
    one process forks each step's runner, instead of an interpreter started
    and the runner imported for each. ``command``: how the server starts
    (set by the Snakefile's front, which knows the runner; None: no server).
    """

    def __init__(self, workflow):
        self.workflow = workflow
        self.command: list[str] | None = None
        self._server = None   # (False: off)
        self._lock = threading.Lock()

    def serves(self, conda_env, container_img, env_modules, bench_record) -> bool:
        """Does a job the run function was called for go through the server:
        in the main process of a local run, with no conda env, container or
        environment modules (``shell`` puts those around the command) and no
        benchmark (``shell`` measures its process)?"""
        if self.command is None or conda_env or container_img or env_modules or bench_record is not None:
            return False
        workflow = self.workflow
        if internals.job_process(workflow) or not getattr(workflow, "local_exec", False):
            return False
        if self._server is None:
            from waypost.scheduler import stepserver
            with self._lock:   # (the local executor's threads ask at once)
                if self._server is None and self.command is not None:
                    self._server = stepserver.StepServer(self.command) if stepserver.wanted() else False
        return bool(self._server)

    def serve(self, step: str, threads, resources) -> bool:
        """Run the formatted step (the runner's line, the here-document, its
        end) through the server, with the environment ``shell`` gives a
        job's command (its threads for the math libraries, its ``tmpdir``).
        False: it did not take the step (run it with ``shell``). A failure
        raises ``CalledProcessError`` as ``shell`` does, for the same command."""
        from subprocess import CalledProcessError

        from snakemake.shell import shell

        from waypost.scheduler import stepserver
        found = wspec.here_document(step.encode())
        if found is None:
            return False
        env = dict(os.environ)
        for name in ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
            env[name] = str(threads)
        tmpdir = resources.get("tmpdir", None)
        if tmpdir:
            env.update(dict.fromkeys(("TMPDIR", "TMP", "TEMPDIR", "TEMP"), tmpdir))
        try:
            status = self._server.run(found[1], env)
        except stepserver.ServerGone:
            raise WorkflowError("waypost's local step server ended while this job's step ran; the job's record "
                                "says how its attempt ended (set WAYPOST_STEP_SERVER=off to run each step "
                                "alone)") from None
        if status is None:
            return False
        if status:
            executable = resources.get("shell_exec") or shell.get_executable()
            prefix, suffix = internals.shell_prefix_suffix(executable)
            ran = " ".join((prefix, step, suffix)).strip()
            try:   # (Snakemake's own ``shell`` raises it, ending as the runner did: Snakemake then
                # reports it as a failing rule's command, with no traceback, as it does ``shell``'s)
                shell(f"exit {status}" if status > 0 else f"kill -{-status} $$")
            except CalledProcessError as failed:
                failed.cmd = ran
                raise
            raise CalledProcessError(status, ran)   # (a shell whose exit did not end it)
        return True


# The step a ``script:``, ``notebook:`` or ``wrapper:`` job's run function
# puts its script's command through (``script_run_func``): the runner's
# line, the job's spec line and the local step server that may take it. Per
# thread: Snakemake runs local jobs in threads.
_SCRIPT_STEP: contextvars.ContextVar[tuple[str, str, LocalSteps] | None] = contextvars.ContextVar(
    "waypost_script_step", default=None)


def script_run_func(local_steps: LocalSteps, original, head: str, runner: str, step_param: str,
                    mirror: str | None):
    """A ``script:``, ``notebook:`` or ``wrapper:`` rule's run function
    that runs its script as the step's command: Snakemake writes the script
    out (its preamble, the job's ``snakemake`` object) and runs it with one
    ``shell`` call (``snakemake.script``'s ``_execute_cmd``); while this job
    runs, that call (``_step_shell``) runs the step runner reading the job's
    spec and that command instead, so the job gets its record, attempts and
    policy as a ``shell:`` job does. A failure names the script's command,
    as in plain Snakemake."""
    import functools
    from subprocess import CalledProcessError

    internals.route_script_shell(_step_shell)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def run(*args, **kwargs):
        bound, spec_line = job_and_spec(original, signature.bind(*args, **kwargs), step_param, mirror)
        token = _SCRIPT_STEP.set((head, spec_line, local_steps))
        try:
            return original(*bound.args, **bound.kwargs)
        except CalledProcessError as failed:
            failed.cmd = as_written(failed.cmd, runner)
            raise
        finally:
            _SCRIPT_STEP.reset(token)
    run.step_param = step_param
    return run


def _step_shell(command, *args, **kwargs):
    """``snakemake.script``'s ``shell`` while waypost records a script's
    job: the script's command (formatted as ``shell`` formats it) read by
    the step runner, in a here-document after the job's spec line: through
    the local step server where it takes the job (as a ``shell:`` job's
    step is), else with ``shell``."""
    from snakemake.shell import shell
    from snakemake.utils import format as snakemake_format
    step = _SCRIPT_STEP.get()
    if step is None:
        return shell(command, *args, **kwargs)
    head, spec_line, local_steps = step
    command = snakemake_format(command, *args, stepout=2, **kwargs)
    if wspec.DELIMITER in command:
        raise WorkflowError(f"a script's command holds {wspec.DELIMITER!r}, the line that ends waypost's "
                            "here-document around it")
    escaped = command.strip().replace("{", "{{").replace("}", "}}")
    here = f"{head}\n{{{SPEC_LINE}}}\n{escaped}\n{wspec.DELIMITER}\n"
    if local_steps.serves(kwargs.get("conda_env"), kwargs.get("container_img"), kwargs.get("env_modules"),
                          kwargs.get("bench_record")) and \
            local_steps.serve(snakemake_format(here, **{SPEC_LINE: spec_line}), kwargs.get("threads"),
                              kwargs.get("resources") or {}):
        return None
    return shell(here, **kwargs, **{SPEC_LINE: spec_line})


_step_shell.waypost = True


def job_and_spec(original, bound, step_param: str, mirror: str | None):
    """A job's arguments to its rule's run function (``bound``), with the
    params the rule gave it (its script or block sees those, not waypost's
    ``step_param``), its files' local copies on a gs:// root
    (``local_files``), and its spec line (``with_restart``)."""
    job = bound.arguments
    if mirror:
        for name in ("input", "output", "log"):
            job[name] = local_files(job[name], mirror)
    spec_line = with_restart(getattr(job["params"], step_param),
                             lambda text: fill_in(text, {**original.__globals__, **job}))
    job["params"] = internals.plain_copy(job["params"])   # (its names, not the hidden step spec: ``set_step_param``)
    return bound, spec_line


def job_command(job, mirror: str | None) -> str:
    """A stage job's step (``wire``'s runner line with the spec and the
    rule's command), formatted as Snakemake formats ``job.shellcmd``, but
    with the local copies of its files on a bucket root, and absolute paths
    for a step run in its stage directory: the command a job the executor
    submits runs."""
    run = job.rule.run_func
    step, spec_line = run.step_now(None), job.params[run.step_param]
    in_stage = runs_in_stage_dir(spec_line)
    names = {} if not (mirror or in_stage) else \
        {name: local_files(internals.plain_strings(getattr(job, name)), mirror) for name in ("input", "output", "log")}
    if in_stage:
        names = {name: absolute(files) for name, files in names.items()}
    line = with_restart(spec_line, lambda text: job.format_wildcards(text, **names))
    return job.format_wildcards(step, **names, **{SPEC_LINE: line})


def needs_own_process(job) -> bool:
    """Does a job of a rule in its own layout need a Snakemake process of
    its own on a cluster node: a conda env, container or environment
    modules in effect (that process deploys them), a benchmark (it measures
    it), ``protected()`` or ``ensure()`` outputs (it checks and marks them),
    a script (it writes the script out: ``script_run_func``)? Else the executor runs its step straight, packed or bundled as a stage
    job's, and the step runner does the rest of what that process would
    (``runner.workspace.OutputsInPlace.before_step``)."""
    methods = {getattr(method, "name", "") for method in
               getattr(job.rule.workflow.deployment_settings, "deployment_method", None) or ()}
    deployed = (("CONDA" in methods and job.conda_env_spec) or ("APPTAINER" in methods and job.container_img_url)
                or ("ENV_MODULES" in methods and job.env_modules))
    flagged = any(is_flagged(f, flag) for f in job.rule.output for flag in ("protected", "ensure"))
    return bool(deployed or job.benchmark or flagged or job.rule.shellcmd is None)


def runs_in_stage_dir(spec_line) -> bool:
    """Does the job whose step spec is ``spec_line`` run its step in its
    stage directory (its policy's ``workdir: stage``)?"""
    if not isinstance(spec_line, str) or '"workdir"' not in spec_line:
        return False
    import json
    fields = json.loads(spec_line)
    return (fields.get("policy") or {}).get("workdir") == "stage" and not fields.get("own_layout")


def absolute(files):
    """A job's files (as ``local_files`` gives them) as absolute paths: Snakemake
    formats them relative to the workflow's working directory, and a step
    run in its stage directory (``workdir: stage``) works from there."""
    from snakemake.iocontainers import Namedlist
    return Namedlist(toclone=files, custom_map=os.path.abspath)


def with_restart(line: str, fill) -> str:
    """A job's spec line (``line``) with its policy's restart command (a
    shell command, not ``same``) formatted by ``fill``, as the job's own
    command is: the same placeholders (``{input.x}``, ``{params.p}``,
    ``{wildcards.instance}``, ``{threads}``, ``{resources.mem_mb}``,
    ``{log}``), at the same time. A placeholder the job doesn't have is one
    line naming the stage and ``policy.restart``."""
    if '"restart":' not in line:   # (most policies have none: no JSON read)
        return line
    import json
    fields = json.loads(line)
    restart = (fields.get("policy") or {}).get("restart")
    if not isinstance(restart, str) or restart == "same":
        return line
    try:
        command = fill(restart)
    except Exception as exc:   # what formatting raises: NameError, AttributeError, KeyError, IndexError, ...
        cause = exc.__cause__ or exc
        why = str(cause).split("\n")[0] or cause.__class__.__name__
        raise WorkflowError(f"stage {fields.get('stage')}: policy.restart: {restart!r}: {why} (a restart "
                            "command has the job's placeholders: {input}, {output}, {params}, {wildcards}, "
                            "{threads}, {resources}, {log})") from None
    return wspec.extend(line, {"restart_command": command})


def fill_in(text: str, namespace: dict) -> str:
    """``text`` formatted as Snakemake's ``shell`` formats a command, with
    ``namespace`` (a rule function's arguments)."""
    from snakemake.utils import QuotedFormatter, SequenceFormatter
    formatter = SequenceFormatter(separator=" ", element_formatter=QuotedFormatter())
    return formatter.format(text, **namespace)


def runner_head(runner_line: str) -> str:
    """The step's first line: the runner, reading its here-document."""
    return f"exec {runner_line} <<'{wspec.DELIMITER}'"


def as_written(ran: str, runner: str) -> str:
    """A step's command as Snakemake's ``shell`` ran it (its prefix, the
    step runner ``runner`` reading its here-document, its suffix) with the
    here-document replaced by the rule's command it carries: what plain
    Snakemake runs for the rule, and says it ran when it fails."""
    head, last = runner_head(runner) + "\n", f"\n{wspec.DELIMITER}"
    start, end = ran.find(head), ran.rfind(last)
    after = ran[end + len(last):]   # the suffix, after the line that ends the here-document
    if start < 0 or end < start or after[:1] not in ("", "\n"):
        return ran
    _, _, command = ran[start + len(head):end].partition("\n")   # (after the spec's line)
    return (ran[:start] + command + after[1:]).strip()


def shell_run_func(snake, original, head: str, runner: str, mirror: str | None, step_param: str,
                   basedir: str):
    """A rule's run function that runs the step (``head``, the runner line
    reading its here-document: the job's spec and the rule's command as its
    function gives it then, ``command_now``; kept as its ``step_now``)
    instead of the shell command it was written with (Snakemake compiles a
    ``shell:`` into a function calling ``shell(...)``, which fills the
    command's placeholders from that function's globals, the Snakefile's,
    and its own arguments: the new one has the same globals and takes the
    same arguments, the marker of a rule's function included, so ``shell``
    takes the job's threads, resources and environment from them as for any
    rule). Its own helpers come in one closure variable, ``STEP_HELPERS``:
    nothing of waypost's shadows a Snakefile's name. On a bucket root its
    files are their local copies first (``local_files``); for a step run in
    its stage directory, absolute paths.

    A failure reads as in plain Snakemake: the ``CalledProcessError`` names
    the rule's command as it ran (``as_written``), not the runner, and the
    call is where the rule's own was, in its Snakefile (``_shell_call``), so
    Snakemake reports it as a failing rule's command, with no traceback."""
    import types
    from subprocess import CalledProcessError

    from snakemake.shell import shell
    parameters = inspect.signature(original).parameters
    h = STEP_HELPERS
    lines = [f"def {STEP_HELPERS}_of({h}):",
             f"  def run({', '.join(str(p) for p in parameters.values())}):"]
    if mirror:
        lines.append(f"    input, output, log = {h}.local_files(input, {h}.mirror), "
                     f"{h}.local_files(output, {h}.mirror), {h}.local_files(log, {h}.mirror)")
    lines += [f"    if {h}.runs_in_stage_dir(getattr(params, {h}.step_param, None)):",
              f"        input, output, log = {h}.absolute(input), {h}.absolute(output), {h}.absolute(log)"]
    # (the restart command is formatted with the names the command has: the
    # Snakefile's globals, then this function's arguments)
    # (no local name of its own: ``shell`` formats the command with them)
    arguments = ", ".join(f"{name}={name}" for name in parameters)
    spec_line = (f"{SPEC_LINE}={h}.with_restart(params.{step_param}, "
                 f"lambda text, job={{**globals(), **locals()}}: {h}.fill_in(text, job))")
    # (through the local step server where it takes the job: the step as
    # ``shell`` would format it, from this function's names; else ``shell``)
    served = (f"{h}.serves(conda_env, container_img, env_modules, bench_record) and "
              f"{h}.serve({h}.format({h}.step_now(dict({arguments})), {spec_line}), threads, resources)")
    call = (f"        {served} or {h}.shell({h}.step_now(dict({arguments})), bench_record=bench_record, "
            f"bench_iteration=bench_iteration, {spec_line})")
    lines += ["    try:", call, f"    except {h}.CalledProcessError as failed:",
              f"        failed.cmd = {h}.as_written(failed.cmd, {h}.runner)", "        raise",
              "  return run"]
    filename, line = _shell_call(original)
    padding = line - 1 - lines.index(call) if line else -1   # blank lines put the call on ``line``
    if padding < 0:
        filename, padding = f"<waypost step of {original.__name__}>", 0
    def step_now(arguments: dict | None) -> str:
        """The step, with the rule's command as its function gives it when
        the job runs (``command_now``; None: without the job's arguments)."""
        command = command_now(original, arguments, basedir)
        if wspec.DELIMITER in command:
            raise WorkflowError(f"rule {original.__name__.removeprefix('__rule_')}: its shell command holds {wspec.DELIMITER!r}, the "
                                "line that ends waypost's here-document around it")
        return f"{head}\n{{{SPEC_LINE}}}\n{command.strip()}\n{wspec.DELIMITER}\n"

    from snakemake.utils import format as snakemake_format
    helpers = types.SimpleNamespace(
        shell=shell, step_now=step_now, runner=runner, as_written=as_written, CalledProcessError=CalledProcessError,
        serves=snake.local_steps.serves, serve=snake.local_steps.serve, format=snakemake_format,
        local_files=local_files, mirror=mirror, runs_in_stage_dir=runs_in_stage_dir, absolute=absolute,
        step_param=step_param, with_restart=with_restart, fill_in=fill_in)
    module = compile("\n" * padding + "\n".join(lines) + "\n", filename, "exec")
    # The rule's own globals: the Snakefile's namespace, as it is when the job runs.
    (code,) = (c for c in module.co_consts if isinstance(c, types.CodeType))
    run = types.FunctionType(code, original.__globals__)(helpers)
    run.step_now = step_now
    run.step_param = step_param
    return run


class _Globals(dict):
    """A rule function's globals with some names of its own over them."""

    def __init__(self, own: dict, under: dict):
        super().__init__(own)
        self.under = under

    def __missing__(self, name):
        return self.under[name]


# The directory of the rule whose command ``command_now`` evaluates (per thread:
# Snakemake runs local jobs in threads).
_EVALUATING_IN: contextvars.ContextVar[str | None] = contextvars.ContextVar("waypost_evaluating_in", default=None)


def evaluating_in() -> str | None:
    """The directory of the rule whose command ``command_now`` is evaluating
    in this thread (None: none is)."""
    return _EVALUATING_IN.get()


def command_now(function, arguments: dict | None, basedir: str) -> str:
    """The command a ``shell:`` rule's function (as Snakemake compiled it)
    gives ``shell`` when it runs, before ``shell`` formats it: its
    expression is evaluated then, in the Snakefile's namespace as it is
    (a rule made in a loop whose command is an f-string of the loop's
    variable runs the command of the variable's last value, as in plain
    Snakemake; ``rule.shellcmd`` is the one it had when the rule was made).
    ``arguments``: the job's arguments to the function (None: none)."""
    import types
    given: list[str] = []
    names = _Globals({"shell": lambda command, *args, **kwargs: given.append(command)}, function.__globals__)
    token = _EVALUATING_IN.set(basedir)   # (``Pipeline.script`` in a command: from the rule's directory)
    try:
        types.FunctionType(function.__code__, names, function.__name__, function.__defaults__,
                           function.__closure__)(**(arguments or dict.fromkeys(_parameters(function))))
    finally:
        _EVALUATING_IN.reset(token)
    return given[0]


def _parameters(function) -> list[str]:
    return [name for name, p in inspect.signature(function).parameters.items() if p.default is p.empty]


def _shell_call(function) -> tuple[str, int | None]:
    """The file and line of a rule function's ``shell(...)`` call, in the
    code Snakemake compiled the Snakefile into (None if it has none): a
    failure there is the rule's (Snakemake finds the Snakefile's line for it)."""
    import dis
    for instruction in dis.get_instructions(function):
        if instruction.opname == "LOAD_GLOBAL" and instruction.argval == "shell" and instruction.positions:
            return function.__code__.co_filename, instruction.positions.lineno
    return function.__code__.co_filename, None
