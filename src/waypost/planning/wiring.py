"""The one module that touches Snakemake's objects: the workflow, its rules,
its DAG, its checkpoints, its jobs.

``Snake`` answers what the stage graph, the resolver and the state view
need of Snakemake; ``wire`` turns a stage rule into a step: one input
function, the step runner around its shell command, its step spec param.

Snakemake internals used (tested with snakemake 9.27; the range pinned in
pyproject.toml). Everything else is public:
- ``shell._get_process_prefix(executable)``, ``shell._process_suffix``: the
  prefix and suffix ``shell.prefix()``/``shell.suffix()`` set (no public
  getter), which the step runner puts around the step's command;
- ``Rule._input``, ``Rule.dependencies``, ``Rule.input._names``,
  ``Rule.params._names`` and ``Namedlist._set_name`` (a params function
  replaced), ``Rule.resources._data``, ``Rule.input_modifier`` /
  ``output_modifier``: ``wire`` replaces a stage rule's inputs with one function;
- ``Rule.expand_input``, and ``Rule.expand_params`` / ``expand_resources`` /
  ``expand_priority`` (given a job's inputs), wrapped per stage rule:
  ``_keep_inputs_for_functions``; ``Rule.set_params`` and the ``_names`` of a
  job's params, whose step spec ``_set_step_param`` hides;
- ``Rule.run_func`` and the ``RULEFUNC_CONTEXT_MARKER`` parameter of a rule's
  run function: ``_shell_run_func``;
- ``snakemake.script.shell``, the one ``shell`` call that runs a ``script:``,
  ``notebook:`` or ``wrapper:`` job's script (``ScriptBase._execute_cmd``):
  replaced by ``_step_shell``, which is that ``shell`` but for a job waypost
  records (``_script_run_func``);
- ``snakemake.utils.SequenceFormatter`` and ``QuotedFormatter``: how
  ``shell`` formats a command (``snakemake.utils.format`` without its look-up
  of names in the caller's frame), for a policy's restart command
  (``with_restart``);
- how Snakemake reports a rule's failure (``executors/local.py``,
  ``exceptions.get_exception_origin``): an exception that passes through a
  line of the code it compiled a Snakefile into (``workflow.linemaps``) is
  the rule's, shown as ``<error> in file "<Snakefile>", line N`` without a
  traceback; the step's ``shell(...)`` call is compiled at the line of the
  rule's own (``_shell_call``);
- what ``shell`` gives a job's command besides the command: the threads
  variables (``OMP_NUM_THREADS`` and five more) and ``TMPDIR`` (and its
  three aliases) from ``resources.tmpdir``, which ``LocalSteps.serve`` sets
  as ``shell.__new__`` does for a step it hands the local step server;
  ``workflow.local_exec`` says whether this process runs its jobs itself;
- how Snakemake prints an error raised inside its own code
  (``exceptions.cut_traceback``: no frame once one is Snakemake's):
  ``LocalSteps.serve`` has ``shell`` itself raise a served step's failure;
- ``Workflow._build_dag``, ``Workflow._persistence`` and the persistence's
  ``params_changed``, ``input_changed``, ``code_changed``,
  ``software_stack_changed``, and ``Job.outputs_older_than_script_or_notebook``
  (the code trigger for a script): ``quiet_triggers``; ``Job(rule, dag,
  wildcards_dict=...)``, ``Job._path_to_source_file`` (with ``Job._params``
  set to the params being expanded), ``Rule.expand_conda_env`` /
  ``expand_container_img`` / ``env_modules`` and the persistence's
  ``_serialize_param``: what a job's record keeps of its triggers
  (``job_triggers``, ``Snake.current_spec``);
- ``JobScheduler._handle_error`` (a failed job, under the scheduler's lock)
  and its ``_user_kill`` (``"graceful"``: what ``exit_gracefully`` sets):
  ``stop_on_request``;
- the persistence's ``incomplete(job)`` (async; what ``rerun-incomplete``
  forces), ``_get_key(file)`` and ``_get_recorded_starttime(key)`` (when
  the file's incomplete marker was made): ``take_finished_orphans``;
- ``workflow.dag.forcefiles`` and ``workflow.dag_settings`` (``force``,
  ``forced_rules``), ``workflow.resource_settings._parsed_overwrite_resources``
  (``--set-resources`` keeps the last word); ``workflow.executor_plugin``
  (None where the run executes no job: ``--dag``, ``--summary``; its
  ``common_settings``' ``dryrun_exec`` and ``touch_exec``): ``runs_jobs``;
- ``Rule._restart_times`` (the rule's own ``retries:``): ``rule_retries``;
- ``Rule.is_producer`` and ``Rule.get_wildcards`` (how the DAG finds a
  file's producer): ``input_records_of``;
- checkpoints: ``workflow.globals["checkpoints"]``, ``Rule.is_checkpoint``,
  ``Rule.wildcard_names``, ``IncompleteCheckpointException.targetfile`` (an
  input that waits for a checkpoint is its output, as Snakemake's own
  handler makes it); ``Checkpoint.get``, wrapped on a gs:// root
  (``fetch_checkpoint_folders``);
- on a gs:// root, a file's storage object (``flags["storage_object"]``,
  its ``query``, ``retrieve`` and ``keep_local``), ``_IOFile._file`` (a
  rule's file given another storage object: ``_retrieved``) and a rule's
  path modifiers (``input_modifier``, ``log_modifier``,
  ``benchmark_modifier``, their ``modify``): ``as_plain_on_the_bucket``.
"""

from __future__ import annotations

import contextvars
import inspect
import os
import re
import sys
import threading

from snakemake.exceptions import IncompleteCheckpointException, WorkflowError
from snakemake.io import apply_wildcards, is_flagged, strip_wildcard_constraints
from snakemake.iocontainers import Wildcards

from waypost import stores
from waypost.model import layout, manifest
from waypost.model import spec as wspec
from waypost.planning.stagegraph import StageError, presigned

Waiting = IncompleteCheckpointException   # an instance set a checkpoint still has to find
_PLAIN_FIELDS = re.compile(r"(?:[^{}]|\{\w+\})*")   # a pattern str.format can fill
_FIELD = re.compile(r"\{(\w+)\}")
# The step's placeholder for the job's spec line (its params, with the
# policy's restart command formatted in: ``with_restart``).
SPEC_LINE = "waypost_spec_line"
# The one name a step's run function adds to those its command sees (the
# Snakefile's globals and the rule function's arguments): its helpers.
STEP_HELPERS = "waypost_step"


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


def run_identity(workflow) -> str:
    """The run id that every job of this run records.

    Snakemake's main process makes a new one and exports it; its jobs
    inherit it: local jobs as its children, cluster jobs through the executor
    (the Slurm plugin submits with ``--export=ALL``, and it is registered as
    one of the workflow's ``envvars``, which Snakemake hands to the remote
    jobs of any executor). The step runner reads it from its environment: an
    earlier attempt of the same run in its stage directory means Snakemake is
    retrying the job.
    """
    if job_process(workflow):   # a cluster job (or a job's subprocess): its main process decided
        if manifest.RUN_ID_ENV not in os.environ:
            raise WorkflowError(f"this job's Snakemake process did not inherit {manifest.RUN_ID_ENV} from the "
                                "run that started it: its executor must pass the environment to its jobs")
        return os.environ[manifest.RUN_ID_ENV]
    os.environ[manifest.RUN_ID_ENV] = manifest.new_run_id()
    workflow.register_envvars(manifest.RUN_ID_ENV)
    return os.environ[manifest.RUN_ID_ENV]


