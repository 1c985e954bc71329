"""The small helper API the Snakefile and rules use.

Rules stay plain Snakemake; they ask this module for stage paths, for inputs
(none for a job whose outputs are present, in presence mode: it is done
whatever the timestamps upstream), for a stage's settings, and for the
step-runner prefix of their shell command.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import sys

from snakemake.io import apply_wildcards, is_flagged, strip_wildcard_constraints

from . import config as wconfig
from . import layout, manifest, reuse, runner, storage
from . import workers as wworkers

INSTANCE = "{instance}"
REUSE_CLASS = "cpu"   # the worker class reuse jobs get, when the pool has it
CODE_VERSION_ENV = "WAYPOST_CODE_VERSION"


def _job_process(workflow) -> bool:
    """Is this Snakemake process one job's own (on a cluster node, or a
    job's subprocess), rather than the run's main process?"""
    return getattr(workflow, "remote_exec", False) or getattr(workflow, "subprocess_exec", False)


def run_identity(workflow, workflow_dir: str) -> tuple[str, str]:
    """The code version and the run id that every job of this run records.

    Snakemake's main process computes them once (``git describe``; a new id)
    and exports them; its jobs inherit them: local jobs as its children,
    cluster jobs through the executor (the Slurm plugin submits with
    ``--export=ALL``, and they are registered as the workflow's ``envvars``,
    which Snakemake hands to the remote jobs of any executor). The step
    runner reads the run id from its environment: an earlier attempt of the
    same run in its stage directory means Snakemake is retrying the job.
    """
    # A cluster job (or a job's subprocess): its main process decided.
    if _job_process(workflow):
        missing = [name for name in (CODE_VERSION_ENV, manifest.RUN_ID_ENV) if name not in os.environ]
        if missing:
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(f"this job's Snakemake process did not inherit {' and '.join(missing)} from the "
                                "run that started it: its executor must pass the environment to its jobs")
        return os.environ[CODE_VERSION_ENV], os.environ[manifest.RUN_ID_ENV]
    os.environ[CODE_VERSION_ENV] = wconfig.code_version(workflow_dir)
    os.environ[manifest.RUN_ID_ENV] = manifest.new_run_id()
    workflow.register_envvars(CODE_VERSION_ENV, manifest.RUN_ID_ENV)
    return os.environ[CODE_VERSION_ENV], os.environ[manifest.RUN_ID_ENV]


class Pipeline:
    """Loads and validates the config, then answers the rules' questions.

    The default config file is read here rather than by a ``configfile:``
    directive so that a YAML error names the file, line and column; config
    files given with ``--configfile`` are loaded by Snakemake as usual, and
    ``--config KEY=VALUE`` overrides apply on top of either.
    """

    def __init__(self, config: dict, workflow, default_configfile: str = "config/config.yaml"):
        self.workflow_dir = workflow.basedir
        # A cluster job's own Snakemake process: its main process validated the
        # same files when it submitted the job (and jsonschema is slow to import).
        check = not getattr(workflow, "remote_exec", False)
        self.repo_dir = os.path.dirname(os.path.abspath(self.workflow_dir))
        try:
            if workflow.configfiles:
                self.configfile = str(workflow.configfiles[-1])
                loaded, source = wconfig.with_reuse_files(dict(config), self.configfile)
            else:
                self.configfile = default_configfile
                loaded, source = wconfig.with_reuse_files(wconfig.load_yaml(default_configfile), default_configfile)
                loaded = wconfig.merge(loaded, dict(workflow.config_settings.overwrite_config or {}))
            prepared = wconfig.prepare(loaded, self.workflow_dir, source, check=check)
        except wconfig.ConfigError as exc:
            # A clean one-paragraph error from Snakemake, before any job runs.
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(str(exc)) from None
        config.clear()
        config.update(prepared)
        self.config = config
        self.root = config["root"]
        # On a gs:// root Snakemake sees stage files through waypost's storage
        # plugin: rules' paths are relative to the root (the storage prefix),
        # jobs get gs:// URLs, and the step runner works on a local copy of
        # the bucket, ``self.mirror`` (see remote_stage).
        self.mirror = None
        if layout.is_gcs(self.root):
            from . import remote_stage
            self.mirror = remote_stage.planning_mirror(self.root, workflow)
        self.base = "" if self.mirror else self.root
        self.presence = config["rerun_policy"] == "presence"
        self.code_version, _ = run_identity(workflow, self.workflow_dir)   # the runner reads the run id itself
        self.python = sys.executable
        self._runner = {site: shlex.join(runner.command(self.python, site)) for site in (False, True)}
        self.scripts = os.path.join(self.repo_dir, "scripts")
        self.pool = config["pool"]
        self.workers = self._load_workers(config["workers"], check)
        self._tracked: list = []
        self._parents: dict[str, set] = {}   # stage → the stages it takes inputs from
        self._default_class: dict[str, str] = {}
        self._own: dict[str, tuple] = {}   # stage → patterns of its marker and outputs
        # Per (experiment, scope, stage), where the scope is the pair when the
        # experiment's per_pair or reuse names it, else None (all its other
        # pairs and its funnels are alike): computed once each.
        self._named_pairs = {name: set(spec.get("per_pair", {})).union(
            *(where for where in spec.get("reuse", {}).values() if isinstance(where, dict)))
            for name, spec in config["experiments"].items()}
        self._settings: dict[tuple, dict] = {}
        self._policies: dict[tuple, object] = {}
        self._tolerated: dict[tuple, bool] = {}
        self._reusing = {name: set(spec.get("reuse", {})) for name, spec in config["experiments"].items()}
        self._step_options: dict[tuple, str] = {}
        self._resources: dict[tuple, dict] = {}   # (stage, experiment, scope, attempt) → resources
        self.workflow = workflow

    def _load_workers(self, path: str, check: bool) -> dict:
        if not os.path.isabs(path) and not os.path.exists(path):
            path = os.path.join(self.repo_dir, path)
        try:
            workers = wworkers.load(path, check)
            if self.pool not in workers["pools"]:
                raise wconfig.ConfigError(f"config: pool {self.pool!r} is not in {path} "
                                          f"(expected one of: {', '.join(workers['pools'])})")
        except wconfig.ConfigError as exc:
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(str(exc)) from None
        return workers

    # --- names -----------------------------------------------------------
    @property
    def experiments(self) -> list[str]:
        return list(self.config["experiments"])

    def pairs(self, experiment: str) -> list[str]:
        return list(self.config["experiments"][experiment]["pairs"])

    wildcard_constraints = {
        "pair": layout.NAME_PATTERN,
        "experiment": layout.NAME_PATTERN,
        "instance": layout.NAME_PATTERN,
    }

    # --- paths -----------------------------------------------------------
    def path(self, stage: str, filename: str, instance: str | None = None, pair: str = "{pair}") -> str:
        """Pattern of a stage output; ``instance=INSTANCE`` for per-instance stages."""
        parts = [pair, "{experiment}", stage] + ([instance] if instance else []) + [filename]
        return layout.join(self.base, *parts)

    def present(self, path: str) -> bool:
        """Does a stage file (a path as rules write it) exist? On a gs://
        root: is it in the one listing of the root this planning makes."""
        if self.mirror is None:
            return os.path.exists(path)
        from . import storage
        return storage.listed(layout.join(self.root, path))

    def _pattern(self, path) -> str:
        """A rule's output as the rule wrote it (Snakemake turns paths on a
        gs:// root into storage files named by their local copy)."""
        if is_flagged(path, "storage_object"):
            return path.storage_object.query[len(self.root.rstrip("/")) + 1:]
        return path

    def needs(self, consumer: str, **inputs):
        """The inputs of stage ``consumer``, for a rule's ``input: unpack(...)``
        (every stage rule has one, even without inputs of its own).

        Each value names the upstream stage: ``(stage, filename[, instance])``
        for one of its outputs, or ``(stage, function)`` where the function of
        the wildcards returns path(s) (``stage`` may be a tuple of the stages
        the function picks from). In presence mode a job whose outputs are
        all present is done: it gets no inputs at all, so nothing upstream of
        it (being rerun, or missing in an experiment where its outputs were
        placed by hand) can make it rerun; a job that does get inputs has an
        output missing, so it runs whatever their timestamps. A stage left
        unfinished by a failure (its ``_unfinished`` marker, newer than its
        outputs) gets the marker as an input: that is what makes Snakemake
        redo it on the next run.

        One input function per rule (not one per input): Snakemake inspects
        every callable of every job, so fewer callables plan faster.
        """
        for stage, *_ in inputs.values():
            self._parents.setdefault(consumer, set()).update([stage] if isinstance(stage, str) else stage)
        # name → a function of the wildcards, or the path pattern to format
        sources = {name: rest[0] if callable(rest[0]) else self.path(stage, *rest)
                   for name, (stage, *rest) in inputs.items()}

        def job_inputs(wildcards):
            if self.reused_from(consumer, wildcards):
                return {name: [] for name in inputs}  # copied from elsewhere: nothing upstream is needed
            values = dict(wildcards.items())
            marker_pattern, output_patterns = self._own_files(consumer)
            marker = marker_pattern.format(**values)
            unfinished = self.present(marker)
            if self.presence and not unfinished and all(
                    self.present(p.format(**values) if plain else apply_wildcards(p, values))
                    for p, plain in output_patterns):
                return {name: [] for name in inputs}
            resolved = {}
            for name, source in sources.items():
                found = source(wildcards) if callable(source) else source.format(**values)
                # One path stays a string: Snakemake makes a list of each named list.
                resolved[name] = found if isinstance(found, str) else list(found)
            if unfinished:
                resolved["_unfinished"] = marker
            return resolved
        return _presigned(job_inputs)

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
            location = storage.join(source, instance) if instance else source
        return location if storage.is_remote(location) else os.path.abspath(location)

    def reused_from(self, stage: str, wildcards) -> str | None:
        return self.reuse_location(wildcards.experiment, wildcards.get("pair", layout.ALL_PAIRS), stage,
                                   wildcards.get("instance"))

    def check(self) -> None:
        """After all rules are defined (end of the Snakefile): every reuse
        source of a stage still to be done must be a SUCCESS stage, or the run
        stops here with all the problems, before any job runs. Also records
        the stage graph for the ``waypost`` command (``.waypost/stages.json``)."""
        if getattr(self.workflow, "remote_exec", False):
            return  # a cluster job: the main process checked already
        problems = []
        for rule, instances in self._tracked:
            stage = rule.rule.name
            per_experiment = "pair" not in rule.rule.wildcard_names
            for experiment in self.experiments:
                for pair in [layout.ALL_PAIRS] if per_experiment else self.pairs(experiment):
                    for instance in (instances(experiment) if instances else [None]):
                        location = self.reuse_location(experiment, pair, stage, instance)
                        values = {"pair": pair, "experiment": experiment, "instance": instance}
                        if location and not all(self.present(apply_wildcards(self._pattern(p), values))
                                                for p in rule.output):
                            problem = reuse.source_problem(location)
                            if problem:
                                problems.append(f"{experiment}/{pair}/{stage}"
                                                f"{'/' + instance if instance else ''}: {problem}")
        if problems:
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(f"reuse sources in {self.configfile} can't be used (nothing was run):\n  "
                                + "\n  ".join(problems))
        self._record_graph()

    def _record_graph(self) -> None:
        graph = {"parents": {stage: sorted(parents) for stage, parents in sorted(self._parents.items())},
                 "stages": [rule.rule.name for rule, _ in self._tracked]}
        path = os.path.join(".waypost", "stages.json")
        try:
            with open(path) as f:
                if json.load(f) == graph:
                    return
        except (OSError, ValueError):
            pass
        os.makedirs(".waypost", exist_ok=True)
        manifest.write_json_atomic(path, graph, durable=False)

    def _own_files(self, stage: str) -> tuple[str, list[tuple[str, bool]]]:
        """``str.format`` patterns of a stage's ``_unfinished`` marker and of
        its outputs (asked at every job: made once)."""
        if stage not in self._own:
            rule = self.workflow.get_rule(stage)
            names = rule.wildcard_names
            stage_dir = layout.join(self.base, "{pair}" if "pair" in names else layout.ALL_PAIRS, "{experiment}",
                                    stage, *(["{instance}"] if "instance" in names else []))
            # (pattern, whether str.format fills it: no {name,constraint}, no braces of its own)
            outputs = [strip_wildcard_constraints(self._pattern(p)) for p in rule.output]
            self._own[stage] = (os.path.join(stage_dir, layout.UNFINISHED),
                                [(p, bool(_PLAIN_FIELDS.fullmatch(p))) for p in outputs])
        return self._own[stage]

    def tolerated(self, stage: str, experiment: str, pair: str) -> bool:
        """Does a funnel downstream of ``stage`` accept its failure?"""
        key = (stage, experiment, self._scope(experiment, pair))
        if key not in self._tolerated:
            self._tolerated[key] = any(self._policy(experiment, pair, child).tolerates_failure
                                       for child in self._downstream(stage))
        return self._tolerated[key]

    def _downstream(self, stage: str) -> set[str]:
        """Every stage that takes inputs from ``stage``, directly or not."""
        seen, todo = set(), [stage]
        while todo:
            current = todo.pop()
            for child, parents in self._parents.items():
                if current in parents and child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen

    def _policy(self, experiment: str, pair: str, stage: str):
        from .policy import Policy
        key = (experiment, self._scope(experiment, pair), stage)
        if key not in self._policies:
            self._policies[key] = Policy.from_config(self._stage_settings(experiment, pair, stage)["policy"])
        return self._policies[key]

    # --- settings --------------------------------------------------------
    def _scope(self, experiment: str, pair: str) -> str | None:
        """The pair, where the experiment's ``per_pair`` or ``reuse`` names it;
        else None: the experiment's other pairs and its funnels are alike."""
        return pair if pair in self._named_pairs[experiment] else None

    def _scopes(self):
        """One (experiment, pair) per distinct set of stage settings and reuse."""
        for experiment, pairs in self._named_pairs.items():
            yield experiment, layout.ALL_PAIRS
            yield from ((experiment, pair) for pair in sorted(pairs))

    def _stage_settings(self, experiment: str, pair: str, stage: str) -> dict:
        """The merged settings, shared: not to be changed."""
        key = (experiment, self._scope(experiment, pair), stage)
        if key not in self._settings:
            self._settings[key] = wconfig.stage_settings(self.config, experiment, pair, stage)
        return self._settings[key]

    def settings(self, experiment: str, pair: str, stage: str) -> dict:
        """A stage's merged settings for one experiment and pair (a copy)."""
        return dict(self._stage_settings(experiment, pair, stage))

    def setting(self, stage: str, key: str, default=None):
        """A rule's param: one setting of the stage. A plain value when it is
        the same for every experiment and pair, else a function of the job's
        wildcards (Snakemake calls every function of every job: fewer plan
        faster)."""
        values = [self._stage_settings(e, p, stage).get(key, default) for e, p in self._scopes()]
        if all(v == values[0] for v in values) and _literal(values[0]):
            return values[0]

        def value(wildcards):
            return self._stage_settings(wildcards.experiment, wildcards.get("pair", layout.ALL_PAIRS),
                                        stage).get(key, default)
        return _presigned(value)

    # --- workers and resources -------------------------------------------
    def worker(self, stage: str, default_class: str, experiment: str, pair: str) -> tuple[str, dict]:
        """The worker class of a job (the rule's, unless the config names
        another for this stage, experiment or pair) and its spec in the pool."""
        name = self._stage_settings(experiment, pair, stage).get("worker", default_class)
        return name, wworkers.worker_class(self.workers, self.pool, name, f"stage {stage}")

    def _job_resources(self, stage: str, default_class: str, experiment: str, pair: str, attempt: int) -> dict:
        key = (stage, experiment, self._scope(experiment, pair), attempt)
        if key not in self._resources:
            settings = self._stage_settings(experiment, pair, stage)
            _, spec = self.worker(stage, default_class, experiment, pair)
            if (self.reuse_location(experiment, pair, stage)
                    and REUSE_CLASS in self.workers["pools"][self.pool]["classes"]):
                # a reuse job only copies files: no GPU node for that
                spec = wworkers.worker_class(self.workers, self.pool, REUSE_CLASS, f"stage {stage}")
            policy = self._policy(experiment, pair, stage)
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
            firsts = [self._job_resources(stage, default_class, e, p, 1) for e, p in scopes]
        except wconfig.ConfigError as exc:   # an unknown worker class: say so before any job runs
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(str(exc)) from None
        growing = set()
        for e, p in scopes:
            policy = self._policy(e, p, stage)
            growing |= ({"runtime"} if policy.runtime_growth != 1 else set()) \
                | ({"mem_mb"} if policy.memory_growth != 1 else set())
        resources = {}
        for name in dict.fromkeys(n for first in firsts for n in first):
            values = [first.get(name) for first in firsts]
            if name not in growing and all(v == values[0] for v in values):
                resources[name] = values[0]
            else:
                resources[name] = self._resource_function(stage, default_class, name)
        return resources

    def _resource_function(self, stage: str, default_class: str, name: str):
        def value(wildcards, attempt):
            return self._job_resources(stage, default_class, wildcards.experiment,
                                       wildcards.get("pair", layout.ALL_PAIRS), attempt).get(name)
        return _presigned(value)

    # --- the step runner ------------------------------------------------
    #: The start of every stage rule's shell command; the step's own command follows.
    run = "{params.step} -- "

    def step(self, stage: str):
        """A params function giving the step-runner options of a job (see ``run``)."""
        def prefix(wildcards, input, output):
            experiment = wildcards.experiment
            pair = wildcards.get("pair", layout.ALL_PAIRS)
            instance = wildcards.get("instance")
            stage_dir = layout.stage_dir(self.root, pair, experiment, stage, instance)
            args = ["--stage-dir", stage_dir, "--pair", pair]
            if instance:
                args += ["--instance", instance]
            if self.mirror:
                args += ["--local-dir", os.path.join(self.mirror, stage_dir[len("gs://"):])]
            source = self.reuse_location(experiment, pair, stage, instance)
            if source:
                args += ["--reuse-from", source]
            for name, paths in input.items():
                if name != "_unfinished":
                    for path in ([paths] if isinstance(paths, str) else paths):
                        args += ("--input", path)
            for path in output:
                args += ("--output", path)
            # A local stage that is run (most jobs) starts the runner without site.
            site = bool(self.mirror or source)
            return f"{self._runner[site]} {self._runner_options(stage, experiment, pair)} {_quoted(args)}"
        return _presigned(prefix)

    def _runner_options(self, stage: str, experiment: str, pair: str) -> str:
        """The step runner's options that the stage's settings decide
        (quoted): the same for every job of the scope."""
        key = (stage, experiment, self._scope(experiment, pair))
        if key not in self._step_options:
            settings = self.settings(experiment, pair, stage)
            engine = {key: settings.pop(key, None) for key in wconfig.ENGINE_KEYS}
            policy = dict(engine["policy"] or {})
            worker_name, spec = self.worker(stage, self._default_class.get(stage, "cpu"), experiment, pair)
            runtime = (engine["resources"] or {}).get("runtime", spec.get("runtime"))
            if policy.get("runtime") is None and runtime:
                policy["runtime"] = runtime
            self._step_options[key] = shlex.join([
                "--stage", stage, "--experiment", experiment,
                *(["--tolerated"] if self.tolerated(stage, experiment, pair) else []),
                "--settings", json.dumps(settings, sort_keys=True, separators=(",", ":")),
                "--policy", json.dumps(policy, sort_keys=True, separators=(",", ":")),
                "--config-hash", wconfig.settings_hash(settings),
                "--code-version", self.code_version,
                "--pool", self.pool, "--worker-class", worker_name,
                "--worker-env", json.dumps(spec.get("env") or {}, sort_keys=True, separators=(",", ":"))])
        return self._step_options[key]

    def script(self, name: str) -> str:
        return shlex.join([self.python, os.path.join(self.scripts, name)])

    # --- targets ---------------------------------------------------------
    def track(self, rule, instances=None) -> None:  # rule: rules.<name>
        """Make the outputs of a stage rule, for every experiment and pair (and
        instance: ``instances(experiment)`` lists them), targets of the default
        run (``rule all``)."""
        self._tracked.append((rule, instances))

    def targets(self, wildcards=None) -> list[str]:
        """The default run's targets, for ``rule all``'s ``input:
        wp.targets()`` at the end of the Snakefile (a list plans faster than
        an input function; both work).

        presence: only the outputs that are missing. A present output is done,
        so its job is not even in the DAG: deleting one intermediate reruns
        exactly its job, and nothing downstream of it (their outputs are
        there). mtime: every output, and Snakemake's timestamp rule decides.
        A job's own Snakemake process (on a cluster node, or a subprocess)
        runs the one job it was given: no targets, nothing to look at.
        """
        if _job_process(self.workflow):
            return []
        wanted = self.all_outputs()
        if self.presence:
            wanted = [path for path in wanted if not self.present(path)
                      or self.present(os.path.join(os.path.dirname(path), layout.UNFINISHED))]
        return wanted

    def all_outputs(self) -> list[str]:
        targets = []
        select = self.config.get("select") or {}
        experiments = [e for e in self.experiments if e in select.get("experiments", [e])]
        for rule, instances in self._tracked:
            patterns = [self._pattern(p) for p in rule.output]
            per_experiment = "pair" not in rule.rule.wildcard_names
            for experiment in experiments:
                if per_experiment:  # a funnel is over all pairs: not when only some are selected
                    pairs = [] if select.get("pairs") else [layout.ALL_PAIRS]
                else:
                    pairs = [p for p in self.pairs(experiment) if p in select.get("pairs", [p])]
                for pair in pairs:
                    for instance in (instances(experiment) if instances else [None]):
                        values = {"pair": pair, "experiment": experiment, "instance": instance}
                        targets += [apply_wildcards(p, values) for p in patterns]
        return targets

    def funnel_path(self, stage: str, filename: str) -> str:
        """Pattern of an output of a stage that runs once per experiment."""
        return self.path(stage, filename, pair=layout.ALL_PAIRS)


def _presigned(function):
    """``function`` with its signature computed once: Snakemake asks for the
    signature of every function it calls, at every job (``inspect.signature``
    returns a preset ``__signature__`` at once)."""
    function.__signature__ = inspect.signature(function)
    return function


_PLAIN_FIELDS = re.compile(r"(?:[^{}]|\{\w+\})*")   # a pattern str.format can fill
_UNSAFE = re.compile(r"[^\w@%+=:,./-]", re.ASCII)   # what shlex.quote quotes


def _quoted(args: list[str]) -> str:
    """``shlex.join(args)``, faster when nothing needs quoting (stage paths
    are made of checked names: the usual case)."""
    if all(args) and _UNSAFE.search("".join(args)) is None:
        return " ".join(args)
    return shlex.join(args)


def _literal(value) -> bool:
    """Can Snakemake take ``value`` as a plain param? It formats wildcards
    into strings (and lists of them), so none may hold a brace."""
    return not any(isinstance(v, str) and ("{" in v or "}" in v)
                   for v in (value if isinstance(value, list) else [value]))
