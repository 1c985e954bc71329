"""The helper API a Snakefile's rules use: a stage is said once, by its rule's name.

A stage rule is a plain Snakemake rule whose outputs are ``wp.out(...)``: the
rule's name is the stage, and its directory, the inputs it takes in presence
mode, its worker class's resources, the step runner around its shell command
and the default targets all derive from that name when ``wp.finish()`` reads
the rules at the end of the Snakefile. In a rule's body the helpers know
which rule they are in (the wiring notes each rule's name as Snakemake
starts defining it), so a rule names other stages only where it reads them
(``wp.stage(...)``): a rule copied under a new name writes into its own
stage directory and no other.

``Pipeline`` puts together the parts that do the work: the stage graph
(``waypost.planning.stagegraph``: what the rules declared), the resolver
(``waypost.planning.resolver``: what the config says per job), the state view
(``waypost.planning.stateview``: what is done, what is to be redone) and the wiring
(``waypost.planning.wiring``, the one package that touches Snakemake's objects).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys

from waypost import stores
from waypost.model import config as wconfig
from waypost.model import layout
from waypost.model import workers as wworkers
from waypost.model.codeversion import CodeVersions
from waypost.model.graph import FACTS_ONLY_ENV, invocation
from waypost.model.graph import record as record_facts
from waypost.model.manifest import write_json_atomic
from waypost.planning import fanout, owntriggers, points
from waypost.planning.ownlayout import assigned_class, wire_rules_in_own_layout
from waypost.planning.pipelineconfig import read_config
from waypost.planning.reading import in_one_line, refuse, refuse_while_reading
from waypost.planning.resolver import NO_DEFAULT, Resolver
from waypost.planning.stagegraph import StageError, StageGraph
from waypost.planning.stateview import StateView
from waypost.planning.stepline import StepLines
from waypost.planning.targets import default_targets
from waypost.planning.wiring.bucket import planning_mirror
from waypost.planning.wiring.internals import after_planning, after_reading
from waypost.planning.wiring.rules import wire, wire_inputs
from waypost.planning.wiring.snake import Snake, WorkflowError, run_identity
from waypost.planning.wiring.triggers import quiet_triggers, stop_on_request, take_finished_orphans
from waypost.runner import forked
from waypost.runner import main as runner

STEP_PARAM = "waypost"   # the param holding a stage job's step spec (waypost.model.spec)


class Pipeline:
    """A waypost pipeline: ``wp = Pipeline(config, workflow, axis="dataset")``
    at the top of the Snakefile, ``wp.finish()`` after the stage rules.

    It takes waypost's keys from the config Snakemake loaded (the
    Snakefile's ``configfile:``, ``--configfile``, the profiles' and the
    command line's ``--config``; ``config/config.yaml`` where Snakemake
    loaded none): under its ``waypost:`` key, or at its top level where it
    has ``experiments`` there, or none (``wconfig.waypost_config``). It
    validates them against waypost's schema (merged with the workflow's
    own where that extends waypost's) and answers the rules' helpers.

    ``axis``: the word for the per-experiment axis, if the workflow has one
    (``pair``: an experiment lists its ``pairs``, overrides go under
    ``per_pair``, rules see ``{wildcards.pair}``, the CLI takes ``--pair``);
    ``axis_key`` when the list's name is not the word plus "s".

    The default config file is read here rather than by a ``configfile:``
    directive so that a YAML error names the file, line and column; config
    files given with ``--configfile`` are loaded by Snakemake as usual, and
    ``--config KEY=VALUE`` overrides apply on top of either. After it, a
    config with waypost's keys at its top level is, in ``config``, the
    config with its defaults (an axis's list under ``pairs``), which the
    rest of the Snakefile may read as it is loaded, under every ``waypost``
    command; any other ``config`` is left as Snakemake loaded it. A stage rule's ``shell:`` is formatted
    as Snakemake formats it, with the Snakefile's globals and the job's
    ``{input}``, ``{params.p}``, ``{wildcards.w}``..., and so is a policy's
    ``restart`` command.
    """

    def __init__(self, config: dict, workflow, axis: str | None = None, axis_key: str | None = None,
                 default_configfile: str = "config/config.yaml"):
        self.snake = Snake(workflow)
        self.axis = wconfig.Axis.of(axis, axis_key)
        if self.axis and (not layout.is_valid_name(self.axis.word)
                          or self.axis.word in ("experiment", "instance", STEP_PARAM)):
            mistake = StageError(f"Pipeline(axis={axis!r}): expected a word of letters, digits or '_' "
                                 "other than experiment, instance and waypost")
            refuse_while_reading(mistake)
            raise mistake
        self.facts_only = os.environ.get(FACTS_ONLY_ENV)
        # A cluster job's own Snakemake process: its main process validated the
        # same files when it submitted the job (and jsonschema is slow to import).
        check = not self.snake.remote
        workflow_dir = self.snake.basedir
        try:
            read = read_config(config, self.snake, default_configfile, check, self.facts_only, self.axis)
        except wconfig.ConfigError as exc:   # a clean one-paragraph error from Snakemake, before any job runs
            refuse(exc)
        self.config, self.configfile, self.source = read.prepared, read.configfile, read.source
        self.config_read = read   # (what else reading it told: its files, own-layout presence, ...)
        self._snakefile_config = config   # the Snakefile's own ``config``: the same keys, kept in step
        config = self.config
        self.root = config["root"]
        # On a gs:// root Snakemake sees stage files through waypost's storage
        # plugin: rules' paths are relative to the root (the storage prefix),
        # jobs get gs:// URLs, and the step runner works on a local copy of
        # the bucket, ``self.mirror`` (see stores.mirror).
        on_bucket = stores.needs_mirror(self.root)
        self.mirror = planning_mirror(workflow, self.root) if on_bucket and not self.facts_only else None
        if not on_bucket and not self.facts_only and not self.snake.remote:
            self.snake.reach(self.root)
        run_identity(workflow)   # the runner reads the run id itself
        self.graph = StageGraph(config, self.axis, "" if on_bucket else self.root)
        self.snake.attach(self.graph, self.root)
        workers = {"pools": {}} if self.facts_only else _load_workers(
            config["pool"], wworkers.pools_file(config.get("workers"), wconfig.pipeline_dir(workflow_dir),
                                                wconfig.config_dir(self.source)), check)
        self.resolver = Resolver(config, self.graph, workers, self.source)
        # Code versions name files relative to the pipeline's top directory
        # (above workflow/, or the Snakefile's own): a moved checkout has the same code.
        self.code = CodeVersions(wconfig.pipeline_dir(workflow_dir), self.snake.rule_code)
        self.lines = StepLines(self.resolver, self.code.of, self.snake.shell_of, self.mirror)
        self.fanout = fanout.Planning(self)   # the checkpoints that ran, the stages made from their parts
        self._points = points.Points(self)   # wp.grid
        self.state = StateView(self.graph, self.resolver, self.snake, self.fanout, self.root, self.mirror,
                               config["rerun_policy"] == "presence")
        self._finished = False
        after_reading(workflow, self._check_finished)
        # Stage jobs' completion is the files'; rules in their own layout keep
        # Snakemake's rerun triggers (the run's own --rerun-triggers).
        quiet_triggers(self.snake)
        take_finished_orphans(self.snake, STEP_PARAM)   # (a SUCCESS a runner recorded after its driver died)
        stop_on_request(STEP_PARAM)   # (a stop cue ends the run)
        self._own_layout: list[str] = []   # the rules in their own layout given a record (finish)
        self._unchecked: dict[str, list] = {}  # see Resolver.override_instances
        constraints = {"experiment": layout.NAME_PATTERN, "instance": layout.NAME_PATTERN}
        if self.axis:
            constraints[self.axis.word] = layout.NAME_PATTERN
        self.snake.constrain(**constraints)

    def _check_finished(self) -> None:
        """Stop with one line where the Snakefile never called ``wp.finish()``
        (asked once Snakemake has read it all, and by ``wp.targets``): its
        rules would run with no record, and nothing would say so."""
        if not self._finished:   # (one line, not an input function's traceback: nothing has run)
            refuse("the Snakefile never called wp.finish() after its rules: add it at the end "
                   "(before `rule all` where that uses wp.targets); nothing was run")

    # --- names -----------------------------------------------------------
    @property
    def experiments(self) -> list[str]:
        return self.graph.experiments

    @in_one_line
    def axis_values(self, experiment: str) -> list[str]:
        """The experiment's values of the workflow's axis (its ``pairs``, say)."""
        return self.graph.axis_values(experiment)

    @in_one_line
    def instances(self, stage: str, experiment: str, pair: str | None = None) -> list[str]:
        """The instance names of a stage with instances, in an experiment
        (and for one axis value, ``pair``, when the stage's function takes
        it: teachers per language pair). Without ``pair``: every name any
        of the experiment's axis values has."""
        return self.graph.instances(stage, experiment, pair)

    # --- the helpers, in a rule ------------------------------------------
    @in_one_line
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
        return self.graph.out(filename, instances, funnel)

    @in_one_line
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
        return self.graph.stage(stage, filename, instance)

    @in_one_line
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
        return self.graph.each(stage, filename, over)

    @in_one_line
    def parts(self, stage: str, pattern: str):
        """A stage's instances (``wp.out(..., instances=wp.parts(...))``):
        the files a checkpoint stage (``checkpoint STAGE:``) wrote into its
        ``directory()`` output, found once it ran, named by what the one
        ``{name}`` in ``pattern`` matches (``"parts/{part}.txt"``: instance
        ``00`` for ``parts/00.txt``). A constraint says what a part's name
        matches, as in ``glob_wildcards``: ``"parts/file.{part,\\d+}"`` leaves
        ``parts/file.00.ref`` out. ``{part}`` is then a dimension: a
        job reads its own part as ``wp.stage(stage, "parts/{part}.txt")``.
        Found through Snakemake's ``checkpoints.<stage>.get(...)``: a dry run
        plans the checkpoint, and the jobs of the parts appear once it ran."""
        return fanout.Parts(self, stage, pattern, self.graph.current)

    @in_one_line
    def dims(self, **dimensions):
        """A stage's instances over named dimensions
        (``instances=wp.dims(part=wp.parts(...), teacher=teachers)``): one
        instance per combination, named by its values joined with ``-`` in
        the order written (``00-t1``). Each dimension takes what
        ``instances=`` takes: a list, a function of the experiment (and
        axis value), ``wp.parts(...)``. Its value is a placeholder in this
        rule's ``wp.stage`` file names and instance (``instance="{teacher}"``),
        a param (``wp.dim``), and ``wp.each(..., over=...)`` gathers along it."""
        return fanout.Dims(self, dimensions, self.graph.current)

    @in_one_line
    def dim(self, name: str):
        """A param of this rule: the job's value of one of its stage's
        dimensions (``params: teacher=wp.dim("teacher")``)."""
        return self.graph.dim(name)

    @in_one_line
    def setting(self, key: str, default=NO_DEFAULT):
        """A param of this rule: one setting of its stage. A plain value when
        it is the same for every experiment, axis value and instance, else a
        function of the job's wildcards (Snakemake calls every function of
        every job: fewer plan faster). A grid axis is a setting of each
        point: ``wp.setting("nu")`` is the job's point's value. With no
        ``default``, the config must have the setting: one it lacks is an
        error before any job runs, never ``None`` in the job's command."""
        return self.resolver.setting(self.graph.declaring("setting").name, key, default)

    @property
    def grid(self) -> points.Points:
        """The points of an experiment's parameter set (its ``grid:``,
        ``zip:``, ``table:`` or ``sample:`` in the config), as instances:
        ``wp.out(..., instances=wp.grid)`` makes a stage run once per point,
        and ``wp.setting(parameter)`` is each point's value. Names are each
        parameter and its value, joined by ``-``, in the order the
        parameters are written: ``nu0.01-amp0.5``.

        Each parameter is a dimension of these instances, as in ``wp.dims``:
        ``wp.dim("nu")``, a ``{nu}`` placeholder in this rule's ``wp.stage``
        paths, and ``wp.each(stage, file, over="amp")`` gathering along it.
        ``wp.grid.per("nu")``: one instance per value of ``nu`` (``nu0.01``),
        for a stage that gathers, per value, its points along the others."""
        return self._points

    def script(self, path: str) -> str:
        """``python SCRIPT`` for a shell command, the script's path taken
        relative to the file the rule is in (as Snakemake's ``script:`` does),
        so the pipeline runs from any directory; its contents count in the
        stage's code version."""
        return "python " + shlex.quote(os.path.normpath(os.path.join(self.snake.current_basedir(), path)))

    @in_one_line
    def path_of(self, stage: str, filename: str, experiment: str, pair: str | None = None,
                instance: str | None = None) -> str:
        """The path of one stage file (for functions that pick inputs)."""
        return self.graph.path_of(stage, filename, experiment, pair, instance)

    # --- the end of the Snakefile ----------------------------------------
    def finish(self) -> None:
        """Read the stage rules, once they are all defined (call it at the end
        of the Snakefile, before ``rule all``), and derive what each needs
        from its name: its inputs (one function: see ``StateView.needs_inputs``),
        the step runner around its shell command, its worker class's resources.
        Then check the config's stage names and the reuse sources; a problem
        stops the run here, before any job, naming the rule or the key."""
        # How a stage job starts the step runner (braces doubled: the line is
        # part of the rule's command, which Snakemake formats).
        runner_line = shlex.join(runner.command(sys.executable)).replace("{", "{{").replace("}", "}}")
        self.snake.local_steps.command = [*runner.command(sys.executable), "--serve"]
        self.snake.run_here = forked.run_here
        graph = self.graph
        try:
            for stage in graph.stages.values():
                named = wire(self.snake, stage, runner_line, STEP_PARAM, self.lines.params_function(stage.name),
                             self.mirror)
                self.lines.default_class[stage.name] = named or assigned_class(self.resolver, self.snake, stage.name)
            own_layout = self._own_layout = wire_rules_in_own_layout(self, runner_line, STEP_PARAM)
            graph.check(self.snake.is_checkpoint)
            self.fanout.follow(graph.stages)
            if self.facts_only:
                self._finished = True
                self._record_graph()
                return
            if graph.stages and not self.config_read.declared:
                raise wconfig.ConfigError(self.config_read.undeclared_experiments())
            instances, self._unchecked = self.resolver.override_instances(self.grid)
            prepared = wconfig.complete(self.config, self.snake.basedir, self.source, self.axis,
                                        [*graph.stages, *own_layout], graph.instanced(), instances)
        except (StageError, wconfig.ConfigError) as exc:
            refuse(exc)
        self.config.clear()
        self.config.update(prepared)   # (in place: the resolver and the rest hold it)
        if self.config_read.fills_config:
            self._snakefile_config.clear()
            self._snakefile_config.update(prepared)
        self.resolver.freeze({**instances, **self._unchecked})
        # (a checkpoint's parts, which per_instance overrides may name: per job)
        per_job = self.resolver.any_overridden()
        try:
            for stage, spec in graph.stages.items():
                wire_inputs(self.snake, stage, self.state)
                self.snake.fill_resources(stage, self.resolver.resources(
                    stage, self.lines.default_class[stage], per_job and bool(fanout.checkpoint_parts(spec.instances))))
            self._place_plain_rules()
        except (StageError, wconfig.ConfigError) as exc:   # (an unknown worker class: said before any job runs)
            refuse(exc)
        self._finished = True
        if self.snake.job_process:
            return  # a cluster job: the main process checked the rest already
        problems = self.state.reuse_problems()
        if problems:
            raise WorkflowError(f"reuse sources in {self.configfile} can't be used (nothing was run):\n  "
                                + "\n  ".join(problems))
        # (checked once the rest is: a refused config claims nothing; a config with waypost's keys at
        # its top level names its experiments itself, and may be edited as a copy: plan's drift)
        if not self.mirror and not self.config_read.fills_config:
            _claim_experiments(self.root, self.config["experiments"], self.configfile, self.snake.snakefile)
        for line in self.state.reuse_plan().lines():
            print(f"waypost: {line}", file=sys.stderr)
        self._record_graph()
        events_path = owntriggers.wanted()
        if events_path and self._own_layout:   # (``waypost plan``: each recorded job's triggers now)
            after_planning(self.snake.workflow, lambda: owntriggers.report(
                self.snake, self.root, self.experiments, self._own_layout, STEP_PARAM, events_path))

    def _place_plain_rules(self) -> None:
        """Give every rule that runs a job and is not a stage (plain Snakemake
        rules beside the stages) its worker class's resources in the pool,
        the same way as a stage's class is found; what the rule wrote itself
        stays. (No step runner: such a job's GPUS is the rule's own business.)"""
        for rule in self.snake.job_rules(self.graph.stages):
            # (a rule in its own layout: its class was found as it was wired)
            name = (self.lines.default_class.get(rule) or self.snake.worker_class(rule)
                    or assigned_class(self.resolver, self.snake, rule))
            spec = wworkers.worker_class(self.resolver.workers, self.resolver.pool, name, f"rule {rule}")
            self.snake.fill_gaps(rule, wworkers.resources(spec, names=self.resolver.resource_names))

    def _record_graph(self) -> None:
        """The workflow's facts for the ``waypost`` command (see ``waypost.model.graph``)."""
        own_outputs = {rule: [pattern for pattern, _ in self.snake.output_patterns(rule)]
                       for rule in self._own_layout}   # (for ``waypost adopt`` of such a rule's job)
        sources = self.snake.sources()
        sources["sources"] = sorted({*sources["sources"], *self.config_read.files["configfiles"],
                                     *self.config_read.files["given_configfiles"]})
        record_facts({**self.graph.facts(), "own_layout": self._own_layout, "own_outputs": own_outputs,
                      **sources, **self.config_read.files, "invocation": invocation(),
                      "code": {stage: self.code.of(stage) for stage in self.graph.stages}}, self.facts_only)

    def targets(self, wildcards=None) -> list[str]:
        """The default run's targets: ``rule all``'s ``input: wp.targets`` at
        the end of the Snakefile.

        presence: only the outputs that are missing, or whose stage is
        unfinished (see ``StateView.markers``). A present output is done, so
        its job is not even in the DAG: deleting one intermediate reruns
        exactly its job, and nothing downstream of it (their outputs are
        there). With ``--forcerun RULE`` or ``--forceall``, the outputs of
        the stages they force too. mtime: every output, and Snakemake's
        timestamp rule decides. A job's own Snakemake process (on a cluster
        node, or a subprocess) runs the one job it was given: no targets.
        """
        self._check_finished()
        if self.snake.job_process:
            return []
        return default_targets(self.state)


def _claim_experiments(root: str, experiments, configfile: str, snakefile: str) -> None:
    """Each experiment's records are made with one config file: the first
    run of an experiment under a root notes its config (``layout.EXPERIMENT_MARK``,
    by its path from the root), and a run with another config naming the
    same experiment stops in one line, before anything runs, rather than
    overwrite the other's records."""
    made_with = configfile if configfile != wconfig.NO_CONFIG_FILE else str(snakefile)
    made_with = os.path.relpath(os.path.abspath(made_with), os.path.abspath(root))
    for experiment in experiments:
        path = layout.experiment_mark(root, experiment)
        try:
            with open(path) as f:
                noted = json.load(f).get("config")
        except FileNotFoundError:
            with contextlib.suppress(OSError):   # (a root that can't be written: its steps will say so)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                write_json_atomic(path, {"config": made_with}, durable=False)
            continue
        except (OSError, ValueError, AttributeError):
            continue
        if noted != made_with:
            first = os.path.normpath(os.path.join(root, noted))
            raise WorkflowError(
                f"experiment {experiment!r} under {root} has records made with {os.path.relpath(first)}, and this "
                f"run reads {os.path.relpath(os.path.join(root, made_with))}: give this config an experiment "
                f"of its own (waypost: {{experiments: {{NAME: {{}}}}}}) or root, so neither overwrites the other's "
                f"records (or, if it replaces that config, delete {path})")


def _load_workers(pool: str, path: str, check: bool) -> dict:
    try:
        workers = wworkers.load(path, check)
        if pool not in workers["pools"]:
            hint = (" (waypost's own pools file: add config/workers.yaml with that pool)"
                    if path == wworkers.PACKAGE_FILE else "")
            raise wconfig.ConfigError(f"config: pool {pool!r} is not in {path}{hint} "
                                      f"(expected one of: {', '.join(workers['pools'])})")
        wworkers.check_assignments(workers, pool, path)
    except wconfig.ConfigError as exc:
        refuse(exc)
    return workers
