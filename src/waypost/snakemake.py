"""The helper API a Snakefile's rules use: a stage is said once, by its rule's name.

A stage rule is a plain Snakemake rule whose outputs are ``wp.out(...)``: the
rule's name is the stage, and its directory, the inputs it takes in presence
mode, its worker class's resources, the step runner around its shell command
and the default targets all derive from that name when ``wp.finish()`` reads
the rules at the end of the Snakefile. In a rule's body the helpers know
which rule they are in (``Pipeline`` notes each rule's name as Snakemake
starts defining it), so a rule names other stages only where it reads them
(``wp.stage(...)``): a rule copied under a new name writes into its own
stage directory and no other.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import string
import sys
import time
from dataclasses import dataclass, field

from snakemake.exceptions import IncompleteCheckpointException
from snakemake.io import apply_wildcards, is_flagged, strip_wildcard_constraints
from snakemake.iocontainers import Wildcards

from . import config as wconfig
from . import events, fanout, layout, lifecycle, manifest, reuse, runner, stores
from . import spec as wspec
from . import workers as wworkers
from .stores import gcs

REUSE_CLASS = "cpu"   # the worker class reuse jobs get, when the pool has it
#: Set by ``waypost`` when it only reads the workflow's facts (see graph), to
#: the file they go to: the rules are read, nothing of the config is checked,
#: no bucket is touched.
FACTS_ONLY_ENV = "WAYPOST_FACTS_ONLY"
STEP_PARAM = "waypost"   # the param holding a stage job's step spec (waypost.spec)

# Snakemake internals this module relies on (tested with snakemake 9.27; the
# range pinned in pyproject.toml). Everything else it uses is public.
# - shell._get_process_prefix(executable), shell._process_suffix: the prefix
#   and suffix ``shell.prefix()``/``shell.suffix()`` set (no public getter),
#   which the step runner puts around the step's command (``_snakemake_shell``);
# - Rule._input, Rule.dependencies, Rule.input._names, Rule.params._names and
#   Namedlist._set_name (a params function replaced: ``_map_param_functions``),
#   Rule.resources._data, Rule.input_modifier/output_modifier: ``_wire``
#   replaces a stage rule's inputs with one function;
# - Rule.run_func and the RULEFUNC_CONTEXT_MARKER parameter of a rule's run
#   function: ``_shell_run_func``;
# - checkpoints (see waypost.fanout): workflow.globals["checkpoints"],
#   Rule.is_checkpoint, IncompleteCheckpointException.targetfile (an input
#   that waits for a checkpoint is its output, as Snakemake's own handler makes it).


class StageError(Exception):
    """A stage rule written in a way waypost can't run; the message names the rule."""


@dataclass
class Stage:
    """What a stage rule declared through the helpers."""
    name: str
    funnel: bool = False          # once per experiment, over all its axis values
    instances: object = None      # experiment → instance names, for a stage with instances
    parents: set = field(default_factory=set)
    order: int = 0
    gathers: bool = False         # it reads every instance of a stage (wp.each): made from a set of them
    gathered: set = field(default_factory=set)   # the stages it gathers (wp.each)


def _job_process(workflow) -> bool:
    """Is this Snakemake process one job's own (on a cluster node, or a
    job's subprocess), rather than the run's main process?"""
    return getattr(workflow, "remote_exec", False) or getattr(workflow, "subprocess_exec", False)


def run_identity(workflow) -> str:
    """The run id that every job of this run records.

    Snakemake's main process makes a new one and exports it; its jobs
    inherit it: local jobs as its children, cluster jobs through the executor
    (the Slurm plugin submits with ``--export=ALL``, and it is registered as
    one of the workflow's ``envvars``, which Snakemake hands to the remote
    jobs of any executor). The step runner reads it from its environment: an
    earlier attempt of the same run in its stage directory means Snakemake is
    retrying the job. (A job's code version is its own stage's: see
    ``Pipeline.stage_code_version``.)
    """
    # A cluster job (or a job's subprocess): its main process decided.
    if _job_process(workflow):
        if manifest.RUN_ID_ENV not in os.environ:
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(f"this job's Snakemake process did not inherit {manifest.RUN_ID_ENV} from the "
                                "run that started it: its executor must pass the environment to its jobs")
        return os.environ[manifest.RUN_ID_ENV]
    os.environ[manifest.RUN_ID_ENV] = manifest.new_run_id()
    workflow.register_envvars(manifest.RUN_ID_ENV)
    return os.environ[manifest.RUN_ID_ENV]