class Snake:
    """One Snakefile's workflow, as the planning asks it."""

    Waiting = Waiting

    def __init__(self, workflow):
        self.workflow = workflow
        self.graph = None   # the stage graph and the root, once the config is read (attach)
        self.root = ""
        self.job_process = job_process(workflow)
        self.remote = bool(getattr(workflow, "remote_exec", False))   # a cluster job's own process
        self.items: dict[str, list] = {}      # stage → its rule's inputs as written (see wire)
        self.input_functions: set[str] = set()   # stages whose rule's inputs are wire's function
        self.commands: dict[str, str] = {}    # stage → its rule's shell command as written
        self.shell_exec: dict[str, str] = {}  # stage → its rule's own shell_exec resource
        self._outputs: dict[str, list] = {}
        self._resolved: dict[tuple, dict] = {}   # (stage, job) → its inputs, resolved ahead (inputs_now)
        self.input_patterns: dict[str, list[str]] = {}   # stage → its inputs as written, where all are patterns
        self._wildcard_names: dict[str, set] = {}
        self.emptied: set[tuple] = set()   # (stage, job) whose input function gave no inputs (done, reused)
        self.keeping = False   # the input functions give every job its inputs (``inputs_for_functions``)
        self.local_steps = LocalSteps(workflow)   # the steps this process runs itself (its local executor's)
        # How a ``run:`` job's own process runs its step in a fork of itself
        # (``waypost.runner.forked.run_here``, set by the Snakefile's front;
        # None: in a Snakemake process of the block's own, ``_this_job_again``).
        self.run_here = None
        self.declared_places: list | None = None   # every rule's files' patterns (``_declared_places``)
        self.keeps_inputs: set[str] = set()   # rules whose functions see their inputs (``_keep_inputs_for_functions``)
        self._output_index = None   # which rules can make a file, as Snakemake finds them (``made_by_another_rule``)

    def attach(self, graph, root: str) -> None:
        self.graph, self.root = graph, root
        self.note_rule_names()

    # --- the Snakefile ----------------------------------------------------------
    @property
    def basedir(self) -> str:
        return self.workflow.basedir

    def config_sources(self) -> tuple[list[str], list[str], dict]:
        """(the config files the Snakefile's ``configfile:`` read so far,
        those given with ``--configfile``, the ``--config`` overrides alone:
        ``overwrite_config`` also holds the given files' contents)."""
        given = [str(path) for path in self.workflow.config_settings.configfiles or ()]
        read = [str(path) for path in self.workflow.configfiles[len(given):]]
        return read, given, dict(self.workflow.config_settings.config or {})

    def planning_mirror(self, root: str) -> str:
        """For a run over a gs:// root: check that Snakemake stores stage
        files there through waypost's plugin, and that the bucket is there;
        returns the local copy of the bucket (a path)."""
        settings = self.workflow.storage_settings
        prefix = (getattr(settings, "default_storage_prefix", None) or "").rstrip("/")
        if getattr(settings, "default_storage_provider", None) != stores.PROVIDER or prefix != root.rstrip("/"):
            raise WorkflowError(f"root {root} is a bucket: run Snakemake with "
                                f"{' '.join(stores.snakemake_options(root))} (or those two keys in the profile; "
                                "see docs/buckets.md in waypost's manual)")
        try:
            stores.check_bucket(root)
        except stores.StorageError as exc:
            raise WorkflowError(str(exc)) from None
        stores.register_root(root)
        return os.path.abspath(str(self.workflow.storage_registry.default_storage_provider.local_prefix))

    def reach(self, root: str) -> None:
        """For a root that is a path, how waypost serves it decided now (a
        mount: through the bucket's API or through the mount, said once),
        before the planning reads it; a mount the config declares whose API
        can't be reached is one line (``stores.reach``)."""
        try:
            stores.reach(root)
        except stores.StorageError as exc:
            raise WorkflowError(str(exc)) from None

    def constrain(self, **constraints) -> None:
        self.workflow.global_wildcard_constraints(**constraints)

    def note_rule_names(self) -> None:
        """Tell the graph which rule the helpers are called in: Snakemake
        evaluates a rule's ``@workflow.rule(name=...)`` decorator before its
        input, output and params, and ``decorate`` after them."""
        define, graph = self.workflow.rule, self.graph

        def rule(*args, **kwargs):
            name = kwargs.get("name", args[0] if args else None)
            decorate = define(*args, **kwargs)
            graph.current = name

            def defined(ruleinfo):
                try:
                    return decorate(ruleinfo)
                finally:
                    graph.current = None
            return defined
        self.workflow.rule = rule

    def current_basedir(self) -> str:
        """The directory of the Snakefile being read; when a rule's command
        is evaluated as its job runs (``command_now``), the rule's."""
        if not self.workflow.included_stack:
            running = _EVALUATING_IN.get()
            if running is not None:
                return running
        return _local_path(self.workflow.current_basedir)

    @property
    def snakefile(self) -> str:
        """The main Snakefile's path."""
        return os.path.abspath(self.workflow.main_snakefile)

    def sources(self) -> dict:
        """The Snakefile and every file it includes (local ones)."""
        main = self.snakefile
        included = {str(source.get_path_or_uri(secret_free=False)) for source in self.workflow.included}
        return {"snakefile": main, "sources": sorted(
            {os.path.abspath(path) for path in included if "://" not in path and os.path.exists(path)}
            | {os.path.abspath(str(self.workflow.get_rule(s).snakefile)) for s in self.graph.stages} | {main})}

    # --- rules --------------------------------------------------------------------
    def is_checkpoint(self, stage: str) -> bool:
        return self.workflow.get_rule(stage).is_checkpoint

    def has_checkpoints(self) -> bool:
        return any(rule.is_checkpoint for rule in self.workflow.rules)

    def rule_outputs(self, stage: str) -> list[str]:
        """A stage rule's outputs as it wrote them (Snakemake turns paths on
        a gs:// root into storage files named by their local copy)."""
        if stage not in self._outputs:
            self._outputs[stage] = [_pattern(p, self.root) for p in self.workflow.get_rule(stage).output]
        return self._outputs[stage]

    def output_patterns(self, stage: str) -> list[tuple[str, bool]]:
        """(pattern, whether ``str.format`` fills it: no ``{name,constraint}``,
        no braces of its own) of each output of a stage rule."""
        stripped = [strip_wildcard_constraints(p) for p in self.rule_outputs(stage)]
        return [(p, bool(_PLAIN_FIELDS.fullmatch(p))) for p in stripped]

    @staticmethod
    def fill(pattern: str, values: dict) -> str:
        return apply_wildcards(pattern, values)

    def rule_code(self, stage: str) -> tuple:
        """What a stage's code version covers (see ``waypost.model.codeversion``)."""
        rule = self.workflow.get_rule(stage)
        if stage in self.commands or rule.shellcmd is not None:
            return "shell", self.commands.get(stage, rule.shellcmd)
        if rule.script or rule.notebook:
            name = str(rule.script or rule.notebook)
            path = name if os.path.isabs(name) else os.path.join(_local_path(rule.basedir), name)
            readable = "{" not in name and os.path.isfile(path)
            return "script", path if readable else name, readable
        return "run", rule.run_func_src or ""

    def shell_of(self, stage: str) -> dict:
        """How Snakemake's ``shell`` runs a stage's command: its executable
        (the rule's ``shell_exec`` resource, else ``shell.executable()``'s),
        prefix (``set -euo pipefail; `` for bash, or ``shell.prefix()``'s) and suffix."""
        from snakemake.shell import shell
        executable = self.shell_exec.get(stage) or shell.get_executable()
        return {"executable": executable, "prefix": shell._get_process_prefix(executable),
                "suffix": shell._process_suffix}

    def has_input_function(self, stage: str) -> bool:
        """Do a stage rule's inputs come from waypost's input function (``wire``)?"""
        return stage in self.input_functions

    def reads(self, stage: str) -> bool:
        """Has a stage rule inputs?"""
        return bool(self.items[stage])

    def batching(self) -> bool:
        """Does ``--batch`` split a rule's inputs in this run?"""
        dag = getattr(self.workflow, "dag_settings", None)
        return getattr(dag, "batch", None) is not None

    def inputs_now(self, stage: str, values: dict, keep: bool = False) -> list[str]:
        """Every input path a job of ``stage`` would read now (``keep``: the
        job's input function, asked next, takes them as they are)."""
        patterns = self.input_patterns.get(stage)
        if patterns is not None:   # (inputs as written, each a pattern of the rule's wildcards)
            return [pattern.format(**values) for pattern in patterns]
        names = self.wildcards_of(stage)
        wildcards = Wildcards(fromdict={k: v for k, v in values.items() if k in names})
        resolved = self.resolve(stage, wildcards)
        if keep:
            self._resolved[(stage, self._job_key(stage, wildcards))] = resolved
        return [p for paths in resolved.values() for p in _as_list(paths)]

    def wildcards_of(self, stage: str) -> set[str]:
        """The wildcards of a stage rule (the planning's values of a job
        name more: the axis value of a funnel, a None instance)."""
        if stage not in self._wildcard_names:
            self._wildcard_names[stage] = set(self.workflow.get_rule(stage).wildcard_names)
        return self._wildcard_names[stage]

    def _job_key(self, stage: str, wildcards) -> tuple:
        names = self.wildcards_of(stage)
        return tuple(sorted((k, v) for k, v in wildcards.items() if k in names))

    def emptied_key(self, stage: str, wildcards) -> tuple:
        return stage, self._job_key(stage, wildcards)

    def inputs_for_functions(self, rule, wildcards, given):
        """The inputs a job's params, resources and priority functions see:
        ``given`` (Snakemake's), or, for a job whose input function gave none
        because waypost decided it is done (or reused), the inputs its rule
        wrote, expanded by Snakemake as for any job (named, flagged, on the
        default storage): what they would see in plain Snakemake."""
        if self.emptied_key(rule.name, wildcards) not in self.emptied:
            return given
        self.keeping = True
        try:
            return rule.expand_input(wildcards)[0]
        finally:
            self.keeping = False

    def current_spec(self, name: str, values: dict, step_param: str) -> str:
        """The spec line a job of a rule in its own layout (its wildcards
        ``values``) would get now, with every input its rule gives it (a job
        waypost decided is done too): what ``waypost plan`` compares with
        its record (``_with_triggers``). A job the rule can't make now
        raises the rule's error."""
        from snakemake.jobs import Job
        self.keeping = True
        try:
            job = Job(self.workflow.get_rule(name), self.workflow.dag, wildcards_dict=dict(values))
            return getattr(job.params, step_param)   # (hidden from its params: ``_set_step_param``)
        finally:
            self.keeping = False

    def resolve(self, stage: str, wildcards) -> dict:
        """A stage job's inputs, by name, from its rule's items (as written)."""
        if self._resolved:
            kept = self._resolved.pop((stage, self._job_key(stage, wildcards)), None)
            if kept is not None:
                return kept
        return {name: _resolve_item(item, wildcards) for name, item in self.items[stage]}

    # --- the DAG --------------------------------------------------------------------
    def await_checkpoint(self, stage: str, values: dict) -> None:
        """Returns once the checkpoint job of ``stage`` with these wildcard
        values ran; raises ``Waiting`` until it has (Snakemake then
        re-evaluates the DAG)."""
        rule = self.workflow.get_rule(stage)
        checkpoints = self.workflow.globals["checkpoints"]
        getattr(checkpoints, stage).get(**{name: values[name] for name in rule.wildcard_names})

    def force(self, stage: str, values: dict) -> None:
        """Make Snakemake run this job of ``stage`` whatever its outputs'
        state, as ``--forcerun`` does, but for this one job: its outputs join
        the DAG's forced files (the DAG being built now asks this job's input
        function). Not in a job's own Snakemake process: it runs its job."""
        if self.job_process:
            return
        rule = self.workflow.get_rule(stage)
        self.workflow.dag.forcefiles.update(str(f.apply_wildcards(values)) for f in rule.output)

    def made_by_another_rule(self, rule: str, files: list[str]) -> bool:
        """Could a rule other than ``rule`` make one of ``files``? Snakemake
        then picks the file's producer among the rules that can make it whose
        inputs it finds (or can make), by their ``ruleorder``."""
        if self._output_index is None:
            from snakemake.output_index import OutputIndex
            self._output_index = OutputIndex(self.workflow.rules)
        return any(other.name != rule for f in files for other in self._output_index.match_producers(f))

    def rule_retries(self, name: str) -> int:
        """The rule's own ``retries:`` (``Rule._restart_times``; None where
        the rule names none and a profile's or ``--retries`` applies)."""
        return self.workflow.get_rule(name)._restart_times or 0

    def runs_jobs(self) -> bool:
        """Does this run execute jobs: not a dry run, nor ``--touch``, nor
        one that only prints the DAG, a summary or what changed (those have
        no executor)?"""
        plugin = getattr(self.workflow, "executor_plugin", None)
        settings = getattr(plugin, "common_settings", None)
        return settings is not None and not (settings.dryrun_exec or settings.touch_exec)

    def forced_rules(self) -> tuple[bool, list[str]] | None:
        """(``--forceall``, the ``--forcerun`` rules); None before the DAG
        settings are known."""
        dag = getattr(self.workflow, "dag_settings", None)
        return None if dag is None else (dag.forceall, list(dag.forcerun))

    def fill_resources(self, stage: str, resources: dict) -> None:
        """Put a stage's resources into its rule; ``--set-resources`` still has the last word."""
        from snakemake.resources import Resources
        rule = self.workflow.get_rule(stage)
        rule.resources.update(Resources.from_mapping(resources))
        rule.resources.update(self.workflow.resource_settings._parsed_overwrite_resources.get(stage, {}))

    def worker_class(self, stage: str) -> str | None:
        """The worker class a rule names (``resources: worker=...``),
        taken out of its resources."""
        worker = self.workflow.get_rule(stage).resources._data.pop("worker", None)
        return worker.value if worker is not None else None

    def job_rules(self, but) -> list[str]:
        """The rules other than ``but`` that run jobs (a command, ``run:``,
        a script...; not a target rule like ``all``)."""
        return [rule.name for rule in self.workflow.rules if rule.name not in but and not rule.norun]

    def target_rules(self, but) -> list[str]:
        """The rules other than ``but`` that run no job of their own (``all``,
        a rule that only ``touch()``-es its outputs)."""
        return [rule.name for rule in self.workflow.rules if rule.name not in but and rule.norun]

    def own_resources(self, name: str) -> dict:
        """The resources a rule wrote itself (not Snakemake's defaults, nor its
        internal ``_cores``/``_nodes``): name → value, None for a function."""
        defaults = self.workflow.resource_settings._parsed_default_resources
        return {key: (None if resource.is_evaluable() else resource.value)
                for key, resource in self.workflow.get_rule(name).resources._data.items()
                if not key.startswith("_") and defaults._data.get(key) != resource}

    def fill_gaps(self, name: str, resources: dict) -> None:
        """Put a worker class's resources into a rule that is not a stage,
        where it wrote none of its own (its own, and ``--set-resources``, win)."""
        own = self.own_resources(name)
        self.fill_resources(name, {key: value for key, value in resources.items() if key not in own})


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
        if job_process(workflow) or not getattr(workflow, "local_exec", False):
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
            ran = " ".join((shell._get_process_prefix(executable), step, shell._process_suffix)).strip()
            try:   # (Snakemake's own ``shell`` raises it, ending as the runner did: Snakemake then
                # reports it as a failing rule's command, with no traceback, as it does ``shell``'s)
                shell(f"exit {status}" if status > 0 else f"kill -{-status} $$")
            except CalledProcessError as failed:
                failed.cmd = ran
                raise
            raise CalledProcessError(status, ran)   # (a shell whose exit did not end it)
        return True


