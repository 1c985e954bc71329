"""The adapter between Snakemake's workflow and waypost's planning: ``Snake``
answers what the stage graph, the resolver and the state view need of one
Snakefile's workflow (its rules, their files, the DAG, checkpoints,
resources). How its rules become steps: ``rules``; what it touches below
Snakemake's public API: ``internals``.
"""

from __future__ import annotations

import os
import re

from snakemake.exceptions import IncompleteCheckpointException, WorkflowError
from snakemake.io import apply_wildcards, strip_wildcard_constraints
from snakemake.iocontainers import Wildcards

from waypost import stores
from waypost.model import manifest
from waypost.planning.wiring import internals
from waypost.planning.wiring.bucket import rule_pattern
from waypost.planning.wiring.steps import LocalSteps, evaluating_in

Waiting = IncompleteCheckpointException   # an instance set a checkpoint still has to find
_PLAIN_FIELDS = re.compile(r"(?:[^{}]|\{\w+\})*")   # a pattern str.format can fill
_FIELD = re.compile(r"\{(\w+)\}")


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
    if internals.job_process(workflow):   # a cluster job (or a job's subprocess): its main process decided
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
        try:
            internals.check()
        except internals.UntestedSnakemake as exc:
            raise WorkflowError(str(exc)) from None
        self.workflow = workflow
        self.graph = None   # the stage graph and the root, once the config is read (attach)
        self.root = ""
        self.job_process = internals.job_process(workflow)
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
        self.declared_places: list | None = None   # every rule's files' patterns (``jobfiles._declared_places``)
        self.keeps_inputs: set[str] = set()   # rules whose functions see their inputs (``rules._keep_inputs_for_functions``)
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
        """Tell the graph which rule the helpers are called in (``graph.current``)."""
        internals.note_rule_names(self.workflow, lambda name: setattr(self.graph, "current", name))

    def current_basedir(self) -> str:
        """The directory of the Snakefile being read; when a rule's command
        is evaluated as its job runs (``command_now``), the rule's."""
        if not self.workflow.included_stack:
            running = evaluating_in()
            if running is not None:
                return running
        return local_path(self.workflow.current_basedir)

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
            self._outputs[stage] = [rule_pattern(p, self.root) for p in self.workflow.get_rule(stage).output]
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
            path = name if os.path.isabs(name) else os.path.join(local_path(rule.basedir), name)
            readable = "{" not in name and os.path.isfile(path)
            return "script", path if readable else name, readable
        return "run", rule.run_func_src or ""

    def shell_of(self, stage: str) -> dict:
        """How Snakemake's ``shell`` runs a stage's command: its executable
        (the rule's ``shell_exec`` resource, else ``shell.executable()``'s),
        prefix (``set -euo pipefail; `` for bash, or ``shell.prefix()``'s) and suffix."""
        from snakemake.shell import shell
        executable = self.shell_exec.get(stage) or shell.get_executable()
        prefix, suffix = internals.shell_prefix_suffix(executable)
        return {"executable": executable, "prefix": prefix, "suffix": suffix}

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
        return [p for paths in resolved.values() for p in as_list(paths)]

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
        its record (``triggers.with_triggers``). A job the rule can't make now
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
        return {name: resolve_item(item, wildcards) for name, item in self.items[stage]}

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
        """The rule's own ``retries:`` (0 where the rule names none and a
        profile's or ``--retries`` applies)."""
        return internals.own_retries(self.workflow.get_rule(name)) or 0

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
        rule.resources.update(internals.overwritten_resources(self.workflow, stage))

    def worker_class(self, stage: str) -> str | None:
        """The worker class a rule names (``resources: worker=...``),
        taken out of its resources."""
        worker = internals.resource_entries(self.workflow.get_rule(stage).resources).pop("worker", None)
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
        defaults = internals.resource_entries(internals.default_resources(self.workflow))
        return {key: (None if resource.is_evaluable() else resource.value)
                for key, resource in internals.resource_entries(self.workflow.get_rule(name).resources).items()
                if not key.startswith("_") and defaults.get(key) != resource}

    def fill_gaps(self, name: str, resources: dict) -> None:
        """Put a worker class's resources into a rule that is not a stage,
        where it wrote none of its own (its own, and ``--set-resources``, win)."""
        own = self.own_resources(name)
        self.fill_resources(name, {key: value for key, value in resources.items() if key not in own})


def resolve_item(item, wildcards):
    values = dict(wildcards.items())
    if isinstance(item, list):
        found = [path for entry in item for path in as_list(
            entry(wildcards) if callable(entry) else apply_wildcards(entry, values))]
    else:
        found = item(wildcards) if callable(item) else apply_wildcards(item, values)
    # One path stays a string: Snakemake makes a list of each named list.
    return found if isinstance(found, str) else list(found)


def local_path(source) -> str:
    """The path of a Snakemake source file or directory (a LocalSourceFile)."""
    return getattr(source, "path", None) or str(source)


def as_list(found) -> list:
    return [found] if isinstance(found, str) else list(found)