class Pipeline:
    """A waypost pipeline: ``wp = Pipeline(config, workflow, axis="dataset")``
    at the top of the Snakefile, ``wp.finish()`` after the stage rules.

    It loads the config (``config/config.yaml`` unless Snakemake was given
    ``--configfile``), validates it against waypost's schema merged with the
    workflow's own, and answers the rules' helpers.

    ``axis``: the word for the per-experiment axis, if the workflow has one
    (``pair``: an experiment lists its ``pairs``, overrides go under
    ``per_pair``, rules see ``{wildcards.pair}``, the CLI takes ``--pair``);
    ``axis_key`` when the list's name is not the word plus "s".

    The default config file is read here rather than by a ``configfile:``
    directive so that a YAML error names the file, line and column; config
    files given with ``--configfile`` are loaded by Snakemake as usual, and
    ``--config KEY=VALUE`` overrides apply on top of either.
    """

    def __init__(self, config: dict, workflow, axis: str | None = None, axis_key: str | None = None,
                 default_configfile: str = "config/config.yaml"):
        self.workflow = workflow
        self.workflow_dir = workflow.basedir
        self.axis = wconfig.Axis.of(axis, axis_key)
        if (self.axis and not layout.is_valid_name(self.axis.word)) or (self.axis and self.axis.word in (
                "experiment", "instance", STEP_PARAM)):
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(f"Pipeline(axis={axis!r}): expected a word of letters, digits or '_' "
                                "other than experiment, instance and waypost")
        self.axis_wc = self.axis.word if self.axis else None   # the axis's wildcard name
        # A cluster job's own Snakemake process: its main process validated the
        # same files when it submitted the job (and jsonschema is slow to import).
        check = not getattr(workflow, "remote_exec", False)
        self.facts_only = os.environ.get(FACTS_ONLY_ENV)
        # The pipeline's top directory (above workflow/, the usual layout, or the
        # Snakefile's own): code versions name files relative to it, so a
        # moved checkout has the same code.
        self.repo_dir = wconfig.pipeline_dir(self.workflow_dir)
        try:
            # One precedence with or without --configfile: the config file,
            # then the reuse/ files beside it, then --config KEY=VALUE.
            if workflow.configfiles:
                self.configfile = str(workflow.configfiles[-1])
                loaded, source = wconfig.with_reuse_files(dict(config), self.configfile)
            else:
                self.configfile = default_configfile
                loaded, source = wconfig.with_reuse_files(wconfig.load_yaml(default_configfile), default_configfile)
            # (``config_settings.config``: --config alone; ``overwrite_config``
            # also holds the --configfile contents.)
            loaded = wconfig.merge(loaded, dict(workflow.config_settings.config or {}))
            if self.facts_only:   # the rules are what is asked for: any config will do
                loaded = {"experiments": {}}
            prepared = wconfig.prepare(loaded, self.workflow_dir, source, check=check and not self.facts_only,
                                       axis=self.axis)
        except wconfig.ConfigError as exc:
            # A clean one-paragraph error from Snakemake, before any job runs.
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(str(exc)) from None
        self.source = source
        config.clear()
        config.update(prepared)
        self.config = config
        self.root = config["root"]
        # On a gs:// root Snakemake sees stage files through waypost's storage
        # plugin: rules' paths are relative to the root (the storage prefix),
        # jobs get gs:// URLs, and the step runner works on a local copy of
        # the bucket, ``self.mirror`` (see stores.mirror).
        self.mirror = None
        if stores.needs_mirror(self.root) and not self.facts_only:
            from .stores import mirror
            self.mirror = mirror.planning_mirror(self.root, workflow)
        self.base = "" if stores.needs_mirror(self.root) else self.root
        self.presence = config["rerun_policy"] == "presence"
        run_identity(workflow)   # the runner reads the run id itself
        self._code_versions: dict[str, str] = {}   # stage → its code version (see stage_code_version)
        self._file_digests: dict[str, bytes] = {}
        self._commands: dict[str, str] = {}   # stage → its rule's shell command as written
        self.python = sys.executable
        # How a stage job starts the step runner (braces doubled: the line is
        # part of the rule's command, which Snakemake formats).
        self._runner = shlex.join(runner.command(self.python)).replace("{", "{{").replace("}", "}}")
        self._shell_exec: dict[str, str] = {}   # stage → its rule's own shell_exec resource
        self.pool = config["pool"]
        self.workers = {"pools": {}} if self.facts_only else self._load_workers(
            wworkers.pools_file(config.get("workers"), self.repo_dir), check)
        self.stages: dict[str, Stage] = {}   # stage rules, as their helpers declared them
        self._current: str | None = None     # the rule Snakemake is defining now
        self._finished = False
        self._forced: set | None = None   # see _forced_stages
        self._lives: dict[str, lifecycle.Life] = {}   # see _life
        self._store = None   # the root's store, for a root read directory by directory (_life)
        self._items: dict[str, list] = {}   # stage → its rule's inputs as written (see _inputs_of)
        self._set_changes: dict[str, str | None] = {}   # stage dir → how its set of inputs changed
        self._on_hold: list[str] = []       # see _held
        self._pending: dict = {}            # checkpoint outputs that instances wait for (see _stage_outputs)
        self._fanout = fanout.Planning(self)   # the checkpoints that ran, the stages made from their parts
        self._dim_checks: list[tuple] = []     # dimensions the rules name, checked by finish (_check_parts)
        self._unchecked: dict[str, list] = {}  # experiment → instances known, when a checkpoint finds more
        self._default_class: dict[str, str] = {}   # stage → the worker class its rule names
        self._rule_resources: dict[str, object] = {}   # stage rules whose resources are still to fill
        self._own: dict[str, tuple] = {}   # stage → patterns of its marker and outputs
        # Per (experiment, scope, stage), where the scope is the axis value when
        # the experiment's overrides or reuse name it, else None (all its other
        # values and its funnels are alike): computed once each.
        self._named_pairs = {name: set(spec.get("per_pair", {})).union(
            *(where for where in spec.get("reuse", {}).values() if isinstance(where, dict)))
            for name, spec in config["experiments"].items()}
        # Per instance, only where an experiment's per_instance overrides match
        # it (see _scope); a grid point's own values on top (see _point).
        self._overridden = {name: bool(spec.get("per_instance")) for name, spec in config["experiments"].items()}
        self._overridden_by: dict[str, list[str]] = {name: [] for name in config["experiments"]}   # see finish
        self._matched: dict[tuple, tuple] = {}
        self._points = {name: wconfig.points(config, name) for name in config["experiments"]}
        self._point_keys: dict[str, set] = {}
        self._settings: dict[tuple, dict] = {}
        self._policies: dict[tuple, object] = {}
        self._tolerated: dict[tuple, bool] = {}
        self._reusing = {name: set(spec.get("reuse", {})) for name, spec in config["experiments"].items()}
        self._reused = set().union(*self._reusing.values())
        self._step_options: dict[tuple, str] = {}
        self._resources: dict[tuple, dict] = {}   # (stage, experiment, scope, attempt) → resources
        constraints = {"experiment": layout.NAME_PATTERN, "instance": layout.NAME_PATTERN}
        if self.axis_wc:
            constraints[self.axis_wc] = layout.NAME_PATTERN
        workflow.global_wildcard_constraints(**constraints)
        self._note_rule_names(workflow)

    def _note_rule_names(self, workflow) -> None:
        """Know which rule the helpers are called in: Snakemake evaluates a
        rule's ``@workflow.rule(name=...)`` decorator before its input,
        output and params, and ``decorate`` after them."""
        define = workflow.rule

        def rule(*args, **kwargs):
            name = kwargs.get("name", args[0] if args else None)
            decorate = define(*args, **kwargs)
            self._current = name

            def defined(ruleinfo):
                try:
                    return decorate(ruleinfo)
                finally:
                    self._current = None
            return defined
        workflow.rule = rule

    def _load_workers(self, path: str, check: bool) -> dict:
        try:
            workers = wworkers.load(path, check)
            if self.pool not in workers["pools"]:
                hint = (" (waypost's own pools file: add config/workers.yaml with that pool)"
                        if path == wworkers.PACKAGE_FILE else "")
                raise wconfig.ConfigError(f"config: pool {self.pool!r} is not in {path}{hint} "
                                          f"(expected one of: {', '.join(workers['pools'])})")
        except wconfig.ConfigError as exc:
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(str(exc)) from None
        return workers

    # --- names -----------------------------------------------------------
    @property
    def experiments(self) -> list[str]:
        return list(self.config["experiments"])

    def axis_values(self, experiment: str) -> list[str]:
        """The experiment's values of the workflow's axis (its ``pairs``, say)."""
        return list(self.config["experiments"][experiment]["pairs"])

    def instances(self, stage: str, experiment: str, pair: str | None = None) -> list[str]:
        """The instance names of a stage with instances, in an experiment
        (and for one axis value, ``pair``, when the stage's function takes
        it: teachers per language pair). Without ``pair``: every name any
        of the experiment's axis values has."""
        spec = self.stages[stage].instances
        if not callable(spec):
            return [str(name) for name in spec]
        if not _takes_axis_value(spec):
            return [str(name) for name in spec(experiment)]
        pairs = [pair] if pair is not None else (self.axis_values(experiment) if self.axis_wc else [layout.ALL_PAIRS])
        return list(dict.fromkeys(str(name) for value in pairs for name in spec(experiment, value)))

    def _pair(self, wildcards) -> str:
        """A job's axis value (the engine's ``pair``): ``_all`` for a funnel."""
        return wildcards.get(self.axis_wc, layout.ALL_PAIRS) if self.axis_wc else layout.ALL_PAIRS

    def _values(self, experiment: str, pair: str, instance: str | None = None) -> dict:
        """Wildcard values of a job (for the patterns of its files)."""
        values = {"experiment": experiment, "instance": instance}
        if self.axis_wc:
            values[self.axis_wc] = pair
        return values

    # --- declaring a stage, in its rule ----------------------------------
    def _declaring(self, helper: str) -> Stage:
        """The stage of the rule being defined (a helper that names no stage
        is only used in a rule's body)."""
        if self._current is None:
            raise StageError(f"wp.{helper}() is used in a rule's input, output or params: it stands for that "
                             "rule's stage (outside a rule, use wp.path_of(stage, ...))")
        if self._current not in self.stages:
            self.stages[self._current] = Stage(self._current, order=len(self.stages))
        return self.stages[self._current]

    def out(self, filename: str, instances=None, funnel: bool = False) -> str:
        """An output of this rule's stage: ``filename`` in its stage directory,
        ``{root}/{pair}/{experiment}/{stage}[/{instance}]/filename``.

        ``instances``: the stage runs once per instance (a list of names,
        or a function giving them: of the experiment, or of the experiment
        and the axis value, for a number that differs per pair): its
        directory has one subdirectory each, and ``{wildcards.instance}``
        names the job's. Also ``wp.parts(...)`` (the files a checkpoint
        stage found) and ``wp.dims(...)`` (named dimensions).
        ``funnel=True``: the stage runs once per experiment over all its axis
        values (a report, a summary): its directory is under ``_all``.
        Said on one output, either holds for the rule's others."""
        if not isinstance(filename, str) or not filename or filename.startswith("/") or ".." in filename.split("/"):
            raise StageError(f"rule {self._current}: wp.out({filename!r}): expected a file name inside the "
                             "stage's directory")
        stage = self._declaring("out")
        if instances is not None:
            if stage.instances is not None and stage.instances is not instances:
                raise StageError(f"rule {stage.name}: its outputs name different instances")
            stage.instances = instances
            if isinstance(instances, fanout.Parts | fanout.Dims) and instances.rule is None:
                instances.rule = stage.name   # (written before the rule: its messages name it)
            stage.parents.update(parts.stage for parts in fanout.checkpoint_parts(instances))
        stage.funnel = stage.funnel or funnel
        return self._own_path(stage, filename)

    def _path(self, stage: str, filename: str, funnel: bool, instance: str | None,
              pair: str | None = None) -> str:
        slot = layout.ALL_PAIRS if funnel or not self.axis_wc else (pair or "{" + self.axis_wc + "}")
        return layout.join(self.base, slot, "{experiment}", stage, *([instance] if instance else []), filename)

    def _own_path(self, stage: Stage, filename: str) -> str:
        """Pattern of a file in a stage's own directory (with ``{instance}``
        when it has instances)."""
        return self._path(stage.name, filename, stage.funnel, "{instance}" if stage.instances is not None else None)

    def stage(self, stage: str | tuple, filename, instance: str | None = None):
        """An input from another stage: its output ``filename`` for the same
        experiment (and axis value, unless it is a funnel), of the instance
        ``instance``, or of this job's own instance when both stages have
        them; or ``filename`` a function of the wildcards returning paths
        (see ``path_of``; ``stage`` may then be a tuple of the stages it
        picks from). Only names the stage read from: a wrong name
        reads the wrong files, it writes nothing there.

        When this stage's instances have named dimensions (``wp.parts``,
        ``wp.dims``), ``filename`` and ``instance`` may hold them as
        placeholders: ``wp.stage("split", "parts/{part}.txt")`` is this
        job's part, ``instance="{teacher}"`` the instance of its teacher."""
        consumer = self._declaring("stage")
        named = [stage] if isinstance(stage, str) else list(stage)
        for name in named:
            consumer.parents.add(layout.check_name(name, "stage"))
        if callable(filename):
            return _presigned(filename)
        if len(named) != 1:
            raise StageError(f"rule {consumer.name}: wp.stage({stage!r}, {filename!r}): several stages go "
                             "with a function that picks the path")
        placeholders = {field for text in (filename, instance) if isinstance(text, str)
                        for _, field, _, _ in string.Formatter().parse(text) if field}
        placeholders -= {"experiment", "instance", self.axis_wc}
        if placeholders:
            self._dim_checks.append((consumer.name, f"wp.stage({stage!r}, {filename!r})", placeholders, None, None))

        def path(wildcards):
            upstream = self._known(stage, consumer.name)
            own = instance if instance is not None else ("{instance}" if upstream.instances is not None else None)
            if own == "{instance}" and "instance" not in wildcards.keys():  # noqa: SIM118 (a Namedlist: `in` looks at its values)
                raise StageError(f"rule {consumer.name}: wp.stage({stage!r}, {filename!r}): stage {stage} has "
                                 "instances and this one has none: name one (instance=...) or take each (wp.each)")
            pattern = self._path(stage, filename, upstream.funnel, own)
            values = dict(wildcards.items())
            if consumer.instances is not None and fanout.dims_of(consumer.instances):
                return self._with_dims(consumer, pattern, values, f"wp.stage({stage!r}, {filename!r})")
            return pattern.format(**values)
        return _presigned(path)

    def _with_dims(self, consumer: Stage, pattern: str, values: dict, helper: str) -> str:
        """``pattern`` filled with a job's wildcards and its values of its
        stage's dimensions (``{part}``, ``{teacher}``)."""
        dims = fanout.values_of(consumer.instances, values["experiment"], self._pair(values), values.get("instance"))
        try:
            return pattern.format(**{**dims, **values})
        except KeyError as exc:
            raise StageError(f"rule {consumer.name}: {helper}: no dimension {exc.args[0]!r} (rule "
                             f"{consumer.name}'s instances have: {', '.join(fanout.dims_of(consumer.instances))})") \
                from None

    def each(self, stage: str, filename: str, over=None):
        """An input from every job of another stage in this experiment: each
        of its instances, for this job's axis value, or for all of them when
        this stage is a funnel (a summary over the whole study).

        ``over``: a dimension of the other stage's instances (or a list of
        them: see ``dims``) to gather along: of its instances, the ones
        whose other dimensions have this job's values (for each teacher,
        all its parts: ``over="part"`` in a stage with
        ``instances=wp.dims(teacher=...)``, or with one instance per
        teacher). Without it, every instance (both dimensions)."""
        consumer = self._declaring("each")
        layout.check_name(stage, "stage")
        consumer.parents.add(stage)
        consumer.gathers = True
        consumer.gathered.add(stage)
        along = None if over is None else ((over,) if isinstance(over, str) else tuple(over))
        if along is not None and (not along or not all(isinstance(d, str) and d for d in along)):
            raise StageError(f"rule {consumer.name}: wp.each({stage!r}, {filename!r}, over={over!r}): expected "
                             "the name of a dimension, or a list of them")
        if along is not None:
            self._dim_checks.append((consumer.name, None, set(), stage, along))

        def paths(wildcards):
            upstream = self._known(stage, consumer.name)
            pairs = ([layout.ALL_PAIRS] if upstream.funnel or not self.axis_wc else
                     self.axis_values(wildcards.experiment) if consumer.funnel else [self._pair(wildcards)])
            if along is not None:
                return [self.path_of(stage, filename, wildcards.experiment, pair, name) for pair in pairs
                        for name in self._gathered(consumer, upstream, along, wildcards, pair)]
            return [self.path_of(stage, filename, wildcards.experiment, pair, name) for pair in pairs
                    for name in (self.instances(stage, wildcards.experiment, pair)
                                 if upstream.instances is not None else [None])]
        return _presigned(paths)

    def _gathered(self, consumer: Stage, upstream: Stage, along: tuple, wildcards, pair: str) -> list[str]:
        """The instances of ``upstream`` a job of ``consumer`` gathers along
        the dimensions ``along``: those whose other dimensions hold this
        job's values."""
        helper = f"wp.each({upstream.name!r}, ..., over={list(along) if len(along) > 1 else along[0]!r})"
        names = fanout.dims_of(upstream.instances) if upstream.instances is not None else ()
        unknown = [d for d in along if d not in names]
        if unknown:
            raise StageError(f"rule {consumer.name}: {helper}: stage {upstream.name} has no dimension "
                             f"{unknown[0]!r} (its dimensions: {', '.join(names) or 'none: wp.dims(...) names them'})")
        kept = [d for d in names if d not in along]
        values = dict(wildcards.items())
        instance = values.get("instance")
        own = fanout.values_of(consumer.instances, values["experiment"], self._pair(values), instance) \
            if consumer.instances is not None else {}
        if kept and not own and instance is not None and len(kept) == 1 and not fanout.dims_of(consumer.instances):
            own = {kept[0]: instance}   # one instance per value of the one dimension kept
        missing = [d for d in kept if d not in own]
        if missing:
            raise StageError(f"rule {consumer.name}: {helper}: gathering along {', '.join(along)} keeps "
                             f"{', '.join(kept)}, and this stage's instances have no {missing[0]!r} (expected "
                             f"instances=wp.dims({', '.join(f'{d}=...' for d in kept)}))")
        if not kept:   # along every dimension: all of them
            return self.instances(upstream.name, wildcards.experiment, pair)
        combos = upstream.instances.combinations(wildcards.experiment, pair)   # (a Dims: it keeps some)
        return [name for name, dims in combos.items() if all(dims[d] == own[d] for d in kept)]

    def parts(self, stage: str, pattern: str):
        """A stage's instances (``wp.out(..., instances=wp.parts(...))``):
        the files a checkpoint stage (``checkpoint STAGE:``) wrote into its
        ``directory()`` output, found once it ran, named by what the one
        ``{name}`` in ``pattern`` matches (``"parts/{part}.txt"``: instance
        ``00`` for ``parts/00.txt``). ``{part}`` is then a dimension: a
        job reads its own part as ``wp.stage(stage, "parts/{part}.txt")``.
        Found through Snakemake's ``checkpoints.<stage>.get(...)``: a dry run
        plans the checkpoint, and the jobs of the parts appear once it ran."""
        try:
            return fanout.Parts(self, stage, pattern, self._current)
        except fanout.FanoutError as exc:
            raise StageError(str(exc)) from None

    def dims(self, **dimensions):
        """A stage's instances over named dimensions
        (``instances=wp.dims(part=wp.parts(...), teacher=teachers)``): one
        instance per combination, named by its values joined with ``-`` in
        the order written (``00-t1``). Each dimension takes what
        ``instances=`` takes: a list, a function of the experiment (and
        axis value), ``wp.parts(...)``. Its value is a placeholder in this
        rule's ``wp.stage`` file names and instance (``instance="{teacher}"``),
        a param (``wp.dim``), and ``wp.each(..., over=...)`` gathers along it."""
        try:
            return fanout.Dims(self, dimensions, self._current)
        except fanout.FanoutError as exc:
            raise StageError(str(exc)) from None

    def dim(self, name: str):
        """A param of this rule: the job's value of one of its stage's
        dimensions (``params: teacher=wp.dim("teacher")``)."""
        consumer = self._declaring("dim")

        def value(wildcards):
            values = dict(wildcards.items())
            dims = fanout.values_of(consumer.instances, values["experiment"], self._pair(values),
                                    values.get("instance")) if consumer.instances is not None else {}
            if name not in dims:
                raise StageError(f"rule {consumer.name}: wp.dim({name!r}): its instances have no dimension {name!r} "
                                 f"(they have: {', '.join(fanout.dims_of(consumer.instances)) or 'none'})")
            return dims[name]
        return _presigned(value)

    def path_of(self, stage: str, filename: str, experiment: str, pair: str | None = None,
                instance: str | None = None) -> str:
        """The path of one stage file (for functions that pick inputs)."""
        spec = self._known(stage)
        return self._path(stage, filename, spec.funnel, instance, pair or layout.ALL_PAIRS).format(experiment=experiment)

    def _known(self, stage: str, consumer: str | None = None) -> Stage:
        if stage not in self.stages:
            where = f"rule {consumer}: " if consumer else ""
            raise StageError(f"{where}no stage {stage!r}: a stage is a rule with wp.out() outputs "
                             f"(the stages are: {', '.join(self.stages) or 'none yet'})")
        return self.stages[stage]

    def script(self, path: str) -> str:
        """``python SCRIPT`` for a shell command, the script's path taken
        relative to the file the rule is in (as Snakemake's ``script:`` does),
        so the pipeline runs from any directory; its contents count in the
        stage's code version."""
        base = _local_path(self.workflow.current_basedir)
        return "python " + shlex.quote(os.path.normpath(os.path.join(base, path)))

    # --- paths -----------------------------------------------------------
    def present(self, path: str) -> bool:
        """Does a stage file (a path as rules write it) exist? On a gs://
        root: is it in the one listing of the root this planning makes."""
        if self.mirror is None:
            return os.path.exists(path)
        from .stores import gcs
        url = layout.join(self.root, path)
        # (or a directory() output: objects below it)
        return gcs.listed(url) or gcs.filesystem(url)[1] in gcs.directories(self.root)

    def _pattern(self, path) -> str:
        """A rule's output as the rule wrote it (Snakemake turns paths on a
        gs:// root into storage files named by their local copy)."""
        if is_flagged(path, "storage_object"):
            return path.storage_object.query[len(self.root.rstrip("/")) + 1:]
        return path

    def _inputs_of(self, stage: str, items: list):
        """The one input function of a stage rule (``finish`` puts it in place
        of the rule's inputs: ``items`` are (name, item) as the rule wrote
        them, a path pattern or a function of the wildcards each).

        In presence mode a job whose outputs are all present is done: it gets
        no inputs at all, so nothing upstream of it (being rerun, or missing
        in an experiment where its outputs were placed by hand) can make it
        rerun; a job that does get inputs has an output missing, so it runs
        whatever their timestamps.

        waypost's own markers count too, in both modes and whatever
        Snakemake's metadata says (see ``_markers``): a stage left unfinished
        (a failure a funnel went on over, or an attempt whose runner is gone)
        is forced to run again; a provisional one (a funnel over parents that
        did not succeed) gets its inputs, so it is redone when one of them is.

        One input function per rule (not one per input): Snakemake inspects
        every callable of every job, so fewer callables plan faster.
        """
        names = [name for name, _ in items]
        self._items[stage] = items
        gathers = self.stages[stage].gathers

        def job_inputs(wildcards):
            if self.reused_from(stage, wildcards):
                return {name: [] for name in names}  # copied from elsewhere: nothing upstream is needed
            values = dict(wildcards.items())
            dir_pattern, output_patterns = self._own_files(stage)
            redo, recheck = self._markers(dir_pattern.format(**values))
            if not names:   # a stage that reads nothing: only an attempt to redo is said
                if redo:
                    self._force(stage, values)
                return {}
            changed = gathers and not redo and self._set_changed(stage, wildcards) is not None
            if redo or changed:
                self._force(stage, values)
            if self.presence and not (redo or recheck or changed or stage in self._forced_stages()) and all(
                    self.present(p.format(**values) if plain else apply_wildcards(p, values))
                    for p, plain in output_patterns):
                return {name: [] for name in names}
            return self._resolve(stage, wildcards)
        if any(rule.is_checkpoint for rule in self.workflow.rules):
            return _presigned(self._waiting(stage, job_inputs))
        return _presigned(job_inputs)

    def _waiting(self, stage: str, job_inputs):
        """``job_inputs`` of a workflow with checkpoints: an input that waits
        for a checkpoint (instances it finds: ``wp.parts``, or the rule's own
        ``checkpoints.X.get``) is the checkpoint's output under its own name,
        as in plain Snakemake, so the job waits for the checkpoint and
        Snakemake asks again once it ran."""
        def inputs(wildcards):
            try:
                if self.presence and stage in self._fanout.after and not self.reused_from(stage, wildcards) \
                        and self._changed_parts(stage, wildcards):
                    return self._resolve(stage, wildcards)
                return job_inputs(wildcards)
            except IncompleteCheckpointException:
                pass
            resolved = {}
            for name, item in self._items[stage]:
                try:
                    resolved[name] = self._resolve_item(item, wildcards)
                except IncompleteCheckpointException as exc:
                    resolved[name] = exc.targetfile
            return resolved
        return inputs

    def _changed_parts(self, stage: str, wildcards) -> bool:
        """Presence mode: is a done job of a stage made from a checkpoint's
        parts to be redone, because a part it was made from changed (see
        ``fanout.Planning.changed``)? Said once per job; the job is forced."""
        values = dict(wildcards.items())
        stage_dir = self._own_files(stage)[0].format(**values)
        new = stage_dir not in self._fanout._changed
        why = self._fanout.changed(stage, stage_dir)
        if why and new and not self._set_changes.get(stage_dir):   # (one reason said is enough)
            name = layout.stage_name(self._pair(wildcards), values["experiment"], stage, values.get("instance"))
            print(f"waypost: {name}: {why}: redone", file=sys.stderr)
            events.note("parts_changed", stage=name, change=why)
        if why:
            self._force(stage, values)
        return bool(why)

    def _resolve(self, stage: str, wildcards) -> dict:
        """A stage job's inputs, by name, from its rule's items (as written)."""
        return {name: self._resolve_item(item, wildcards) for name, item in self._items[stage]}

    @staticmethod
    def _resolve_item(item, wildcards):
        values = dict(wildcards.items())
        if isinstance(item, list):
            found = [path for entry in item for path in _as_list(
                entry(wildcards) if callable(entry) else apply_wildcards(entry, values))]
        else:
            found = item(wildcards) if callable(item) else apply_wildcards(item, values)
        # One path stays a string: Snakemake makes a list of each named list.
        return found if isinstance(found, str) else list(found)

    def _set_changed(self, stage: str, wildcards) -> str | None:
        """For a stage made from a set of instances (``wp.each``): how the
        inputs it would read now differ from those its manifest says it was
        made from (None: the same, or nothing recorded to compare with: no
        manifest, a reused or adopted stage, none recorded). Said once per job, in the run's
        output: in presence and mtime mode alike, such a stage is redone."""
        stage_dir = self._own_files(stage)[0].format(**dict(wildcards.items()))
        if stage_dir not in self._set_changes and self.mirror is None and not self._made_here(stage_dir):
            self._set_changes[stage_dir] = None   # nothing recorded to compare with: its inputs aren't needed
        if stage_dir not in self._set_changes:
            current = {self._as_recorded(p) for paths in self._resolve(stage, wildcards).values()
                       for p in _as_list(paths)}
            # In a bucket the manifest's object says its set in the listing:
            # read the manifest only when the set differs (or isn't said).
            said = self._listed_input_set(stage_dir)
            data = None if said == manifest.input_set(current) else self._recorded(stage_dir)
            change = None
            if data and data.get("state") == "SUCCESS" and not data.get("reused_from") and not data.get("adopted"):
                recorded = {str(i.get("path")) for i in data.get("inputs") or [] if isinstance(i, dict)}
                # No inputs recorded: not a set the runner made it from (a
                # manifest written by hand or a tool): nothing to compare.
                if recorded and recorded != current:
                    change = (f"made from {len(recorded)} inputs, now {len(current)} "
                              f"({len(current - recorded)} new, {len(recorded - current)} gone)")
                    values = dict(wildcards.items())
                    name = layout.stage_name(self._pair(wildcards), values["experiment"], stage, values.get("instance"))
                    print(f"waypost: {name}: {change}: redone", file=sys.stderr)
                    events.note("set_changed", stage=name, change=change)
            self._set_changes[stage_dir] = change
        return self._set_changes[stage_dir]

    def _made_here(self, stage_dir: str) -> bool:
        """Does a stage directory's manifest say it succeeded, made here
        (not reused, not adopted): the only kind whose set of inputs counts?"""
        data = self._recorded(stage_dir)
        return bool(data) and data.get("state") == "SUCCESS" and not data.get("reused_from") \
            and not data.get("adopted")

    def _listed_input_set(self, stage_dir: str) -> str | None:
        """The set of inputs a bucket's manifest object says it records (its
        metadata, in the planning's listing); None on a local root or when it
        says none."""
        if self.mirror is None:
            return None
        info = gcs.listed_info(layout.join(self.root, stage_dir, layout.MANIFEST))
        return ((info or {}).get("metadata") or {}).get(manifest.INPUT_SET_KEY)

    def _as_recorded(self, path: str) -> str:
        """An input path as a manifest records it (a URL on a bucket root)."""
        return layout.join(self.root, path) if self.mirror else path

    def _life(self, stage_dir: str) -> lifecycle.Life:
        """The lifecycle of a stage directory (a path as rules write it; on
        a bucket root, relative to it), read once per planning: files don't
        change while the DAG is built."""
        if stage_dir not in self._lives:
            if self.mirror is None:
                if self._store is None:   # one store over the root for the whole planning, listing
                    # each directory once (a stage directory not there is known from its parent's;
                    # an unknown mount: said once)
                    self._store = stores.store_for(self.root, snapshot=True)
                life = lifecycle.read(self._store, stage_dir)
                if not life.entries:   # nothing there: asked again, the store's listing answers (kept: fewer objects)
                    return life
                self._lives[stage_dir] = life
            else:
                url = stores.resolve(self.root, stage_dir)
                self._lives[stage_dir] = lifecycle.read(stores.over(url), url)
        return self._lives[stage_dir]

    def _markers(self, stage_dir: str) -> tuple[bool, bool]:
        """(redo, recheck) of a stage directory (``lifecycle.Life.redo`` /
        ``recheck``): an attempt left open, or a series whose next one is
        due, is redone; a stage made over parents that did not succeed, or
        in its backoff, has its inputs looked at again."""
        life = self._life(stage_dir)
        return life.redo, life.recheck

    def _force(self, stage: str, values: dict) -> None:
        """Make Snakemake run this job of ``stage`` whatever its outputs'
        state, as ``--forcerun`` does, but for this one job: its outputs join
        the DAG's forced files (the DAG being built now asks this job's input
        function). Not in a job's own Snakemake process: it runs its job."""
        if _job_process(self.workflow):
            return
        rule = self.workflow.get_rule(stage)
        self.workflow.dag.forcefiles.update(str(f.apply_wildcards(values)) for f in rule.output)

    def _forced_stages(self) -> set[str]:
        """Stages that Snakemake's ``--forcerun RULE`` / ``--forceall`` force,
        and every stage downstream of them: in presence mode their jobs get
        their inputs, so Snakemake redoes what it documents for those flags."""
        if self._forced is None:
            dag = getattr(self.workflow, "dag_settings", None)
            if dag is None:   # asked before the DAG settings are known: at parse time
                return set()
            stages = set(self.stages)
            forced = set(stages) if dag.forceall else {name for name in dag.forcerun if name in stages}
            for stage in list(forced):
                forced |= self._downstream(stage)
            self._forced = forced
        return self._forced

    # --- reuse ------------------------------------------------------------
    def reuse_location(self, experiment: str, pair: str, stage: str, instance: str | None = None) -> str | None:
        """The stage directory an experiment takes this stage from (its
        ``reuse`` setting), or None when the stage is computed here (asked at
        every job: most stages are not reused by any experiment)."""
        if stage not in self._reusing[experiment]:
            return None
        source = wconfig.reuse_source(self.config, experiment, pair, stage)
        if source is None:
            return None
        if layout.is_valid_name(source):   # another experiment under the same root
            location = layout.stage_dir(self.root, pair, source, stage, instance)
        else:
            location = wconfig.source_of_instance(source, instance)
        return stores.absolute(location)

    def reused_from(self, stage: str, wildcards) -> str | None:
        if stage not in self._reused:   # (asked at every job: most stages no experiment reuses)
            return None
        return self.reuse_location(wildcards.experiment, self._pair(wildcards), stage, wildcards.get("instance"))

    # --- the end of the Snakefile ----------------------------------------
    def finish(self) -> None:
        """Read the stage rules, once they are all defined (call it at the end
        of the Snakefile, before ``rule all``), and derive what each needs
        from its name: its inputs (one function: see ``_inputs_of``), the
        step runner around its shell command, its worker class's resources.
        Then check the config's stage names and the reuse sources; a problem
        stops the run here, before any job, naming the rule or the key."""
        from snakemake.exceptions import WorkflowError
        try:
            for stage in self.stages.values():
                self._wire(self.workflow.get_rule(stage.name), stage)
            self._check_parts()
            self._fanout.follow(self.stages)
            names = list(self.stages)
            if self.facts_only:
                self._finished = True
                self._record_graph()
                return
            instanced = [name for name, spec in self.stages.items() if spec.instances is not None]
            instances = self._instance_names(instanced)
            prepared = wconfig.complete(dict(self.config), self.workflow_dir, self.source, self.axis, names,
                                        instanced, instances)
        except (StageError, wconfig.ConfigError) as exc:
            raise WorkflowError(str(exc)) from None
        self.config.clear()
        self.config.update(prepared)
        for experiment, known in {**instances, **self._unchecked}.items():   # one per set of overrides matching some
            groups: dict[tuple, str] = {}
            for instance in known:
                groups.setdefault(wconfig.override_keys(self.config, experiment, instance), instance)
            self._overridden_by[experiment] = [instance for matched, instance in groups.items() if matched]
        for stage in names:
            self._fill_resources(stage)
        self._finished = True
        if _job_process(self.workflow):
            return  # a cluster job: the main process checked the rest already
        self._check_reuse()
        self._record_graph()

    def _check_parts(self) -> None:
        """Every ``wp.parts`` names a checkpoint stage without instances."""
        for stage in self.stages.values():
            for parts in fanout.checkpoint_parts(stage.instances):
                source = self.stages.get(parts.stage)
                if source is None:
                    raise StageError(f"rule {stage.name}: {parts!r}: no stage {parts.stage!r} (the stages are: "
                                     f"{', '.join(self.stages)})")
                if not self.workflow.get_rule(parts.stage).is_checkpoint:
                    raise StageError(f"rule {stage.name}: {parts!r}: rule {parts.stage} is not a checkpoint "
                                     f"(write `checkpoint {parts.stage}:` for a stage whose output decides the parts)")
                if source.instances is not None:
                    raise StageError(f"rule {stage.name}: {parts!r}: checkpoint {parts.stage} has instances; "
                                     "parts come from a checkpoint with one job per experiment (and axis value)")
        for name, helper, needed, upstream, along in self._dim_checks:
            consumer = self.stages[name]
            dims = fanout.dims_of(consumer.instances)
            if upstream is None:   # placeholders in a wp.stage
                missing = sorted(needed - set(dims))
                if missing:
                    raise StageError(f"rule {name}: {helper}: no dimension {missing[0]!r} (rule {name}'s "
                                     f"instances have: {', '.join(dims) or 'no named dimensions'})")
                continue
            source = self._known(upstream, name)
            helper = f"wp.each({upstream!r}, ..., over={list(along) if len(along) > 1 else along[0]!r})"
            theirs = fanout.dims_of(source.instances)
            unknown = [d for d in along if d not in theirs]
            if unknown:
                raise StageError(f"rule {name}: {helper}: stage {upstream} has no dimension {unknown[0]!r} "
                                 f"(its dimensions: {', '.join(theirs) or 'none: wp.dims(...) names them'})")
            kept = [d for d in theirs if d not in along]
            plain_one = consumer.instances is not None and not dims and len(kept) == 1
            missing = [d for d in kept if d not in dims]
            if missing and not plain_one:
                raise StageError(f"rule {name}: {helper}: gathering along {', '.join(along)} keeps "
                                 f"{', '.join(kept)}, and this stage's instances have no {missing[0]!r} (expected "
                                 f"instances=wp.dims({', '.join(f'{d}=...' for d in kept)}))")

    def _instance_names(self, instanced: list[str]) -> dict[str, list[str]]:
        """Experiment → the instance names of its stages, for the experiments
        with ``per_instance`` overrides (which must match some); a stage over
        the grid in an experiment without one is an error, said here."""
        for stage in instanced:
            if self.stages[stage].instances == self.grid:
                bare = [e for e in self.experiments if not self._points[e]]
                if bare:
                    raise wconfig.ConfigError(f"{self.source}: experiments.{bare[0]}: no grid, and rule {stage} "
                                              "runs once per point of it (instances=wp.grid): add a grid: "
                                              "{AXIS: [VALUES], ...}")
        found = {}
        for experiment in self.experiments:
            if self._overridden[experiment]:
                names = {}
                parts = False
                for stage in instanced:
                    if fanout.checkpoint_parts(self.stages[stage].instances):
                        parts = True   # found by a checkpoint as it runs: an override may name them
                        continue
                    names.update(dict.fromkeys(self.instances(stage, experiment)))
                if parts:   # (its overrides can't be checked against the parts before they are found)
                    self._unchecked[experiment] = list(names)
                else:
                    found[experiment] = list(names)
        return found

    def _wire(self, rule, stage: Stage) -> None:
        name = rule.name
        own_dir = self._own_path(stage, "")
        plain = [str(f) for f in rule.output if not strip_wildcard_constraints(self._pattern(f)).startswith(own_dir)]
        if plain:
            raise StageError(f"rule {name}: every output of a stage rule is wp.out(...) (in its stage's "
                             f"directory); not: {', '.join(plain)}")
        if rule.shellcmd is None:
            raise StageError(f"rule {name}: a stage rule runs a shell: command (waypost's step runner runs it, "
                             "attempt by attempt); script:, run: and wrapper: are not supported")
        if STEP_PARAM in rule.params._names:
            raise StageError(f"rule {name}: the param name {STEP_PARAM!r} is waypost's own")
        if wspec.DELIMITER in rule.shellcmd:
            raise StageError(f"rule {name}: its shell command holds {wspec.DELIMITER!r}, the line that ends "
                             "waypost's here-document around it")
        wildcards = set(rule.wildcard_names) - {"experiment", "instance", self.axis_wc}
        if wildcards:
            raise StageError(f"rule {name}: wildcards other than waypost's ({', '.join(sorted(wildcards))}): "
                             "a stage job is one experiment" + (f", {self.axis.word}" if self.axis else "")
                             + " and instance")
        # The inputs as written, in their order: one function gives them (or none).
        items, ranges = [], {start: (label, end) for label, (start, end) in rule.input._names.items()}
        index = 0
        while index < len(rule.input):
            label, end = ranges.get(index, (None, None))
            end = index + 1 if end is None else end
            group = [self._pattern(item) for item in rule.input[index:end]]
            for item in group:
                if callable(item) and is_flagged(item, "unpack"):
                    raise StageError(f"rule {name}: unpack() in a stage rule's input: name its inputs instead")
            items.append((label or f"_{index}", group[0] if label and end - index == 1 else group))
            index = end
        for _, item in items:
            for entry in (item if isinstance(item, list) else [item]):
                if isinstance(entry, str):
                    stage.parents.update(self._stage_of_path(entry))
        for dependency in rule.dependencies.values():
            if dependency in self.stages:
                stage.parents.add(dependency)
        unknown = sorted(p for p in stage.parents if p not in self.stages)
        if unknown:
            raise StageError(f"rule {name}: no stage {', '.join(map(repr, unknown))} (the stages are: "
                             f"{', '.join(self.stages)})")
        from snakemake.io import unpack
        from snakemake.iocontainers import InputFiles
        rule._input = InputFiles()
        rule.dependencies = {}
        if getattr(rule, "input_modifier", None) is None:   # a rule that had no input: of its own
            rule.input_modifier = rule.output_modifier
        rule.set_input(unpack(self._inputs_of(name, items)))
        self._commands[name] = rule.shellcmd
        # The step runner reads the job's step spec, then the rule's command
        # as Snakemake formats it, from a quoted here-document: no argument
        # carries the command (of any length), and its shell syntax stays the
        # step's. ``exec``: the runner's status is the job's, and a
        # ``shell.suffix()`` is run by the step's script only.
        rule.shellcmd = (f"exec {self._runner} <<'{wspec.DELIMITER}'\n{{params.{STEP_PARAM}}}\n"
                         f"{rule.shellcmd.strip()}\n{wspec.DELIMITER}\n")
        rule.run_func = _shell_run_func(rule.run_func, rule.shellcmd, self.mirror)
        if self.mirror:
            self._map_param_functions(rule)
        rule.set_params(**{STEP_PARAM: self.step(name)})
        shell_exec = rule.resources._data.get("shell_exec")
        if shell_exec is not None:
            if not isinstance(shell_exec.value, str):
                raise StageError(f"rule {name}: resources.shell_exec of a stage rule is a path to a shell, "
                                 "not a function")
            self._shell_exec[name] = shell_exec.value
        worker = rule.resources._data.pop("worker", None)
        self._default_class[name] = worker.value if worker is not None else wworkers.DEFAULT_CLASS
        self._rule_resources[name] = rule

    def _map_param_functions(self, rule) -> None:
        """On a bucket root: a params function that takes the job's ``input``
        or ``output`` gets their local copies (``local_files``), as the
        command does, so a path it builds (``--out={output.model}.tmp``) is
        one the step can open."""
        for index, param in enumerate(rule.params):
            if not callable(param):
                continue
            takes = set(inspect.signature(param).parameters) & {"input", "output"}
            if takes:
                rule.params[index] = _with_local_files(param, takes, self.mirror)
                for name, (start, end) in list(rule.params._names.items()):
                    if start == index and end is None:
                        rule.params._set_name(name, index)   # a named param is an attribute too

    def _stage_of_path(self, pattern: str) -> list[str]:
        """The stage a path pattern is in, if it is under the root."""
        base = self.base.rstrip("/") + "/" if self.base else ""
        if not pattern.startswith(base):
            return []
        parts = pattern[len(base):].split("/")
        return [parts[2]] if len(parts) > 3 and parts[2] in self.stages else []

    def _fill_resources(self, stage: str) -> None:
        """Put the worker class's resources into the stage rule."""
        rule = self._rule_resources.pop(stage)
        from snakemake.resources import Resources
        rule.resources.update(Resources.from_mapping(self.resources(stage, self._default_class[stage])))
        # --set-resources still has the last word
        rule.resources.update(self.workflow.resource_settings._parsed_overwrite_resources.get(stage, {}))

    def _check_reuse(self) -> None:
        """Every reuse source of a stage still to be done must be a SUCCESS
        stage, or the run stops here with all the problems, before any job runs."""
        problems = []
        for stage, values, path in self._stage_outputs(everything=True):
            experiment, pair, instance = values["experiment"], values["pair"], values["instance"]
            location = self.reuse_location(experiment, pair, stage, instance)
            if location and not self.present(path):
                problem = reuse.source_problem(location)
                if problem:
                    problems.append(f"{layout.stage_name(pair, experiment, stage, instance)}: {problem}")
        self._pending = {}   # (stages whose instances a checkpoint finds: their reuse is checked by their jobs)
        if problems:
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(f"reuse sources in {self.configfile} can't be used (nothing was run):\n  "
                                + "\n  ".join(dict.fromkeys(problems)))

    def _record_graph(self) -> None:
        """The workflow's facts for the ``waypost`` command (``.waypost/stages.json``,
        see ``graph``): its stages in order, which feed which, the funnels,
        the axis, each stage's code version, and the files they came from."""
        stages = list(self.stages)
        graph = {"parents": {stage: sorted(spec.parents) for stage, spec in self.stages.items() if spec.parents},
                 "stages": stages, "funnels": [s for s, spec in self.stages.items() if spec.funnel],
                 "instanced": [s for s, spec in self.stages.items() if spec.instances is not None],
                 "axis": {"word": self.axis.word, "key": self.axis.key} if self.axis else None,
                 "snakefile": os.path.abspath(self.workflow.main_snakefile),
                 "sources": sorted({os.path.abspath(str(self.workflow.get_rule(s).snakefile)) for s in stages}
                                   | {os.path.abspath(self.workflow.main_snakefile)}),
                 "code": {stage: self.stage_code_version(stage) for stage in stages}}
        path = self.facts_only or os.path.join(".waypost", "stages.json")
        try:
            with open(path) as f:
                if json.load(f) == graph:
                    os.utime(path)   # current: newer than the files it was read from (see graph)
                    return
        except (OSError, ValueError):
            pass
        os.makedirs(os.path.dirname(path), exist_ok=True)
        manifest.write_json_atomic(path, graph, durable=False)

    def _own_files(self, stage: str) -> tuple[str, list[tuple[str, bool]]]:
        """``str.format`` patterns of a stage's directory and of its outputs
        (asked at every job: made once)."""
        if stage not in self._own:
            rule = self.workflow.get_rule(stage)
            spec = self.stages[stage]
            stage_dir = self._own_path(spec, "")
            # (pattern, whether str.format fills it: no {name,constraint}, no braces of its own)
            outputs = [strip_wildcard_constraints(self._pattern(p)) for p in rule.output]
            self._own[stage] = (stage_dir.rstrip("/"), [(p, bool(_PLAIN_FIELDS.fullmatch(p))) for p in outputs])
        return self._own[stage]

    def tolerated(self, stage: str, experiment: str, pair: str, instance: str | None = None) -> bool:
        """Does a funnel downstream of ``stage`` accept its failure?"""
        key = (stage, experiment, self._scope(experiment, pair, instance))
        if key not in self._tolerated:
            self._tolerated[key] = any(
                self._policy(experiment, pair, child, instance if self.stages[child].instances is not None else None)
                .tolerates_failure for child in self._downstream(stage))
        return self._tolerated[key]

    def _downstream(self, stage: str) -> set[str]:
        """Every stage that takes inputs from ``stage``, directly or not."""
        seen, todo = set(), [stage]
        while todo:
            current = todo.pop()
            for child, spec in self.stages.items():
                if current in spec.parents and child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen

    def _policy(self, experiment: str, pair: str, stage: str, instance: str | None = None):
        from .policy import Policy
        key = (experiment, self._scope(experiment, pair, instance), stage)
        if key not in self._policies:
            self._policies[key] = Policy.from_config(self._stage_settings(experiment, pair, stage, instance)["policy"])
        return self._policies[key]

    # --- settings --------------------------------------------------------
    def _scope(self, experiment: str, pair: str, instance: str | None = None):
        """The pair, where the experiment's ``per_pair`` or ``reuse`` names it,
        else None: the experiment's other pairs and its funnels are alike;
        with the ``per_instance`` overrides that match the instance, when
        some do (instances no override names are alike too). A grid point's
        own values are not in it (see ``_stage_settings``)."""
        scope = pair if pair in self._named_pairs[experiment] else None
        if instance is None or not self._overridden[experiment]:
            return scope
        matched = self._matched.get((experiment, instance))
        if matched is None:
            matched = self._matched[(experiment, instance)] = wconfig.override_keys(self.config, experiment, instance)
        return (scope, matched) if matched else scope

    def _scopes(self):
        """One (experiment, pair, instance) per distinct set of stage settings
        and reuse (an instance for each set of ``per_instance`` overrides
        that match some instances, once ``finish`` has read them)."""
        for experiment, pairs in self._named_pairs.items():
            yield experiment, layout.ALL_PAIRS, None
            yield from ((experiment, pair, None) for pair in sorted(pairs))
            yield from ((experiment, layout.ALL_PAIRS, instance) for instance in self._overridden_by[experiment])

    def _point(self, experiment: str, instance: str | None) -> str | None:
        """The instance, when it is a point of the experiment's grid (whose
        values are its own settings), else None."""
        points = self._points[experiment]
        return instance if points and instance in points else None

    def _stage_settings(self, experiment: str, pair: str, stage: str, instance: str | None = None) -> dict:
        """The merged settings, shared: not to be changed (a grid point's: a
        new dict each time, its values over its scope's settings)."""
        scope = self._scope(experiment, pair, instance)
        key = (experiment, scope, stage)
        if key not in self._settings:
            matched = scope[1] if isinstance(scope, tuple) else ()
            self._settings[key] = wconfig.stage_settings(self.config, experiment, pair, stage, matched=matched)
        point = self._point(experiment, instance)
        if point is not None:
            return {**self._settings[key], **self._points[experiment][point]}
        return self._settings[key]

    def settings(self, experiment: str, pair: str, stage: str, instance: str | None = None) -> dict:
        """A stage's merged settings for one experiment, pair and instance (a copy)."""
        return dict(self._stage_settings(experiment, pair, stage, instance))

    def setting(self, key: str, default=None):
        """A param of this rule: one setting of its stage. A plain value when
        it is the same for every experiment, axis value and instance, else a
        function of the job's wildcards (Snakemake calls every function of
        every job: fewer plan faster). A grid axis is a setting of each
        point: ``wp.setting("nu")`` is the job's point's value."""
        stage = self._declaring("setting").name
        values = [self._stage_settings(e, p, stage, i).get(key, default) for e, p, i in self._scopes()]
        if key not in self._per_point_keys(stage) and values and all(v == values[0] for v in values) \
                and _literal(values[0]):
            return values[0]

        def value(wildcards):
            return self._stage_settings(wildcards.experiment, self._pair(wildcards), stage,
                                        wildcards.get("instance")).get(key, default)
        return _presigned(value)

    def _per_point_keys(self, stage: str) -> set[str]:
        if stage not in self._point_keys:
            self._point_keys[stage] = wconfig.per_point_keys(self.config, stage)
        return self._point_keys[stage]

    def grid(self, experiment: str) -> list[str]:
        """The points of an experiment's grid (its ``grid:`` in the config),
        as instance names: ``wp.out(..., instances=wp.grid)`` makes a stage
        run once per point, and ``wp.setting(axis)`` is each point's value.
        Names are each axis and its value, joined by ``-``, in the order the
        axes are written: ``nu0.01-amp0.5``."""
        points = self._points.get(experiment)
        if not points:
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(f"{self.source}: experiments.{experiment} has no grid: a stage with "
                                "instances=wp.grid needs one (grid: {AXIS: [VALUES], ...})")
        return list(points)

    # --- workers and resources -------------------------------------------
    def worker(self, stage: str, default_class: str, experiment: str, pair: str,
               instance: str | None = None) -> tuple[str, dict]:
        """The worker class of a job (the rule's, unless the config names
        another for this stage, experiment, pair or instance) and its spec in the pool."""
        name = self._stage_settings(experiment, pair, stage, instance).get("worker", default_class)
        return name, wworkers.worker_class(self.workers, self.pool, name, f"stage {stage}")

    def _job_resources(self, stage: str, default_class: str, experiment: str, pair: str, attempt: int,
                       instance: str | None = None) -> dict:
        key = (stage, experiment, self._scope(experiment, pair, instance), attempt)
        if key not in self._resources:
            instance = instance if isinstance(key[2], tuple) else None   # (its scope's settings decide)
            settings = self._stage_settings(experiment, pair, stage, instance)
            _, spec = self.worker(stage, default_class, experiment, pair, instance)
            if (self.reuse_location(experiment, pair, stage)
                    and REUSE_CLASS in self.workers["pools"][self.pool]["classes"]):
                # a reuse job only copies files: no GPU node for that
                spec = wworkers.worker_class(self.workers, self.pool, REUSE_CLASS, f"stage {stage}")
            policy = self._policy(experiment, pair, stage, instance)
            overrides = dict(settings.get("resources") or {})
            if policy.runtime is not None:
                overrides["runtime"] = policy.runtime
            self._resources[key] = wworkers.resources(spec, overrides, attempt, policy.runtime_growth,
                                                      policy.memory_growth)
        return self._resources[key]

    def resources(self, stage: str, default_class: str) -> dict:
        """A rule's ``resources: **...``: the worker class's resources in the
        selected pool, per job and attempt (runtime and memory grow per the
        stage's policy).

        Snakemake calls every resource function of every job, so a resource
        is a plain value where it is the same for every experiment, pair and
        attempt, and a function only where it is not.
        """
        self._default_class[stage] = default_class
        scopes = list(self._scopes())
        try:
            firsts = [self._job_resources(stage, default_class, e, p, 1, i) for e, p, i in scopes]
        except wconfig.ConfigError as exc:   # an unknown worker class: say so before any job runs
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(str(exc)) from None
        growing = set()
        for e, p, i in scopes:
            policy = self._policy(e, p, stage, i)
            growing |= ({"runtime"} if policy.runtime_growth != 1 else set()) \
                | ({"mem_mb"} if policy.memory_growth != 1 else set())
        resources = {}
        for name in dict.fromkeys(n for first in firsts for n in first):
            values = [first.get(name) for first in firsts]
            # (a checkpoint's parts, which per_instance overrides may name: per job)
            parts = fanout.checkpoint_parts(self.stages[stage].instances) and any(self._overridden.values())
            if name not in growing and not parts and all(v == values[0] for v in values):
                resources[name] = values[0]
            else:
                resources[name] = self._resource_function(stage, default_class, name)
        return resources

    def _resource_function(self, stage: str, default_class: str, name: str):
        def value(wildcards, attempt):
            return self._job_resources(stage, default_class, wildcards.experiment, self._pair(wildcards),
                                       attempt, wildcards.get("instance")).get(name)
        return _presigned(value)

    # --- the step runner ------------------------------------------------
    def step(self, stage: str):
        """A params function giving a stage job's step spec (one line of
        JSON: ``waypost.spec``); the rule's command follows it on the step
        runner's standard input (see ``_wire``)."""
        def spec_line(wildcards, input, output):
            experiment = wildcards.experiment
            pair = self._pair(wildcards)
            instance = wildcards.get("instance")
            own = {"stage_dir": layout.stage_dir(self.root, pair, experiment, stage, instance), "pair": pair,
                   "inputs": list(input), "outputs": list(output)}
            if instance:
                own["instance"] = instance
            source = self.reuse_location(experiment, pair, stage, instance)
            if source:
                own["reuse_from"] = source
            return wspec.extend(self._scope_spec(stage, experiment, pair, instance), own)
        return _presigned(spec_line)

    def _scope_spec(self, stage: str, experiment: str, pair: str, instance: str | None = None) -> str:
        """The part of a job's step spec that its stage's settings decide
        (encoded): the same for every job of the scope, but for a grid
        point's own values. A point's line is its scope's encoding with the
        point's settings and their hash put in (made once per scope: the
        rest does not depend on the point), unless the point sets one of
        the engine's keys (``policy``, ``worker``, …): then it is its own."""
        scope = self._scope(experiment, pair, instance)
        point = self._point(experiment, instance)
        values = None if point is None else self._points[experiment][point]
        if values is not None and any(key in values for key in wconfig.ENGINE_KEYS):
            key = (stage, experiment, scope, point)
            if key not in self._step_options:
                self._step_options[key] = wspec.encode(self._spec_fields(stage, experiment, pair, instance))
            return self._step_options[key]
        key = (stage, experiment, scope, values is not None)
        found = self._step_options.get(key)
        if found is None:
            fields = self._spec_fields(stage, experiment, pair, instance)
            if values is None:
                found = wspec.encode(fields)
            else:
                found = self._spec_template(fields, self._settings[(experiment, scope, stage)])
            self._step_options[key] = found
        if values is None:
            return found
        if found is False:   # (marks that can't be told from the fields' own text)
            return wspec.encode(self._spec_fields(stage, experiment, pair, instance))
        return self._point_spec(found, values)

    @staticmethod
    def _point_spec(template: tuple, values: dict) -> str:
        """A grid point's line from its scope's template (``_spec_template``)
        and the point's values."""
        head, middle, tail, base, hash_first = template
        settings = {**base, **values}
        blob = wconfig.settings_json(settings)
        digest = wconfig.settings_hash(settings, blob)
        return head + (digest + middle + blob if hash_first else blob + middle + digest) + tail

    @staticmethod
    def _spec_template(fields: dict, scope_settings: dict) -> tuple | bool:
        """A scope's encoded fields cut around its settings and their hash:
        (head, middle, tail, the scope's settings without the engine's keys,
        whether the hash comes first); False where the marks can't be found
        (once each) in the line."""
        marks = {"settings": "\x00waypost-settings\x00", "config_hash": "\x00waypost-hash\x00"}
        line = wspec.encode({**fields, **marks})
        at = {name: line.index(json.dumps(mark)) for name, mark in marks.items()}
        first, second = sorted(marks, key=at.get)
        one, two = json.dumps(marks[first]), json.dumps(marks[second])
        head, rest = line[:at[first]], line[at[first] + len(one):]
        if line.count(one) != 1 or line.count(two) != 1:
            return False
        middle, tail = rest.split(two, 1)
        quote = '"'   # the hash is a JSON string, its mark's quotes stay around it
        if first == "config_hash":
            head, middle = head + quote, quote + middle
        else:
            middle, tail = middle + quote, quote + tail
        base = {key: value for key, value in scope_settings.items() if key not in wconfig.ENGINE_KEYS}
        return head, middle, tail, base, first == "config_hash"

    def _spec_fields(self, stage: str, experiment: str, pair: str, instance: str | None = None) -> dict:
        """The step spec's fields that a job's stage settings decide."""
        settings = self.settings(experiment, pair, stage, instance)
        engine = {key: settings.pop(key, None) for key in wconfig.ENGINE_KEYS}
        policy = dict(engine["policy"] or {})
        worker_name, spec = self.worker(stage, self._default_class.get(stage, "cpu"), experiment, pair, instance)
        runtime = (engine["resources"] or {}).get("runtime", spec.get("runtime"))
        if policy.get("runtime") is None and runtime:
            policy["runtime"] = runtime
        fields = {"stage": stage, "experiment": experiment, "settings": settings, "policy": policy,
                  "config_hash": wconfig.settings_hash(settings), "code_version": self.stage_code_version(stage),
                  "pool": self.pool, "worker_class": worker_name, "worker_env": spec.get("env") or {},
                  "shell": _snakemake_shell(self._shell_exec.get(stage))}
        if self.tolerated(stage, experiment, pair, instance):
            fields["tolerated"] = True
        if self.mirror:
            fields["mirror"] = self.mirror
        if self.config.get("mounts"):
            fields["mounts"] = self.config["mounts"]
        return fields

    # --- code versions ---------------------------------------------------
    def stage_code_version(self, stage: str) -> str:
        """The code a stage's step runs, as a short hash: its manifest's
        ``code_version``, which ``waypost plan`` compares with the current one.

        It covers the rule's shell command as written (before wildcards are
        filled: inputs, outputs and settings are ``{input…}``/``{params…}``
        placeholders, so data and settings are not in it), the contents of
        the files that command names (the scripts ``script()`` inserts; not
        the Python interpreter), and waypost's version; a ``script:`` rule's
        script, a ``run:`` rule's code. Paths are taken relative to the
        repository, so a moved checkout or another venv is the same code.
        Made once per stage and process (a cluster job's own process makes
        its stage's: the code it is about to run).
        """
        if stage not in self._code_versions:
            rule = self.workflow.get_rule(stage)
            if stage in self._commands or rule.shellcmd is not None:
                command, paths = self._command_files(self._commands.get(stage, rule.shellcmd))
            elif rule.script or rule.notebook:
                name = str(rule.script or rule.notebook)
                basedir = _local_path(rule.basedir)
                path = name if os.path.isabs(name) else os.path.join(str(basedir), name)
                paths = [path] if "{" not in name and os.path.isfile(path) else []
                command = "script: " + (self._repo_relative(path) if paths else name)
            else:
                command, paths = rule.run_func_src or "", []
            self._code_versions[stage] = wconfig.code_digest(
                command, [(self._repo_relative(p), self._file_digest(p)) for p in paths])
        return self._code_versions[stage]

    def _command_files(self, command: str) -> tuple[str, list[str]]:
        """A shell command template with its file paths made relative to the
        repository and the interpreter named ``python``, and the (absolute)
        paths of the files it names: its words that are existing files
        (placeholders and options are not)."""
        try:
            words = shlex.split(command)
        except ValueError:   # unbalanced quotes around a placeholder, say
            words = command.split()
        interpreters = {self.python, sys.executable, os.path.realpath(sys.executable)}
        normal, paths = [], []
        for word in words:
            if word in interpreters:
                word = "python"
            elif "{" not in word and not word.startswith("-") and ("/" in word or "." in word):
                path = os.path.abspath(word)
                if os.path.isfile(path) and os.path.realpath(path) not in interpreters:
                    paths.append(path)
                    word = self._repo_relative(path)
            normal.append(word)
        return " ".join(normal), paths

    def _repo_relative(self, path: str) -> str:
        return os.path.relpath(path, self.repo_dir) if path.startswith(self.repo_dir + os.sep) else path

    def _file_digest(self, path: str) -> bytes:
        if path not in self._file_digests:
            import hashlib
            with open(path, "rb") as f:
                self._file_digests[path] = hashlib.sha256(f.read()).digest()
        return self._file_digests[path]

    # --- targets ---------------------------------------------------------
    def targets(self, wildcards=None) -> list[str]:
        """The default run's targets: ``rule all``'s ``input: wp.targets`` at
        the end of the Snakefile.

        presence: only the outputs that are missing, or whose stage is
        unfinished (see ``_markers``). A present output is done, so its job
        is not even in the DAG: deleting one intermediate reruns exactly its
        job, and nothing downstream of it (their outputs are there). With
        ``--forcerun RULE`` or ``--forceall``, the outputs of the stages they
        force too. mtime: every output, and Snakemake's timestamp rule decides.
        A job's own Snakemake process (on a cluster node, or a subprocess)
        runs the one job it was given: no targets, nothing to look at.
        """
        if not self._finished:
            # (one line, not an input function's traceback: nothing has run)
            print("waypost: the Snakefile never called wp.finish() after its rules: add it at the end, "
                  "before `rule all` (nothing was run)", file=sys.stderr)
            raise SystemExit(1)
        if _job_process(self.workflow):
            return []
        forced = self._forced_stages()
        held = self._held()
        wanted, skipped, done = [], set(), None
        for stage, values, path in self._stage_outputs():
            if held and self._is_held(held, stage, values) and not self.present(path):
                skipped.add(stage)
                continue
            try:
                todo = not self.presence or stage in forced or not self.present(path) \
                    or any(self._markers(self._own_files(stage)[0].format(**values["wildcards"]))) \
                    or (self.stages[stage].gathers and self._set_changed(stage, Wildcards(
                        fromdict=values["wildcards"])) is not None) \
                    or (stage in self._fanout.after and self._changed_parts(stage, Wildcards(
                        fromdict=values["wildcards"])))
            except IncompleteCheckpointException as exc:   # its set is found by a checkpoint still to run
                self._pending.setdefault(str(exc.targetfile), exc.targetfile)
                continue
            if todo:
                wanted.append(path)
            elif done is None:
                done = path
        # The outputs of checkpoints whose parts are still to be found: Snakemake
        # runs them first, then asks again (it re-evaluates what depends on them).
        wanted += self._pending.values()
        self._pending = {}
        if not wanted and done is not None:
            # Everything is done: one done output keeps `rule all` a rule with
            # inputs (one without is always run), so Snakemake says "Nothing to be done".
            wanted.append(done)
        if skipped:
            print(f"waypost: on hold, not scheduled, nor what needs them ({', '.join(sorted(skipped))}): "
                  + "; ".join(self._on_hold[:6]) + (" ..." if len(self._on_hold) > 6 else "")
                  + " (`waypost retry STAGE` to try again now)", file=sys.stderr)
        return wanted

    def _held(self) -> set[tuple]:
        """The (experiment, pair, stage, instance) not to schedule (instance
        None: none of the stage's): those on hold in the root's registry
        (layout.HELD: one listing), given up or waiting out their series
        backoff, and what needs their success (``_hold``)."""
        registry = layout.join(self.root, layout.HELD)
        now = time.time()
        if self.mirror is None:
            try:
                entries = {name: os.stat(os.path.join(registry, name)).st_mtime for name in os.listdir(registry)}
            except OSError:
                entries = {}
        else:
            from .stores.gcs import mtime_of
            prefix = gcs.filesystem(registry)[1] + "/"
            entries = {key[len(prefix):]: mtime_of(info) for key, info in gcs.listing(self.root).items()
                       if key.startswith(prefix)}
        held: set[tuple] = set()
        self._on_hold = []
        for name, until in sorted(entries.items()):
            parts = name.split("~")
            if len(parts) < 3 or (until and until <= now):
                continue
            pair, experiment, stage = parts[:3]
            instance = parts[3] if len(parts) > 3 else None
            self._on_hold.append(f"{layout.stage_name(*parts)} " + ("given up" if not until else
                                                 "waiting until " + time.strftime("%H:%M", time.localtime(until))))
            # A given-up stage ended for good: its last end is what a funnel's
            # `depends` looks at, as when it ended (one in its backoff will be
            # redone: what is below waits for it).
            state = None if until else (self._recorded(layout.stage_dir(self.root, pair, experiment, stage,
                                                                          instance)) or {}).get("state")
            self._hold(held, experiment, pair, stage, instance, state)
        return held

    def _hold(self, held: set, experiment: str, pair: str, stage: str, instance: str | None,
              state: str | None) -> None:
        """Hold (experiment, pair, stage, instance) and what needs its
        success: a consumer with instances at the same instance, any other
        (a funnel over the instances, over the pairs) as a whole; not a
        consumer whose ``depends`` accepts ``state`` (the held stage's last
        end, None while it is to be redone), which goes on over it."""
        key = (experiment, pair, stage, instance)
        if key in held:
            return
        held.add(key)
        for child, spec in self.stages.items():
            if stage not in spec.parents:
                continue
            child_pair = layout.ALL_PAIRS if spec.funnel else pair
            if state is not None and self._policy(experiment, child_pair, child,
                                                  instance if spec.instances is not None else None).accepts(state):
                continue
            self._hold(held, experiment, child_pair, child, instance if spec.instances is not None else None, None)

    @staticmethod
    def _is_held(held: set, stage: str, values: dict) -> bool:
        experiment, pair = values["experiment"], values["pair"]
        return (experiment, pair, stage, None) in held or (experiment, pair, stage, values["instance"]) in held

    def _recorded(self, stage_dir: str) -> dict | None:
        """A stage directory's manifest; None when there is none or it can't
        be read."""
        try:
            return self._life(stage_dir).manifest
        except (OSError, gcs.StorageError):
            return None

    def _stage_outputs(self, everything: bool = False):
        """(stage, values, output) of every stage job of the selected
        experiments and axis values (``everything``: of all of them), where
        values holds the job's experiment, pair (the engine's name for its
        axis value), instance, and its wildcards."""
        select = {} if everything else (self.config.get("select") or {})
        experiments = [e for e in self.experiments if e in select.get("experiments", [e])]
        for stage, spec in self.stages.items():
            patterns = [self._pattern(p) for p in self.workflow.get_rule(stage).output]
            for experiment in experiments:
                if spec.funnel or not self.axis_wc:  # a funnel is over all values: not when only some are selected
                    pairs = [] if spec.funnel and select.get("pairs") else [layout.ALL_PAIRS]
                else:
                    pairs = [p for p in self.axis_values(experiment) if p in select.get("pairs", [p])]
                for pair in pairs:
                    try:
                        instances = self.instances(stage, experiment, pair) if spec.instances is not None else [None]
                    except IncompleteCheckpointException as exc:
                        # Instances found by a checkpoint that has not run: what
                        # needs them waits for it (``targets`` asks for its output).
                        self._pending.setdefault(str(exc.targetfile), exc.targetfile)
                        continue
                    for instance in instances:
                        wildcards = self._values(experiment, pair, instance)
                        values = {"experiment": experiment, "pair": pair, "instance": instance,
                                  "wildcards": wildcards}
                        for p in patterns:
                            yield stage, values, apply_wildcards(p, wildcards)

    def all_outputs(self) -> list[str]:
        return [path for _, _, path in self._stage_outputs()]