def wire(snake: Snake, stage, runner_line: str, step_param: str, step_function, mirror: str | None) -> str:
    """Make a stage rule a step: its run function runs the step runner
    (``runner_line``, braces doubled as in a rule's command) reading the
    job's step spec (the ``step_param`` param, ``step_function``) and then
    the rule's command as Snakemake formats it; its inputs, as written,
    kept for ``wire_inputs``. Returns the worker class the rule names, if any."""
    rule = snake.workflow.get_rule(stage.name)
    name, graph = rule.name, snake.graph
    own_dir = graph.own_path(stage, "")
    plain = [str(f) for f in rule.output
             if not strip_wildcard_constraints(_pattern(f, snake.root)).startswith(own_dir)]
    if plain:
        raise StageError(f"rule {name}: every output of a stage rule is wp.out(...) (in its stage's "
                         f"directory); not: {', '.join(plain)}")
    if rule.shellcmd is None:
        raise StageError(f"rule {name}: a stage rule runs a shell: command (waypost's step runner runs it, "
                         "attempt by attempt); script:, run: and wrapper: are not supported")
    _check_command(rule, step_param)
    wildcards = set(rule.wildcard_names) - {"experiment", "instance", graph.axis_wc}
    if wildcards:
        raise StageError(f"rule {name}: wildcards other than waypost's ({', '.join(sorted(wildcards))}): "
                         "a stage job is one experiment" + (f", {graph.axis.word}" if graph.axis else "")
                         + " and instance")
    items = _input_items(rule, snake.root)
    for _, item in items:
        for entry in (item if isinstance(item, list) else [item]):
            if isinstance(entry, str):
                stage.parents.update(graph.stage_of_path(entry))
    for dependency in rule.dependencies.values():
        if dependency in graph.stages:
            stage.parents.add(dependency)
    unknown = sorted(p for p in stage.parents if p not in graph.stages)
    if unknown:
        raise StageError(f"rule {name}: no stage {', '.join(map(repr, unknown))} (the stages are: "
                         f"{', '.join(graph.stages)})")
    snake.items[name] = items
    _wrap_command(snake, rule, runner_line, step_param, step_function, mirror)
    return snake.worker_class(name)


