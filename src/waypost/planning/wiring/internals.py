"""Every private part of Snakemake that waypost touches, and every global of
Snakemake it replaces, each behind a function named for what waypost does
with it, with the Snakemake versions they were tested on (``TESTED``).

Snakemake of another version may have changed any of them: ``check()``
says so in one line as a Snakefile loads waypost (``Snake``). No other
module of waypost reads a private member of another object or assigns to
an attribute of one of Snakemake's classes (``tests/test_module_boundaries.py``).

Private members and globals, here:
- ``shell._get_process_prefix(executable)``, ``shell._process_suffix``: the
  prefix and suffix ``shell.prefix()``/``shell.suffix()`` set (no public
  getter), which the step runner puts around a step's command
  (``shell_prefix_suffix``);
- ``Namedlist._names`` and ``_set_name`` (a rule's inputs' and params'
  names; a params function replaced), ``_clone`` and ``_plainstrings``
  (``names_of``, ``set_name``, ``plain_copy``, ``plain_strings``);
- ``Rule._input`` (``clear_inputs``), ``Rule._restart_times`` (the rule's
  own ``retries:``, ``own_retries``), ``Resources._data`` (a rule's
  resources by name, ``resource_entries``);
- ``workflow.resource_settings._parsed_overwrite_resources`` (``--set-resources``
  keeps the last word) and ``_parsed_default_resources``
  (``overwritten_resources``, ``default_resources``);
- ``Workflow._build_dag`` (``before_each_dag``, ``after_planning``) and
  ``Workflow._persistence`` (``persistence_of``); the persistence's
  ``params_changed``, ``input_changed``, ``code_changed`` and
  ``software_stack_changed`` (``quiet_persistence_triggers``), its
  ``incomplete(job)`` (async; what ``rerun-incomplete`` forces), ``_get_key``
  and ``_get_recorded_starttime`` (``filter_incomplete``, ``incomplete_marked_at``),
  its ``_serialize_param`` (``param_serializer``);
- ``Job._path_to_source_file``, with ``Job._params`` set to the params
  being expanded (``script_path_of``); ``Job.outputs_older_than_script_or_notebook``,
  the code trigger for a script (``quiet_script_dates``);
- ``JobScheduler._handle_error`` (a failed job, under the scheduler's
  lock) and its ``_user_kill`` (``"graceful"``: what ``exit_gracefully``
  sets) (``on_failed_job``, ``stop_gracefully``);
- ``Checkpoint.get``, wrapped on a gs:// root (``after_checkpoint_get``);
- ``snakemake.script.shell``, the one ``shell`` call that runs a
  ``script:``, ``notebook:`` or ``wrapper:`` job's script
  (``ScriptBase._execute_cmd``) (``route_script_shell``);
- ``_IOFile._file`` (a rule's file given another storage object: ``replace_file``);
- ``Workflow.check`` and ``Workflow.rule`` (the rule decorator), replaced
  on the workflow (``after_reading``, ``note_rule_names``).

Public but undocumented parts, used where they are in the adapter's modules
(``waypost.planning.wiring``):
- ``Rule.expand_input``, ``expand_output``, ``expand_params`` /
  ``expand_resources`` / ``expand_priority`` (given a job's inputs),
  wrapped per rule; ``Rule.set_params``, ``set_input``, ``dependencies``,
  ``input_modifier`` / ``output_modifier`` / ``log_modifier`` /
  ``benchmark_modifier`` (their ``modify``), ``expand_conda_env`` /
  ``expand_container_img`` / ``env_modules``: ``rules``, ``triggers``, ``bucket``;
- ``Rule.run_func`` and the ``RULEFUNC_CONTEXT_MARKER`` parameter of a
  rule's run function; ``snakemake.utils.SequenceFormatter`` and
  ``QuotedFormatter`` (how ``shell`` formats a command); what ``shell``
  gives a job's command besides it (the threads variables, ``TMPDIR``
  and its aliases from ``resources.tmpdir``); ``workflow.local_exec``: ``steps``;
- how Snakemake reports a rule's failure (``executors/local.py``,
  ``exceptions.get_exception_origin``, ``format_error``, ``cut_traceback``,
  ``workflow.linemaps``): ``steps``, ``runblocks``;
- ``workflow.dag.forcefiles``, ``workflow.dag_settings``,
  ``workflow.executor_plugin``'s ``common_settings``, ``OutputIndex``,
  checkpoints (``workflow.globals["checkpoints"]``, ``Rule.is_checkpoint``,
  ``IncompleteCheckpointException.targetfile``): ``snake``, ``rules``;
- ``Rule.is_producer`` and ``Rule.get_wildcards`` (how the DAG finds a
  file's producer): ``jobfiles``;
- on a gs:// root, a file's storage object (``flags["storage_object"]``,
  its ``query``, ``retrieve`` and ``keep_local``): ``bucket``.
"""