_TAKES_AXIS_VALUE: dict = {}   # instances function → whether it takes the axis value (asked per job)


def _takes_axis_value(function) -> bool:
    """Does an instances function take the axis value too (two arguments)?"""
    if isinstance(function, fanout.Parts | fanout.Dims):
        return True
    try:
        return _TAKES_AXIS_VALUE[function]
    except (KeyError, TypeError):
        pass
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    found = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
    try:
        _TAKES_AXIS_VALUE[function] = found
    except TypeError:   # (an unhashable callable: asked again next time)
        pass
    return found


def _presigned(function):
    """``function`` with its signature computed once: Snakemake asks for the
    signature of every function it calls, at every job (``inspect.signature``
    returns a preset ``__signature__`` at once)."""
    function.__signature__ = inspect.signature(function)
    return function


_PLAIN_FIELDS = re.compile(r"(?:[^{}]|\{\w+\})*")   # a pattern str.format can fill


def _snakemake_shell(executable: str | None = None) -> dict:
    """How Snakemake's ``shell`` runs a command: its executable (a rule's
    ``shell_exec`` resource, else ``shell.executable()``'s), prefix (``set
    -euo pipefail; `` for bash, or ``shell.prefix()``'s) and suffix."""
    from snakemake.shell import shell
    executable = executable or shell.get_executable()
    return {"executable": executable, "prefix": shell._get_process_prefix(executable),
            "suffix": shell._process_suffix}