def own_layout_refusal(snake: Snake, name: str) -> str | None:
    """Why a rule that is not a stage can't be a step with a record of its
    own (``wire_own_layout``), and stays plain Snakemake's; None when it can."""
    rule = snake.workflow.get_rule(name)
    if rule.shellcmd is None and not _runs_a_script(rule):
        kind = next((f"{kind}:" for kind in ("template_engine", "cwl") if getattr(rule, kind, None)), None)
        if kind:
            return kind
        if not snake.job_process and getattr(snake.workflow.execution_settings, "use_threads", False):
            return "run: with --force-use-threads, in this process"
    if not rule.output:
        return "no outputs"
    if not layout.is_valid_name(name):
        return f"its name is no directory name ({layout.NAME_RULE})"
    if rule.shadow_depth:
        return "shadow:"
    flagged = _flagged_apart(rule, snake.root)
    if flagged:
        return f"{flagged} outputs"
    deployment = getattr(snake.workflow, "deployment_settings", None)
    if deployment is not None and any(getattr(method, "name", "") == "APPTAINER"
                                      for method in deployment.deployment_method) \
            and (rule.container_img or getattr(snake.workflow, "global_container_img", None)):
        return "runs in a container"
    return None


def wire_own_layout(snake: Snake, name: str, runner_line: str, step_param: str, mirror: str | None,
                    step_function) -> None:
    """Make a rule in its own layout (a plain ``shell:``, ``script:``,
    ``notebook:`` or ``wrapper:`` rule with outputs, where the rule puts
    them; ``own_layout_refusal`` says None) a step as ``wire`` makes a stage
    rule one: the step runner around its command (for a script, the command
    Snakemake runs it with: ``_script_run_func``), its job's record in a
    directory of its own. Its inputs, outputs and everything else stay as
    written."""
    rule = snake.workflow.get_rule(name)
    if mirror:
        benchmark_on_the_bucket(snake, rule)
        for f in rule.output:   # (Snakemake write-protects its local copy after the job: it must stay)
            if is_flagged(f, "protected") and is_flagged(f, "storage_object"):
                f.flags["storage_object"].keep_local = True
    if rule.shellcmd is None:
        if mirror:   # (the block or script sees its files' local copies, as a command does)
            _map_param_functions(rule, mirror)
        if _running_the_block(name):   # (the process the step runs a ``run:`` block in: plain Snakemake's)
            rule.restart_times = 0   # (the job's retries are the run's, as a ``shell:`` job's step's are)
            if mirror:
                rule.run_func = _on_local_copies(rule.run_func, mirror)
            return
        if step_param in rule.params._names:
            raise StageError(f"rule {name}: the param name {step_param!r} is waypost's own")
        head, runner = _runner_head(runner_line), runner_line.format()
        rule.run_func = _script_run_func(snake.local_steps, rule.run_func, head, runner, step_param, mirror) \
            if _runs_a_script(rule) else _run_block_func(snake, rule.run_func, name, head, runner, step_param, mirror)
        _set_step_param(rule, step_param, step_function, with_triggers=True)
        return
    _check_command(rule, step_param)
    _wrap_command(snake, rule, runner_line, step_param, step_function, mirror, with_triggers=True)


def _with_triggers(rule, step_param: str) -> None:
    """A rule in its own layout's jobs' spec lines (its ``step_param``)
    carry what Snakemake's rerun triggers compare (``job_triggers``), for
    its record to keep and ``waypost plan`` to compare with what they are
    now (``current_spec``)."""
    expand_params = rule.expand_params

    def params(wildcards, input, output, job, *args, **kwargs):
        found, non_derived = expand_params(wildcards, input, output, job, *args, **kwargs)
        if step_param in found._names and job is not None:
            start, _ = found._names[step_param]
            line = wspec.extend(found[start], {"triggers": job_triggers(job, found, input, non_derived)})
            found[start] = line
            setattr(found, step_param, line)
        return found, non_derived
    rule.expand_params = params


def job_triggers(job, params, input, non_derived: list) -> dict:
    """What Snakemake's rerun triggers compare of a job, as its record keeps
    it: its params (those not made from its files, serialized as Snakemake
    serializes them), its code (a digest of the shell command or ``run:``
    block as written, or of the script's contents) and its software
    environment (its conda env's definition, container, environment
    modules) and the set of its inputs (``input``: all its rule gives it)."""
    persistence = getattr(job.dag.workflow, "_persistence", None)
    serialize = persistence._serialize_param if persistence is not None else _serialized_param
    code = _code_of(job, params)
    params = sorted(value for value in map(serialize, non_derived) if isinstance(value, str))
    found = {"params": params, "code": code, "inputs": _input_set(input)}
    software = _software_of(job, params, input)
    if software:
        found["software_env"] = software
    return found


def _input_set(input) -> list[str]:
    """A job's inputs as Snakemake's input trigger compares them: sorted, a
    storage file by its query (its URL), not its local copy."""
    return sorted(str(f.storage_object.query) if getattr(f, "is_storage", False) else str(f) for f in input)


def _serialized_param(value) -> str | None:
    """A param as Snakemake's metadata keeps it, where no persistence is at
    hand (a job's own process): the ``repr`` of a builtin value, else None."""
    plain = (type(None), int, float, bool, str, complex, range, list, tuple, dict, set, frozenset, bytes, bytearray)
    return repr(value) if isinstance(value, plain) else None


def _code_of(job, params) -> dict:
    """A job's code, as Snakemake's code trigger compares it: the rule's
    shell command or ``run:`` block as written (a digest), or its script's
    or notebook's contents (Snakemake compares its time). ``params``: the
    job's, as just expanded: Snakemake formats the script's path with them
    (``Job._path_to_source_file``), and asking the job for them while they
    are being expanded would expand them again, and again."""
    rule = job.rule
    if rule.shellcmd is not None:
        return {"shell": _digest_text(rule.shellcmd)}
    path = rule.script or rule.notebook
    if path:
        held = job._params
        job._params = params if held is None else held
        try:
            local = job._path_to_source_file(path).get_path_or_uri(secret_free=True)
        except Exception:   # (a remote script: its path alone)
            local = str(path)
        finally:
            job._params = held
        return {"script": str(path), "sha256": _digest_file(local)}
    source = getattr(rule, "run_func_src", None)
    return {"run": _digest_text(source)} if source else {}


def _software_of(job, params, input) -> dict:
    """A job's software environment: its conda env's definition (a digest of
    the file, or the named env), its container image, its environment
    modules. (Its conda env is the rule's, given the params just expanded:
    ``Job.conda_env_spec`` would expand them again.)"""
    found, rule = {}, job.rule
    try:
        conda = rule.expand_conda_env(job.wildcards_dict, params, input)
    except Exception:   # (Snakemake says what is wrong with it when it deploys it)
        conda = None
    if conda:
        source = getattr(conda, "file", None)
        path = source.get_path_or_uri(secret_free=True) if source is not None else None
        found["conda"] = _digest_file(path) if path and os.path.isfile(path) else str(path or conda)
    container = rule.expand_container_img(job.wildcards_dict) if rule.container_img else None
    if container:
        found["container"] = str(container)
    if rule.env_modules:
        found["env_modules"] = [str(m) for m in rule.env_modules]
    return found