from __future__ import annotations

from importlib import metadata

from waypost.model.errors import WaypostError

#: Snakemake versions (major.minor) these parts were tested on
TESTED = ("9.27",)


class UntestedSnakemake(WaypostError):
    """The installed Snakemake is not a version tested here."""


def check(installed: str | None = None) -> None:
    """Raise ``UntestedSnakemake`` (one line) unless the installed
    Snakemake's version is one ``TESTED``."""
    version = installed if installed is not None else metadata.version("snakemake")
    if ".".join(version.split(".")[:2]) not in TESTED:
        raise UntestedSnakemake(
            f"waypost uses private parts of Snakemake, tested on {', '.join(v + '.x' for v in TESTED)}; "
            f"snakemake {version} is installed: install a tested one (pip install 'snakemake=={TESTED[-1]}.*')")


# --- the run's process ----------------------------------------------------------------
def job_process(workflow) -> bool:
    """Is this Snakemake process one job's own (on a cluster node, or a
    job's subprocess), rather than the run's main process?"""
    return getattr(workflow, "remote_exec", False) or getattr(workflow, "subprocess_exec", False)


def after_reading(workflow, call) -> None:
    """Have ``call()`` asked once Snakemake has read the whole Snakefile
    (its ``Workflow.check``, before any job is planned)."""
    check = workflow.check

    def checked():
        call()
        return check()
    workflow.check = checked


def after_planning(workflow, call) -> None:
    """Have ``call()`` asked once Snakemake has built its DAG of jobs
    (``Workflow._build_dag``), before any job runs."""
    build = workflow._build_dag

    def built(*args, **kwargs):
        result = build(*args, **kwargs)
        call()
        return result
    workflow._build_dag = built


def before_each_dag(workflow, call) -> None:
    """Have ``call()`` asked each time Snakemake is about to build a DAG
    (``Workflow._build_dag``)."""
    build = workflow._build_dag

    def built(*args, **kwargs):
        call()
        return build(*args, **kwargs)
    workflow._build_dag = built


def note_rule_names(workflow, note) -> None:
    """Have ``note(name)`` told which rule Snakemake is defining, and
    ``note(None)`` once it is defined: Snakemake evaluates a rule's
    ``@workflow.rule(name=...)`` decorator before its input, output and
    params, and ``decorate`` after them."""
    define = workflow.rule

    def rule(*args, **kwargs):
        name = kwargs.get("name", args[0] if args else None)
        decorate = define(*args, **kwargs)
        note(name)

        def defined(ruleinfo):
            try:
                return decorate(ruleinfo)
            finally:
                note(None)
        return defined
    workflow.rule = rule


# --- shell ----------------------------------------------------------------------------------
def shell_prefix_suffix(executable: str) -> tuple[str, str]:
    """The prefix (``set -euo pipefail; `` for bash, or ``shell.prefix()``'s)
    and suffix ``shell`` puts around a command run with ``executable``."""
    from snakemake.shell import shell
    return shell._get_process_prefix(executable), shell._process_suffix


def route_script_shell(replacement) -> None:
    """Have ``snakemake.script`` run a script's command through
    ``replacement`` (marked ``waypost``) instead of ``shell``; once per process."""
    import snakemake.script
    if not getattr(snakemake.script.shell, "waypost", False):
        snakemake.script.shell = replacement


# --- rules, their files, params and resources ---------------------------------------------------
def names_of(namedlist) -> dict:
    """A Namedlist's names (name → (start, end)), itself: a change to it is the list's."""
    return namedlist._names


def set_name(namedlist, name: str, index: int) -> None:
    """Name an item of a Namedlist (an attribute too)."""
    namedlist._set_name(name, index)


def plain_copy(namedlist):
    """A Namedlist's copy, with its names (not the attributes set beside them)."""
    return namedlist._clone()


def plain_strings(files):
    """A job's files as plain strings, with their names."""
    return files._plainstrings()


def clear_inputs(rule) -> None:
    """Take every input of a rule (and what they depend on) out, for
    ``set_input`` to give it new ones; a rule that had none gets an input
    path modifier of its own (its outputs')."""
    from snakemake.iocontainers import InputFiles
    rule._input = InputFiles()
    rule.dependencies = {}
    if getattr(rule, "input_modifier", None) is None:
        rule.input_modifier = rule.output_modifier


def replace_file(path, change) -> None:
    """Give a rule's file (an ``_IOFile``) the annotated string ``change`` makes of its own."""
    path._file = change(path._file)


def own_retries(rule) -> int | None:
    """The rule's own ``retries:`` (None where it names none)."""
    return rule._restart_times


def resource_entries(resources) -> dict:
    """A rule's (or the defaults') resources by name, the dict itself."""
    return resources._data


def overwritten_resources(workflow, rule: str) -> dict:
    """What ``--set-resources`` says of a rule's resources."""
    return workflow.resource_settings._parsed_overwrite_resources.get(rule, {})