def local_files(files, mirror: str | None):
    """A job's files (a Namedlist of plain strings, as a rule's run function
    or a params function gets them) with each gs:// URL replaced, whole, by
    its local copy under ``mirror``: what the step works on. ``files`` as
    they are on a local root (``mirror`` None)."""
    if not mirror:
        return files
    from snakemake.iocontainers import Namedlist

    from .stores.mirror import local_of
    return Namedlist(toclone=files, custom_map=lambda f: local_of(mirror, f))


def _with_local_files(function, names: set[str], mirror: str):
    def mapped(*args, **kwargs):
        for name in names:
            if name in kwargs:
                kwargs[name] = local_files(kwargs[name], mirror)
        return function(*args, **kwargs)
    mapped.__signature__ = inspect.signature(function)
    return mapped


def job_command(job, mirror: str | None) -> str:
    """A stage job's shell command (``_wire``'s runner line with the spec
    and the rule's command), formatted as Snakemake formats ``job.shellcmd``,
    but with the local copies of its files on a bucket root: the command a
    job the executor submits runs."""
    if not mirror:
        return job.shellcmd
    names = {name: local_files(getattr(job, name)._plainstrings(), mirror) for name in ("input", "output", "log")}
    return job.format_wildcards(job.rule.shellcmd, **names)