def _digest_text(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


_file_digests: dict[tuple, str | None] = {}


def _digest_file(path: str) -> str | None:
    """A file's sha256, read once per size and time in this process."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _file_digests:
        _file_digests[key] = manifest.sha256_file(path)
    return _file_digests[key]


def _runs_a_script(rule) -> bool:
    """Does a rule run a script Snakemake writes out and runs with ``shell``
    (``script:``, ``notebook:``, ``wrapper:``; a local one: no container
    image, whose interpreter would be the image's)?"""
    return bool(rule.script or rule.notebook or rule.wrapper)


# The step a ``script:``, ``notebook:`` or ``wrapper:`` job's run function
# puts its script's command through (``_script_run_func``): the runner's
# line, the job's spec line and the local step server that may take it. Per
# thread: Snakemake runs local jobs in threads.
_SCRIPT_STEP: contextvars.ContextVar[tuple[str, str, LocalSteps] | None] = contextvars.ContextVar(
    "waypost_script_step", default=None)


def _script_run_func(local_steps: LocalSteps, original, head: str, runner: str, step_param: str,
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

    import snakemake.script
    if not getattr(snakemake.script.shell, "waypost", False):
        snakemake.script.shell = _step_shell
    signature = inspect.signature(original)

    @functools.wraps(original)
    def run(*args, **kwargs):
        bound, spec_line = _job_and_spec(original, signature.bind(*args, **kwargs), step_param, mirror)
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


RUN_BLOCK_ENV = wspec.RUN_BLOCK_ENV


def _run_block_func(snake: Snake, original, name: str, head: str, runner: str, step_param: str,
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
        bound, spec_line = _job_and_spec(original, signature.bind(*args, **kwargs), step_param, mirror)
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


def _on_local_copies(original, mirror: str):
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


def _running_the_block(rule: str) -> bool:
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


def _set_step_param(rule, step_param: str, step_function, with_triggers: bool = False) -> None:
    """Give a rule's jobs their step spec (``step_function``) as a param
    Snakemake evaluates when it evaluates the rule's own (its functions, at
    the same time, in every process that plans the job), but kept out of the
    params the job shows: each job's params hold it as an attribute only
    (``_hide``), so ``{params}`` in a command or a ``message:``, and the
    params a script or block sees, are plain Snakemake's. ``with_triggers``
    (a rule in its own layout): the spec carries what the rerun triggers
    compare (``_with_triggers``)."""
    rule.set_params(**{step_param: step_function})
    if with_triggers:
        _with_triggers(rule, step_param)
    expand_params = rule.expand_params

    def expand(*args, **kwargs):
        params, non_derived = expand_params(*args, **kwargs)
        _hide(params, step_param)
        return params, non_derived
    rule.expand_params = expand


def _hide(params, name: str) -> None:
    """Take the param ``name`` out of a job's params, leaving it only as
    their attribute ``name`` (their other names and positions kept)."""
    index, _ = params._names.pop(name, (None, None))
    if index is None:   # (evaluated without its functions)
        return
    del params[index]
    for other, (start, end) in list(params._names.items()):
        if start > index:
            params._names[other] = (start - 1, None if end is None else end - 1)


def _job_and_spec(original, bound, step_param: str, mirror: str | None):
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
    job["params"] = job["params"]._clone()   # (its names, not the hidden step spec: ``_set_step_param``)
    return bound, spec_line


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


def wire_own_reuse(snake: Snake, name: str, source_of) -> None:
    """A rule in its own layout whose jobs an experiment of this config takes
    from another one of it (``source_of(values)``: the source job's
    wildcards, or None): such a job's inputs are its source job's outputs,
    so the source is made first (or again, when it is redone), and nothing
    upstream of the job itself is needed. Its functions still see the
    inputs its rule gives (``Snake.inputs_for_functions``)."""
    from snakemake.io import IOFile
    from snakemake.iocontainers import InputFiles
    rule = snake.workflow.get_rule(name)
    expand_input = rule.expand_input

    def expand(wildcards, groupid=None):
        source = None if snake.keeping else source_of(dict(wildcards.items()))
        if source is None:
            return expand_input(wildcards, groupid)
        mark_done(snake, snake.emptied_key(name, wildcards))
        return InputFiles(toclone=[IOFile(str(f), rule=rule) for f in rule.expand_output(source)[0]]), {}, {}, False
    rule.expand_input = expand
    _keep_inputs_for_functions(snake, rule)


def wire_own_presence(snake: Snake, name: str, done) -> None:
    """A rule in its own layout whose jobs waypost may say are done
    (presence mode; an adopted job, ``planning.ownpresence``): a job that
    ``done(rule, values, outputs, inputs)`` (the last two: functions giving
    its paths, asked only when needed) says is done gets no inputs
    (Snakemake then runs it only for a missing output or a forced one),
    while its params, resources and priority functions still see the
    inputs its rule gives (``Snake.inputs_for_functions``). Not in a job's
    own Snakemake process: it runs the job it was given."""
    from snakemake.iocontainers import InputFiles
    if snake.job_process:
        return
    rule = snake.workflow.get_rule(name)
    expand_input = rule.expand_input

    def expand(wildcards, groupid=None):
        if not snake.keeping:
            values = dict(wildcards.items())
            key = snake.emptied_key(name, values)
            if done(name, values, lambda: [_named(f) for f in rule.expand_output(values)[0]],
                    lambda: [_named(f) for f in expand_input(wildcards, groupid)[0]]):
                mark_done(snake, key)
                return InputFiles(), {}, {}, False
            snake.emptied.discard(key)
        return expand_input(wildcards, groupid)
    rule.expand_input = expand
    _keep_inputs_for_functions(snake, rule)


def needs_own_process(job) -> bool:
    """Does a job of a rule in its own layout need a Snakemake process of
    its own on a cluster node: a conda env, container or environment
    modules in effect (that process deploys them), a benchmark (it measures
    it), ``protected()`` or ``ensure()`` outputs (it checks and marks them),
    a script (it writes the script out: ``_script_run_func``)? Else the executor runs its step straight, packed or bundled as a stage
    job's, and the step runner does the rest of what that process would
    (``StageDir.prepare_outputs``)."""
    methods = {getattr(method, "name", "") for method in
               getattr(job.rule.workflow.deployment_settings, "deployment_method", None) or ()}
    deployed = (("CONDA" in methods and job.conda_env_spec) or ("APPTAINER" in methods and job.container_img_url)
                or ("ENV_MODULES" in methods and job.env_modules))
    flagged = any(is_flagged(f, flag) for f in job.rule.output for flag in ("protected", "ensure"))
    return bool(deployed or job.benchmark or flagged or job.rule.shellcmd is None)


def log_files_of(snake: Snake, name: str):
    """A function of a job's wildcards: its rule's log files (on a gs://
    root, their local copies). The step runner makes their directories
    where no Snakemake process of the job's own does (``needs_own_process``),
    and on a gs:// root stores them in the bucket."""
    logs = list(snake.workflow.get_rule(name).log)

    def log_files(values: dict) -> list[str]:
        return [str(f.apply_wildcards(values)) for f in logs]
    return log_files


def own_dirs_of(snake: Snake, name: str):
    """A function of a job's outputs (its rule's, in order) giving the
    directories of them that only this job writes, and the others.

    Its own: where the rule's pattern names every wildcard of the rule (no
    other job of the rule writes there) and no other rule's output, log or
    benchmark could be (nor the inside of another rule's ``directory()``),
    a wildcard without a constraint taken as one path component. The files
    a job leaves there beside its outputs are its own (side files). The
    others (shared), each with the patterns (regexes) of every rule's files
    that could be there: a file the job leaves there that none declares is
    said (``StageDir.left_in_shared``)."""
    rule = snake.workflow.get_rule(name)
    wildcards = set(rule.wildcard_names)
    owned = [not is_flagged(f, "directory") and wildcards <= set(_FIELD_NAMES.findall(os.path.dirname(str(f))))
             for f in rule.output]
    places = _declared_places(snake)
    foreign = [rx for other, dir_rx, _, inside in places if other != name for rx in (dir_rx, inside) if rx]
    declared = [(dir_rx, file_rx) for _, dir_rx, file_rx, _ in places]

    def own_dirs(outputs) -> tuple[list[str], dict[str, list[str]]]:
        found, shared = [], {}
        for mine, path in zip(owned, outputs):
            directory = os.path.dirname(str(path)) or "."
            if directory in found or directory in shared:
                continue
            if mine and not any(rx.match(directory) for rx in foreign):
                found.append(directory)
            else:
                shared[directory] = sorted({file_rx for dir_rx, file_rx in declared
                                            if dir_rx.match(stores.normalised(directory))})
        return found, shared
    return own_dirs


def input_records_of(snake: Snake, rules: list[str], record_of):
    """A function of a job's inputs giving, for each that a job of one of
    ``rules`` (rules in their own layout) could make, the record
    directories of those jobs (``record_of(rule, wildcards)``), as
    Snakemake finds a file's producer (``Rule.is_producer``, its wildcards
    from ``Rule.get_wildcards``). The runner takes the one whose manifest
    lists the file (``parents.describe_inputs``): where several rules could
    make it, Snakemake's rule order chose which did."""
    candidates = [snake.workflow.get_rule(name) for name in rules]

    def input_records(inputs) -> dict[str, list[str]]:
        found = {}
        for path in dict.fromkeys(map(str, inputs)):
            records = [record_of(rule.name, rule.get_wildcards(path)) for rule in candidates
                       if rule.is_producer(path)]
            if records:
                found[path] = records
        return found
    return input_records


def input_dirs_of(snake: Snake, rules: list[str]):
    """A function of a job's inputs giving the directories of them that a
    job of one of ``rules`` (rules in their own layout) writes alone
    (``own_dirs_of``): what else is there is that job's too (its side files,
    the ``decoder.yml`` beside a model), which a step on a gs:// root gets
    with its inputs, as it sees them on disk."""
    import re

    from snakemake.io import regex_from_filepattern
    owned = []   # (rule, the regex of a directory of its outputs that its jobs each write alone)
    for name in rules:
        rule = snake.workflow.get_rule(name)
        wildcards = set(rule.wildcard_names)
        owned += [(name, re.compile(_one_component(regex_from_filepattern(os.path.dirname(_named(f)) or "."))))
                  for f in rule.output if not is_flagged(f, "directory")
                  and wildcards <= set(_FIELD_NAMES.findall(os.path.dirname(str(f))))]
    places = _declared_places(snake)

    def input_dirs(inputs) -> list[str]:
        found = []
        for directory in dict.fromkeys(os.path.dirname(str(i)) for i in inputs):
            owners = {name for name, rx in owned if rx.match(directory)}
            if len(owners) == 1 and not any(rx.match(directory) for other, dir_rx, _, inside in places
                                            if other not in owners for rx in (dir_rx, inside) if rx):
                found.append(directory)
        return found
    return input_dirs


def _declared_places(snake: Snake) -> list[tuple]:
    """Every rule's output, log and benchmark patterns, read once per
    workflow: (rule, its directory's regex, the file's regex, the regex of
    the inside of a ``directory()`` output or None)."""
    if snake.declared_places is None:
        from snakemake.io import regex_from_filepattern

        def compiled(pattern: str):
            return re.compile(_one_component(regex_from_filepattern(pattern or ".")))
        places = []
        for rule in snake.workflow.rules:
            for f in [*rule.output, *rule.log, *([rule.benchmark] if rule.benchmark else [])]:
                # (on a gs:// root, as its jobs' files are named: their URLs)
                pattern = str(f.storage_object.query) if is_flagged(f, "storage_object") else str(f)
                places.append((rule.name, compiled(os.path.dirname(pattern)),
                               _one_component(regex_from_filepattern(pattern)),
                               compiled(pattern) if is_flagged(f, "directory") else None))
        snake.declared_places = places
    return snake.declared_places


def _one_component(regex: str) -> str:
    """A wildcard without a constraint taken as one path component: it
    could span directories, but a pattern that means to says so."""
    return re.sub(r"(\(\?P<\w+>)\.\+\)", r"\1[^/]+)", regex)


_FIELD_NAMES = re.compile(r"\{\s*(\w+)")   # a wildcard's name in a pattern (constraint or not)


def flagged_positions(snake: Snake, name: str, flag: str) -> list[int]:
    """Where a rule's outputs flagged ``flag`` are among its outputs
    (``temp``: Snakemake removes them once their consumers ran; ``touch``:
    it makes them once the job ended); a job's outputs are its rule's, in
    order (the flags are the rule's: a params function's ``output`` has none)."""
    return [i for i, f in enumerate(snake.workflow.get_rule(name).output) if is_flagged(f, flag)]


def _check_command(rule, step_param: str) -> None:
    name = rule.name
    if step_param in rule.params._names:
        raise StageError(f"rule {name}: the param name {step_param!r} is waypost's own")
    if wspec.DELIMITER in rule.shellcmd:
        raise StageError(f"rule {name}: its shell command holds {wspec.DELIMITER!r}, the line that ends "
                         "waypost's here-document around it")


def _wrap_command(snake: Snake, rule, runner_line: str, step_param: str, step_function, mirror: str | None,
                  with_triggers: bool = False) -> None:
    name = rule.name
    snake.commands[name] = rule.shellcmd
    # The step runner reads the job's step spec, then the rule's command
    # as Snakemake formats it, from a quoted here-document: no argument
    # carries the command (of any length), and its shell syntax stays the
    # step's. ``exec``: the runner's status is the job's, and a
    # ``shell.suffix()`` is run by the step's script only. The rule's
    # ``shellcmd`` stays the user's: what Snakemake shows of the job (a
    # failure's error block, ``--printshellcmds``, its metadata, reports).
    rule.run_func = _shell_run_func(snake, rule.run_func, _runner_head(runner_line), runner_line.format(), mirror,
                                    step_param, _local_path(rule.basedir))   # (the runner's braces doubled, and as formatted)
    if mirror:
        _map_param_functions(rule, mirror)
    _set_step_param(rule, step_param, step_function, with_triggers)
    shell_exec = rule.resources._data.get("shell_exec")
    if shell_exec is not None:
        if not isinstance(shell_exec.value, str):
            raise StageError(f"rule {name}: resources.shell_exec of a stage rule is a path to a shell, "
                             "not a function")
        snake.shell_exec[name] = shell_exec.value


def wire_inputs(snake: Snake, name: str, state) -> None:
    """Give a wired stage rule (``wire``) its inputs, once every stage rule
    is wired: one input function (``_job_inputs``, asking ``state``, the
    state view), or, where that function could only ever give every job
    the inputs the rule wrote (``StateView.inputs_as_written``), those, for
    Snakemake to fill (fewer callables plan faster). A rule that reads
    nothing needs the function only to force a job whose attempt is still
    open."""
    from snakemake.io import unpack
    from snakemake.iocontainers import InputFiles
    rule, items = snake.workflow.get_rule(name), snake.items[name]
    if items:
        function = snake.job_process or not state.inputs_as_written(name)
    else:
        function = not snake.job_process and (state.to_force(name) or state.waits_for_sources(name))
    if not (items or function):
        return
    rule._input = InputFiles()
    rule.dependencies = {}
    if getattr(rule, "input_modifier", None) is None:   # a rule that had no input: of its own
        rule.input_modifier = rule.output_modifier
    if function:
        rule.set_input(unpack(_job_inputs(snake, state, name, [label for label, _ in items])))
        snake.input_functions.add(name)
        _keep_inputs_for_functions(snake, rule)
    else:
        wildcards = set(rule.wildcard_names)
        written = _as_written(items, wildcards)
        rule.set_input(**written)
        entries = [entry for item in written.values() for entry in (item if isinstance(item, list) else [item])]
        if all(_fills(entry, wildcards) for entry in entries):
            snake.input_patterns[name] = entries


# The input of a reused job that waits for its source's outputs (StateView.reuse_plan).
REUSE_SOURCE = "_waypost_reuse_source"


def _job_inputs(snake: Snake, state, stage: str, names: list[str]):
    """The one input function of a stage rule: none for a job that is done
    or reused (``StateView.needs_inputs``), else its rule's inputs. One
    function per rule, not one per input: Snakemake inspects every callable
    of every job, so fewer callables plan faster."""
    def inputs(wildcards):
        if snake.keeping:   # asked for a job's functions (``Snake.inputs_for_functions``)
            return snake.resolve(stage, wildcards)
        values, key = dict(wildcards.items()), snake.emptied_key(stage, wildcards)
        source = state.reuse_after(stage, values)
        if source:   # a reuse waiting for its source, which this run makes first
            mark_done(snake, key)
            return {**{name: [] for name in names}, REUSE_SOURCE: source}
        if not state.needs_inputs(stage, values, bool(names)):
            mark_done(snake, key)
            return {name: [] for name in names}
        snake.emptied.discard(key)
        return snake.resolve(stage, wildcards)

    if not snake.has_checkpoints():
        return presigned(inputs)

    def waiting(wildcards):
        try:
            if not snake.keeping and state.parts_changed(stage, dict(wildcards.items())):
                snake.emptied.discard(snake.emptied_key(stage, wildcards))
                return snake.resolve(stage, wildcards)
            return inputs(wildcards)
        except Waiting:
            return _waiting_inputs(snake, stage, wildcards)
    return presigned(waiting)


def mark_done(snake: Snake, key: tuple) -> None:
    """A job waypost decided is done (or reused): its input function gave
    none of its inputs (``Snake.emptied``). Snakemake's other rerun triggers
    then say nothing of it (``quiet_triggers``)."""
    snake.emptied.add(key)


def quiet_triggers(snake: Snake) -> None:
    """Have the rerun triggers that compare a job with its metadata in
    ``.snakemake/`` (params, the set of inputs, code, software environment)
    say nothing of the jobs whose completion is the files' business: a
    stage job (waypost's layout: done when its outputs are there, or, in
    mtime mode, newer than its inputs), and a job waypost decided is done
    (``mark_done``: presence mode, a reuse). Every other job (a rule in its
    own layout) is asked as plain Snakemake asks it, with the run's own
    ``--rerun-triggers``. Installed on each DAG's persistence as Snakemake
    builds it (``Workflow._build_dag``)."""
    workflow = snake.workflow
    build = workflow._build_dag

    def files_decide(job) -> bool:
        name = job.rule.name
        return name in snake.items or snake.emptied_key(name, job.wildcards) in snake.emptied

    def built(*args, **kwargs):
        persistence = getattr(workflow, "_persistence", None)
        if persistence is not None and not getattr(persistence, "_waypost_quiet", False):
            _quiet_other_triggers(persistence, files_decide)
        workflow._waypost_files_decide = files_decide
        return build(*args, **kwargs)
    workflow._build_dag = built
    _quiet_script_dates()


def _quiet_other_triggers(persistence, files_decide) -> None:
    """The persistence's trigger checks (params, input set, code, software
    environment) saying nothing of a job ``files_decide`` names. Once per
    persistence."""
    from snakemake.persistence import NO_PARAMS_CHANGE

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


def take_finished_orphans(snake: Snake, step_param: str) -> None:
    """A job Snakemake still marks incomplete (``.snakemake/incomplete/``)
    whose step outlived its driver (the driver alone killed, as the OOM
    killer does, its runner not) and recorded SUCCESS after the mark is
    complete: the runner writes that record last, once the outputs are in
    place. Snakemake's ``persistence.incomplete`` says nothing of its
    outputs, so ``rerun-incomplete`` does not redo it. A record older than
    the mark (the runner killed too, or not started) leaves the job
    incomplete, as in plain Snakemake. Installed on each DAG's persistence
    as Snakemake builds it."""
    workflow = snake.workflow
    build = workflow._build_dag

    def built(*args, **kwargs):
        persistence = getattr(workflow, "_persistence", None)
        if persistence is not None and not getattr(persistence, "_waypost_orphans", False):
            _take_orphans(persistence, step_param)
        return build(*args, **kwargs)
    workflow._build_dag = built


def _take_orphans(persistence, step_param: str) -> None:
    from waypost.state import lifecycle
    incomplete = persistence.incomplete

    async def taken(job):
        found = await incomplete(job)
        directory = _record_dir(job, step_param) if found else None
        if directory is None:
            return found
        marked = [persistence._get_recorded_starttime(persistence._get_key(f)) for f in found]
        if None not in marked and lifecycle.succeeded_since(directory, max(marked)):
            return []
        return found
    persistence.incomplete = taken
    persistence._waypost_orphans = True


def stop_on_request(step_param: str) -> None:
    """A job whose series a ``stop`` cue ended recorded ``stopped_run`` in
    this run: the run then starts no new job and lets the running ones
    finish, as Snakemake's own graceful stop does (a SIGTERM to it:
    ``JobScheduler.exit_gracefully``). Asked as the scheduler handles each
    failed job (``JobScheduler._handle_error``, in the main process, for
    every executor); installed once."""
    from snakemake.scheduling.job_scheduler import JobScheduler
    handle = JobScheduler._handle_error
    if getattr(handle, "waypost", False):
        return

    def handled(self, job, postprocess_job: bool = True):
        handle(self, job, postprocess_job)
        why = next(filter(None, (_stopped_run(one, step_param) for one in getattr(job, "jobs", [job]))), None)
        if why and self._user_kill is None:
            print(f"waypost: {why}: no new job starts in this run; the running ones finish", file=sys.stderr)
            self._user_kill = "graceful"   # (exit_gracefully, without its lock: this runs under it)
    handled.waypost = True
    JobScheduler._handle_error = handled


def _stopped_run(job, step_param: str) -> str | None:
    """Why a waypost job's record says a stop cue ended this run (its
    stage's name and the cue); None when it doesn't."""
    from waypost.state import lifecycle
    directory = _record_dir(job, step_param)
    return None if directory is None else lifecycle.stopped_run(directory, os.environ.get(manifest.RUN_ID_ENV))


def _record_dir(job, step_param: str) -> str | None:
    """The directory of a waypost job's record (its step spec's stage
    directory); None for a job waypost doesn't run."""
    line = getattr(job.params, step_param, None)
    if not isinstance(line, str):
        return None
    try:
        return wspec.decode(line).stage_dir
    except wspec.SpecError:
        return None


def _quiet_script_dates() -> None:
    """Snakemake's code trigger also reruns a ``script:``/``notebook:`` job
    whose script is newer than its outputs (``Job.outputs_older_than_script_or_notebook``,
    asked of every job: a method of the class): it says nothing of a job
    whose workflow's waypost says the files decide (``quiet_triggers``).
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


def _keep_inputs_for_functions(snake: Snake, rule) -> None:
    """A job's params, resources and priority functions see its inputs
    whether or not the job's input function gave them (``Snake.inputs_for_functions``).
    Once per rule, however many of waypost's input functions it has."""
    if rule.name in snake.keeps_inputs:
        return
    snake.keeps_inputs.add(rule.name)
    expand_params, expand_resources, expand_priority = rule.expand_params, rule.expand_resources, \
        rule.expand_priority

    def params(wildcards, input, *args, **kwargs):
        return expand_params(wildcards, snake.inputs_for_functions(rule, wildcards, input), *args, **kwargs)

    def resources(wildcards, input, *args, **kwargs):
        return expand_resources(wildcards, snake.inputs_for_functions(rule, wildcards, input), *args, **kwargs)

    def priority(wildcards, input, *args, **kwargs):
        return expand_priority(wildcards, snake.inputs_for_functions(rule, wildcards, input), *args, **kwargs)
    rule.expand_params, rule.expand_resources, rule.expand_priority = params, resources, priority


def _waiting_inputs(snake: Snake, stage: str, wildcards) -> dict:
    """A job's inputs when some wait for a checkpoint (instances it finds:
    ``wp.parts``, or the rule's own ``checkpoints.X.get``): each such input
    is the checkpoint's output under its own name, as in plain Snakemake,
    so the job waits for the checkpoint and Snakemake asks again once it ran."""
    resolved = {}
    for name, item in snake.items[stage]:
        try:
            resolved[name] = _resolve_item(item, wildcards)
        except Waiting as exc:
            resolved[name] = exc.targetfile
    return resolved


def _as_written(items: list[tuple[str, object]], wildcards: set[str]) -> dict:
    """A rule's inputs (``_input_items``) by name, as its input function would
    give them, for Snakemake to fill: a ``wp.stage`` input that is a
    pattern of the rule's wildcards becomes that pattern (a function costs
    Snakemake more per job than a pattern)."""
    def written(item):
        as_pattern = getattr(item, "as_pattern", None)
        found = as_pattern("instance" in wildcards) if as_pattern else None
        return found if _fills(found, wildcards) else item

    def listed(item: list):
        entries = [written(i) for i in item]
        if not any(callable(entry) for entry in entries):
            return entries
        # Snakemake takes no function inside a list: one function for the list
        return presigned(lambda wildcards: _resolve_item(entries, wildcards))
    return {label: listed(item) if isinstance(item, list) else written(item) for label, item in items}


def _fills(pattern, wildcards: set[str]) -> bool:
    """Is ``pattern`` a path that ``str.format`` fills with a job's wildcard
    values, each of its fields one of ``wildcards``?"""
    return isinstance(pattern, str) and bool(_PLAIN_FIELDS.fullmatch(pattern)) \
        and set(_FIELD.findall(pattern)) <= wildcards


def _input_items(rule, root: str) -> list[tuple[str, object]]:
    """A rule's inputs as written, in their order: (name, a pattern or a
    function of the wildcards, or a list of them) each."""
    items, ranges = [], {start: (label, end) for label, (start, end) in rule.input._names.items()}
    index = 0
    while index < len(rule.input):
        label, end = ranges.get(index, (None, None))
        end = index + 1 if end is None else end
        group = [_pattern(item, root) for item in rule.input[index:end]]
        for item in group:
            if callable(item) and is_flagged(item, "unpack"):
                raise StageError(f"rule {rule.name}: unpack() in a stage rule's input: name its inputs instead")
        # (an unnamed input is one item: Snakemake flattens a list written unnamed)
        items.append((label or f"_{index}", group[0] if end - index == 1 else group))
        index = end
    return items


def _flagged_apart(rule, root: str) -> str | None:
    """The first flag (``pipe()``, ``service()``, ``storage()``) of a rule's
    outputs that keeps its jobs from a record; None without one (on a gs://
    root, its files are storage objects in the root's bucket: those are waypost's)."""
    flagged = sorted({flag for f in rule.output for flag in ("pipe", "service", "storage_object")
                      if is_flagged(f, flag) and not (flag == "storage_object" and _in_the_root(f, root))})
    return f"{flagged[0].replace('_object', '')}()" if flagged else None


def as_plain_on_the_bucket(snake: Snake, name: str, runs: bool = True) -> None:
    """On a gs:// root, a rule that runs as plain Snakemake runs it (no
    record: ``own_layout_refusal``): its files, in the bucket, are fetched
    and stored by Snakemake itself around its jobs, as with any storage
    plugin (waypost's plugin leaves that to the step runner, for the rules
    it records), and its jobs see their local copies. Its declared files
    are given such storage objects now; those its functions give, as each
    job is made (its path modifiers). A rule that runs nothing (``runs``
    False: a target rule, one that only touches its outputs) has only its
    outputs so: its inputs are never fetched."""
    rule = snake.workflow.get_rule(name)
    for files in (rule.input, rule.output, rule.log) if runs else (rule.output,):
        _retrieve(files, snake.root)
    if runs:
        benchmark_on_the_bucket(snake, rule)
    for kind in ("input_modifier", "output_modifier", "log_modifier") if runs else ():
        modifier = getattr(rule, kind, None)
        if modifier is not None:
            setattr(rule, kind, _Retrieving(modifier, snake.root))


def benchmark_on_the_bucket(snake: Snake, rule) -> None:
    """On a gs:// root, a rule's ``benchmark:`` file is Snakemake's to
    store in the bucket (it measures the job and writes the file after it),
    whether or not the job's step has a record."""
    if rule.benchmark is not None:
        _retrieve([rule.benchmark], snake.root)
    if getattr(rule, "benchmark_modifier", None) is not None:
        rule.benchmark_modifier = _Retrieving(rule.benchmark_modifier, snake.root)


def _retrieve(files, root: str) -> None:
    """Each of a rule's files in the root's bucket ``_retrieved``, in place."""
    for f in files:
        if not callable(f) and is_flagged(f, "storage_object") and _in_the_root(f, root) \
                and not f.flags["storage_object"].retrieve:
            f._file = _retrieved(f._file)


def fetch_checkpoint_folders() -> None:
    """On a gs:// root: once a checkpoint's job is done, the local copy of
    each of its ``directory()`` outputs is made the bucket's as the
    Snakefile asks for it (``checkpoints.NAME.get(...)``), so that a
    ``glob_wildcards`` over it finds what the job wrote, on any machine and
    however many of the copy's files Snakemake removed since (it removes a
    storage input's local copy once its jobs are done). Once per output per
    process."""
    from snakemake.checkpoints import Checkpoint
    if getattr(Checkpoint.get, "waypost", False):
        return
    original, fetched = Checkpoint.get, set()

    def get(self, **wildcards):
        job = original(self, **wildcards)
        for path in job.output:
            if is_flagged(path, "directory") and is_flagged(path, "storage_object") and str(path) not in fetched:
                fs, name = stores.filesystem(str(path.storage_object.query))
                stores.fetch_folder(fs, name, os.path.abspath(str(path)))
                fetched.add(str(path))
        return job
    get.waypost = True
    Checkpoint.get = get


def _retrieved(path):
    """``path`` (flagged with a storage object of waypost's plugin) flagged
    with one that Snakemake fetches and stores itself instead."""
    from snakemake.io import AnnotatedString

    from snakemake_storage_plugin_waypost import RetrievedStorageObject
    found = path.flags["storage_object"]
    fresh = AnnotatedString(str(path))
    fresh.flags.update(path.flags)
    fresh.flags["storage_object"] = RetrievedStorageObject(query=found.query, provider=found.provider,
                                                           keep_local=found.keep_local, retrieve=True)
    return fresh


class _Retrieving:
    """A rule's path modifier whose gs:// root files are ``_retrieved``."""

    def __init__(self, inner, root: str):
        self.inner, self.root = inner, root

    def modify(self, path, property=None):
        modified = self.inner.modify(path, property)
        if not callable(modified) and is_flagged(modified, "storage_object") and _in_the_root(modified, self.root) \
                and not modified.flags["storage_object"].retrieve:
            return _retrieved(modified)
        return modified

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _named(path) -> str:
    """A job's file as its job names it: its path, or on a gs:// root its URL."""
    return str(path.storage_object.query) if is_flagged(path, "storage_object") else str(path)


def _in_the_root(path, root: str) -> bool:
    """Is a rule's file one that Snakemake put in a gs:// root's bucket
    (its default storage, waypost's plugin; not a ``storage()`` of its own)?"""
    found = path.storage_object
    return stores.needs_mirror(root) and str(found.query).startswith(root.rstrip("/") + "/") \
        and type(found).__module__.split(".")[0] == f"snakemake_storage_plugin_{stores.PROVIDER}"


def _pattern(path, root: str) -> str:
    """A rule's file as the rule wrote it (on a gs:// root Snakemake makes
    it a storage file whose query is its URL under ``root``)."""
    if is_flagged(path, "storage_object"):
        return path.storage_object.query[len(root.rstrip("/")) + 1:]
    return path


def _resolve_item(item, wildcards):
    values = dict(wildcards.items())
    if isinstance(item, list):
        found = [path for entry in item for path in _as_list(
            entry(wildcards) if callable(entry) else apply_wildcards(entry, values))]
    else:
        found = item(wildcards) if callable(item) else apply_wildcards(item, values)
    # One path stays a string: Snakemake makes a list of each named list.
    return found if isinstance(found, str) else list(found)


def _map_param_functions(rule, mirror: str) -> None:
    """On a bucket root: a params function that takes the job's ``input``
    or ``output`` gets their local copies (``local_files``), as the
    command does, so a path it builds (``--out={output.model}.tmp``) is
    one the step can open."""
    for index, param in enumerate(rule.params):
        if not callable(param):
            continue
        takes = set(inspect.signature(param).parameters) & {"input", "output"}
        if takes:
            rule.params[index] = _with_local_files(param, takes, mirror)
            for name, (start, end) in list(rule.params._names.items()):
                if start == index and end is None:
                    rule.params._set_name(name, index)   # a named param is an attribute too


def local_files(files, mirror: str | None):
    """A job's files (a Namedlist of plain strings, as a rule's run function
    or a params function gets them) with each gs:// URL replaced, whole, by
    its local copy under ``mirror``: what the step works on. ``files`` as
    they are on a local root (``mirror`` None)."""
    if not mirror:
        return files
    from snakemake.iocontainers import Namedlist
    return Namedlist(toclone=files, custom_map=lambda f: stores.local_of(mirror, f))


def _with_local_files(function, names: set[str], mirror: str):
    """``function`` (a params function) given its job's files' local copies.
    One that reads an input (its size, its first line) finds it there: where
    the bucket has it, it is fetched as Snakemake fetches a storage input;
    where it doesn't yet (its job has not run), the function's
    FileNotFoundError names the input's URL, which Snakemake takes for an
    input not made yet (the param is evaluated again once it is)."""
    def mapped(*args, **kwargs):
        urls = {stores.local_of(mirror, url): url for url in kwargs.get("input", ())}
        for name in names:
            if name in kwargs:
                kwargs[name] = local_files(kwargs[name], mirror)
        while True:   # (each input fetched at most once: ``urls`` shrinks)
            try:
                return function(*args, **kwargs)
            except FileNotFoundError as exc:
                url = urls.pop(exc.filename, None)
                if url is None:
                    raise
                if not _fetched(url, exc.filename):
                    raise FileNotFoundError(exc.errno, exc.strerror, url) from None
    mapped.__signature__ = inspect.signature(function)
    return mapped


def _fetched(url: str, local: str) -> bool:
    """Fetch an input in the bucket to its local copy; False when the bucket doesn't have it."""
    fs, name = stores.filesystem(url)
    fs.invalidate_cache(name)
    if not fs.exists(name):
        return False
    stores.download(fs, [name], [local])
    return True


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
        {name: local_files(getattr(job, name)._plainstrings(), mirror) for name in ("input", "output", "log")}
    if in_stage:
        names = {name: absolute(files) for name, files in names.items()}
    line = with_restart(spec_line, lambda text: job.format_wildcards(text, **names))
    return job.format_wildcards(step, **names, **{SPEC_LINE: line})


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


def _runner_head(runner_line: str) -> str:
    """The step's first line: the runner, reading its here-document."""
    return f"exec {runner_line} <<'{wspec.DELIMITER}'"


def as_written(ran: str, runner: str) -> str:
    """A step's command as Snakemake's ``shell`` ran it (its prefix, the
    step runner ``runner`` reading its here-document, its suffix) with the
    here-document replaced by the rule's command it carries: what plain
    Snakemake runs for the rule, and says it ran when it fails."""
    head, last = _runner_head(runner) + "\n", f"\n{wspec.DELIMITER}"
    start, end = ran.find(head), ran.rfind(last)
    after = ran[end + len(last):]   # the suffix, after the line that ends the here-document
    if start < 0 or end < start or after[:1] not in ("", "\n"):
        return ran
    _, _, command = ran[start + len(head):end].partition("\n")   # (after the spec's line)
    return (ran[:start] + command + after[1:]).strip()


def _shell_run_func(snake: Snake, original, head: str, runner: str, mirror: str | None, step_param: str,
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


def _local_path(source) -> str:
    """The path of a Snakemake source file or directory (a LocalSourceFile)."""
    return getattr(source, "path", None) or str(source)


def _as_list(found) -> list:
    return [found] if isinstance(found, str) else list(found)