def default_resources(workflow):
    """The run's default resources (``--default-resources`` and Snakemake's own)."""
    return workflow.resource_settings._parsed_default_resources


# --- the persistence in .snakemake/ and the rerun triggers -----------------------------------------
def persistence_of(workflow):
    """The run's persistence (None before Snakemake made it)."""
    return getattr(workflow, "_persistence", None)


def param_serializer(workflow):
    """How Snakemake's metadata serializes a param (None: no persistence at hand)."""
    persistence = persistence_of(workflow)
    return persistence._serialize_param if persistence is not None else None


def script_path_of(job, params, path):
    """A job's script (or notebook) as Snakemake finds it, its path
    formatted with ``params`` (the job's, being expanded: asking the job for
    them then would expand them again)."""
    held = job._params
    job._params = params if held is None else held
    try:
        return job._path_to_source_file(path)
    finally:
        job._params = held


def quiet_persistence_triggers(persistence, files_decide) -> None:
    """The persistence's trigger checks (params, input set, code, software
    environment) saying nothing of a job ``files_decide`` names. Once per
    persistence."""
    from snakemake.persistence import NO_PARAMS_CHANGE
    if getattr(persistence, "_waypost_quiet", False):
        return

    def quiet(method, unchanged):
        def asked(job, file=None):
            if files_decide(job):
                return unchanged if file is not None else iter(())
            return method(job, file=file)
        return asked
    for name in ("input_changed", "code_changed", "software_stack_changed"):
        setattr(persistence, name, quiet(getattr(persistence, name), False))
    params_changed = persistence.params_changed
    persistence.params_changed = lambda job, file=None: (NO_PARAMS_CHANGE if files_decide(job)
                                                         else params_changed(job, file=file))
    persistence._waypost_quiet = True


def note_files_decide(workflow, files_decide) -> None:
    """Keep, on the workflow, which of its jobs the files decide (for ``quiet_script_dates``)."""
    workflow._waypost_files_decide = files_decide


def quiet_script_dates() -> None:
    """Snakemake's code trigger also reruns a ``script:``/``notebook:`` job
    whose script is newer than its outputs (``Job.outputs_older_than_script_or_notebook``,
    asked of every job: a method of the class): it says nothing of a job
    whose workflow's waypost says the files decide (``note_files_decide``).
    Once per process."""
    from snakemake.jobs import Job
    older = Job.outputs_older_than_script_or_notebook
    if getattr(older, "waypost", False):
        return

    async def outputs_older(job):
        files_decide = getattr(job.dag.workflow, "_waypost_files_decide", None)
        if files_decide is not None and files_decide(job):
            return
        async for found in older(job):
            yield found
    outputs_older.waypost = True
    Job.outputs_older_than_script_or_notebook = outputs_older


def filter_incomplete(persistence, keep) -> None:
    """The persistence's ``incomplete(job)`` (the job's files still marked
    incomplete) as ``keep(job, found)`` says. Once per persistence."""
    if getattr(persistence, "_waypost_orphans", False):
        return
    incomplete = persistence.incomplete

    async def kept(job):
        return keep(job, await incomplete(job))
    persistence.incomplete = kept
    persistence._waypost_orphans = True


def incomplete_marked_at(persistence, files) -> list:
    """When each file's incomplete marker was made (None where it has none)."""
    return [persistence._get_recorded_starttime(persistence._get_key(f)) for f in files]


# --- the scheduler and checkpoints ----------------------------------------------------------------
def on_failed_job(call) -> None:
    """Have ``call(scheduler, job)`` asked as the scheduler handles each
    failed job (``JobScheduler._handle_error``, in the main process, under
    the scheduler's lock, for every executor); once per process."""
    from snakemake.scheduling.job_scheduler import JobScheduler
    handle = JobScheduler._handle_error
    if getattr(handle, "waypost", False):
        return

    def handled(self, job, postprocess_job: bool = True):
        handle(self, job, postprocess_job)
        call(self, job)
    handled.waypost = True
    JobScheduler._handle_error = handled


def stop_gracefully(scheduler) -> bool:
    """Have the scheduler start no new job and let the running ones finish,
    as ``exit_gracefully`` does (without its lock: this runs under it);
    False where it is stopping already."""
    if scheduler._user_kill is not None:
        return False
    scheduler._user_kill = "graceful"
    return True


def after_checkpoint_get(call) -> None:
    """Have ``call(job)`` asked with the checkpoint job that a Snakefile's
    ``checkpoints.NAME.get(...)`` found, before the Snakefile gets it; once
    per process."""
    from snakemake.checkpoints import Checkpoint
    if getattr(Checkpoint.get, "waypost", False):
        return
    original = Checkpoint.get

    def get(self, **wildcards):
        job = original(self, **wildcards)
        call(job)
        return job
    get.waypost = True
    Checkpoint.get = get