def _shell_run_func(original, command: str, mirror: str | None):
    """A rule's run function that runs ``command`` instead of the shell
    command it was written with (Snakemake compiles a ``shell:`` into a
    function calling ``shell(...)``, which fills the command's placeholders
    from that function's own arguments: the new one takes the same, the
    marker of a rule's function included, so ``shell`` takes the job's
    threads, resources and environment from them as for any rule). On a
    bucket root its files are their local copies first (``local_files``)."""
    parameters = inspect.signature(original).parameters
    source = (f"def run({', '.join(str(p) for p in parameters.values())}):\n"
              + ("    input, output, log = local_files(input, mirror), local_files(output, mirror), "
                 "local_files(log, mirror)\n" if mirror else "")
              + "    shell(command, bench_record=bench_record, bench_iteration=bench_iteration)\n")
    from snakemake.shell import shell
    namespace = {"shell": shell, "command": command, "local_files": local_files, "mirror": mirror}
    exec(compile(source, f"<waypost step of {original.__name__}>", "exec"), namespace)
    return namespace["run"]


def _local_path(source) -> str:
    """The path of a Snakemake source file or directory (a LocalSourceFile)."""
    return getattr(source, "path", None) or str(source)


def _as_list(found) -> list:
    return [found] if isinstance(found, str) else list(found)


def _literal(value) -> bool:
    """Can Snakemake take ``value`` as a plain param? It formats wildcards
    into strings (and lists of them), so none may hold a brace."""
    return not any(isinstance(v, str) and ("{" in v or "}" in v)
                   for v in (value if isinstance(value, list) else [value]))
