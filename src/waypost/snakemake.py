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
import time

from snakemake.io import apply_wildcards, is_flagged, strip_wildcard_constraints

from . import config as wconfig
from . import layout, manifest, reuse, runner, storage
from . import workers as wworkers

INSTANCE = "{instance}"
REUSE_CLASS = "cpu"   # the worker class reuse jobs get, when the pool has it


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
        run_identity(workflow)   # the runner reads the run id itself
        self._code_versions: dict[str, str] = {}   # stage → its code version (see stage_code_version)
        self._file_digests: dict[str, bytes] = {}
        self.python = sys.executable
        self._runner = {site: shlex.join(runner.command(self.python, site)) for site in (False, True)}
        self.scripts = os.path.join(self.repo_dir, "scripts")
        self.pool = config["pool"]
        self.workers = self._load_workers(config["workers"], check)
        self._tracked: list = []
        self._forced: set | None = None   # see _forced_stages
        self._marker_cache: dict[str, tuple[bool, bool]] = {}   # see _markers
        self._on_hold: list[str] = []       # see _held
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
        output missing, so it runs whatever their timestamps.

        waypost's own markers count too, in both modes and whatever
        Snakemake's metadata says (see ``_markers``): a stage left unfinished
        (a failure a funnel went on over, or an attempt whose runner is gone)
        is forced to run again; a provisional one (a funnel over parents that
        did not succeed) gets its inputs, so it is redone when one of them is.

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
            dir_pattern, output_patterns = self._own_files(consumer)
            redo, recheck = self._markers(dir_pattern.format(**values))
            if redo:
                self._force(consumer, values)
            if self.presence and not (redo or recheck or consumer in self._forced_stages()) and all(
                    self.present(p.format(**values) if plain else apply_wildcards(p, values))
                    for p, plain in output_patterns):
                return {name: [] for name in inputs}
            resolved = {}
            for name, source in sources.items():
                found = source(wildcards) if callable(source) else source.format(**values)
                # One path stays a string: Snakemake makes a list of each named list.
                resolved[name] = found if isinstance(found, str) else list(found)
            return resolved
        return _presigned(job_inputs)

    def _markers(self, stage_dir: str) -> tuple[bool, bool]:
        """``_read_markers``, once per stage directory and planning (the
        default targets and each job's inputs ask it: files don't change
        while the DAG is built)."""
        if stage_dir not in self._marker_cache:
            self._marker_cache[stage_dir] = self._read_markers(stage_dir)
        return self._marker_cache[stage_dir]

    def _read_markers(self, stage_dir: str) -> tuple[bool, bool]:
        """(redo, recheck) of a stage directory, from waypost's own files.

        redo: an attempt's ``_running.json`` is there with no SUCCESS manifest
        written after it (its runner was killed, or is still at work: its job
        then refuses to start a second attempt), or an ``_unfinished`` marker
        whose time has come (it is dated when the next series may start).
        recheck: a ``_provisional`` marker, or an ``_unfinished`` one still in
        its backoff (its inputs are looked at, it is not forced).
        """
        if self.mirror is None:
            try:
                names = os.listdir(stage_dir)
            except OSError:
                return False, False
            stamp = lambda name: os.stat(os.path.join(stage_dir, name)).st_mtime   # noqa: E731
        else:
            from snakemake_storage_plugin_waypost import mtime_of
            found = {name: storage.listed_info(layout.join(self.root, stage_dir, name))
                     for name in (layout.RUNNING, layout.UNFINISHED, layout.PROVISIONAL, layout.MANIFEST)}
            names = [name for name, info in found.items() if info is not None]
            stamp = lambda name: mtime_of(found[name])   # noqa: E731
        if layout.RUNNING in names:
            if layout.MANIFEST not in names or stamp(layout.MANIFEST) < stamp(layout.RUNNING):
                return True, False
            return False, False  # the runner died between its manifest and removing the marker
        if layout.UNFINISHED in names:
            return (True, False) if stamp(layout.UNFINISHED) <= time.time() else (False, True)
        return False, layout.PROVISIONAL in names

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
            stages = {rule.rule.name for rule, _ in self._tracked}
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
        stages = [rule.rule.name for rule, _ in self._tracked]
        # the code versions too: `waypost plan` compares done stages' with them
        graph = {"parents": {stage: sorted(parents) for stage, parents in sorted(self._parents.items())},
                 "stages": stages, "code": {stage: self.stage_code_version(stage) for stage in stages}}
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
        """``str.format`` patterns of a stage's directory and of its outputs
        (asked at every job: made once)."""
        if stage not in self._own:
            rule = self.workflow.get_rule(stage)
            names = rule.wildcard_names
            stage_dir = layout.join(self.base, "{pair}" if "pair" in names else layout.ALL_PAIRS, "{experiment}",
                                    stage, *(["{instance}"] if "instance" in names else []))
            # (pattern, whether str.format fills it: no {name,constraint}, no braces of its own)
            outputs = [strip_wildcard_constraints(self._pattern(p)) for p in rule.output]
            self._own[stage] = (stage_dir, [(p, bool(_PLAIN_FIELDS.fullmatch(p))) for p in outputs])
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
            for path in input:
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
                "--code-version", self.stage_code_version(stage),
                "--pool", self.pool, "--worker-class", worker_name,
                "--worker-env", json.dumps(spec.get("env") or {}, sort_keys=True, separators=(",", ":"))])
        return self._step_options[key]

    def script(self, name: str) -> str:
        return shlex.join([self.python, os.path.join(self.scripts, name)])

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
            if rule.shellcmd is not None:
                command, paths = self._command_files(rule.shellcmd)
            elif rule.script or rule.notebook:
                name = str(rule.script or rule.notebook)
                basedir = getattr(rule.basedir, "get_path_or_uri", lambda: str(rule.basedir))()
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
    def track(self, rule, instances=None) -> None:  # rule: rules.<name>
        """Make the outputs of a stage rule, for every experiment and pair (and
        instance: ``instances(experiment)`` lists them), targets of the default
        run (``rule all``)."""
        self._tracked.append((rule, instances))

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
        if _job_process(self.workflow):
            return []
        forced = self._forced_stages()
        held = self._held()
        wanted, skipped, done = [], set(), None
        for stage, values, path in self._tracked_outputs():
            if stage in held.get((values["experiment"], values["pair"]), ()) and not self.present(path):
                skipped.add(stage)
                continue
            if not self.presence or stage in forced or not self.present(path) \
                    or any(self._markers(self._own_files(stage)[0].format(**values))):
                wanted.append(path)
            elif done is None:
                done = path
        if not wanted and done is not None:
            # Everything is done: one done output keeps `rule all` a rule with
            # inputs (one without is always run), so Snakemake says "Nothing to be done".
            wanted.append(done)
        if skipped:
            print(f"waypost: on hold, not scheduled, nor what needs them ({', '.join(sorted(skipped))}): "
                  + "; ".join(self._on_hold[:6]) + (" ..." if len(self._on_hold) > 6 else "")
                  + " (`waypost retry STAGE` to try again now)", file=sys.stderr)
        return wanted

    def _held(self) -> dict[tuple[str, str], set[str]]:
        """(experiment, pair) → the stages not to schedule there: those on
        hold in the root's registry (layout.HELD: one listing), given up or
        waiting out their series backoff, and every stage downstream of them,
        funnels included."""
        registry = layout.join(self.root, layout.HELD)
        now = time.time()
        if self.mirror is None:
            try:
                entries = {name: os.stat(os.path.join(registry, name)).st_mtime for name in os.listdir(registry)}
            except OSError:
                entries = {}
        else:
            from snakemake_storage_plugin_waypost import mtime_of
            prefix = storage.filesystem(registry)[1] + "/"
            entries = {key[len(prefix):]: mtime_of(info) for key, info in storage.listing(self.root).items()
                       if key.startswith(prefix)}
        held: dict[tuple[str, str], set[str]] = {}
        self._on_hold = []
        for name, until in sorted(entries.items()):
            parts = name.split("~")
            if len(parts) < 3 or (until and until <= now):
                continue
            pair, experiment, stage = parts[:3]
            self._on_hold.append(f"{layout.stage_name(*parts)} " + ("given up" if not until else
                                                 "waiting until " + time.strftime("%H:%M", time.localtime(until))))
            below = self._downstream(stage)
            held.setdefault((experiment, pair), set()).update({stage} | below)
            held.setdefault((experiment, layout.ALL_PAIRS), set()).update(below)
        return held

    def _tracked_outputs(self):
        """(stage, wildcard values, output) of every tracked stage, for the
        selected experiments and pairs."""
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
                        for p in patterns:
                            yield rule.rule.name, values, apply_wildcards(p, values)

    def all_outputs(self) -> list[str]:
        return [path for _, _, path in self._tracked_outputs()]

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
