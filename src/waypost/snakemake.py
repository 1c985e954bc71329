"""The small helper API the Snakefile and rules use.

Rules stay plain Snakemake; they ask this module for stage paths, for inputs
(wrapped in ``ancient()`` in presence mode, so an existing output is done
whatever its timestamps), for a stage's settings, and for the step-runner
prefix of their shell command.
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
import subprocess
import sys

from . import config as wconfig
from . import layout
from . import workers as wworkers

INSTANCE = "{instance}"
# Settings that steer the engine, not the step: not passed to it, not hashed.
ENGINE_KEYS = ("policy", "worker", "resources")


def code_version(directory: str) -> str:
    """The git commit of the workflow (``-dirty`` when it has local changes)."""
    try:
        out = subprocess.run(["git", "-C", directory, "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


class Pipeline:
    """Loads and validates the config, then answers the rules' questions.

    The default config file is read here rather than by a ``configfile:``
    directive so that a YAML error names the file, line and column; config
    files given with ``--configfile`` are loaded by Snakemake as usual, and
    ``--config KEY=VALUE`` overrides apply on top of either.
    """

    def __init__(self, config: dict, workflow, default_configfile: str = "config/config.yaml"):
        self.workflow_dir = workflow.basedir
        self.repo_dir = os.path.dirname(os.path.abspath(self.workflow_dir))
        try:
            if workflow.configfiles:
                source = ", ".join(map(str, workflow.configfiles))
            else:
                source = default_configfile
                loaded = wconfig.load_yaml(default_configfile)
                overrides = workflow.config_settings.overwrite_config or {}
                config.update(wconfig.merge(loaded, dict(overrides)))
            prepared = wconfig.prepare(dict(config), self.workflow_dir, source)
        except wconfig.ConfigError as exc:
            # A clean one-paragraph error from Snakemake, before any job runs.
            from snakemake.exceptions import WorkflowError
            raise WorkflowError(str(exc)) from None
        config.clear()
        config.update(prepared)
        self.config = config
        self.root = config["root"]
        self.presence = config["rerun_policy"] == "presence"
        self.code_version = code_version(self.workflow_dir)
        self.python = sys.executable
        self.scripts = os.path.join(self.repo_dir, "scripts")
        self.pool = config["pool"]
        self.workers = self._load_workers(config["workers"])
        self._tracked: list = []
        self._parents: dict[str, set] = {}   # stage → the stages it takes inputs from
        self._default_class: dict[str, str] = {}
        # Per (experiment, scope, stage), where the scope is the pair when the
        # experiment's per_pair overrides it, else None (all its other pairs
        # and its funnels share one set of settings): computed once each.
        self._settings: dict[tuple, dict] = {}
        self._policies: dict[tuple, object] = {}
        self._tolerated: dict[tuple, bool] = {}
        self._step_options: dict[tuple, str] = {}
        self._resources: dict[tuple, dict] = {}   # (stage, experiment, scope, attempt) → resources
        self.workflow = workflow

    def _load_workers(self, path: str) -> dict:
        if not os.path.isabs(path) and not os.path.exists(path):
            path = os.path.join(self.repo_dir, path)
        try:
            workers = wworkers.load(path)
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
        return layout.join(self.root, *parts)

    def needs(self, consumer: str, **inputs):
        """The inputs of stage ``consumer``, for a rule's ``input: unpack(...)``
        (every stage rule has one, even without inputs of its own).

        Each value names the upstream stage: ``(stage, filename[, instance])``
        for one of its outputs, or ``(stage, function)`` where the function of
        the wildcards returns path(s) (``stage`` may be a tuple of the stages
        the function picks from). In presence mode a job whose outputs are
        all present is done: it gets no inputs at all, so nothing upstream of
        it (being rerun, or missing in an experiment where its outputs were
        placed by hand) can make it rerun; otherwise inputs are ancient, so
        timestamps never matter. A stage left unfinished by a failure (its
        ``_unfinished`` marker, newer than its outputs) gets the marker as an
        input: that is what makes Snakemake redo it on the next run.

        One input function per rule (not one per input): Snakemake inspects
        every callable of every job, so fewer callables plan faster.
        """
        for stage, *_ in inputs.values():
            self._parents.setdefault(consumer, set()).update([stage] if isinstance(stage, str) else stage)
        # name → a function of the wildcards, or the path pattern to format
        sources = {name: rest[0] if callable(rest[0]) else self.path(stage, *rest)
                   for name, (stage, *rest) in inputs.items()}

        def job_inputs(wildcards):
            marker = os.path.join(self.stage_dir(consumer, wildcards), layout.UNFINISHED)
            unfinished = os.path.exists(marker)
            if self.presence and not unfinished and self.is_done(consumer, wildcards):
                return {name: [] for name in inputs}
            values = dict(wildcards.items())
            resolved = {}
            for name, source in sources.items():
                found = source(wildcards) if callable(source) else source.format(**values)
                found = [found] if isinstance(found, str) else list(found)
                # An unfinished stage must wait for its parents when they are
                # redone too: its inputs are not ancient (Snakemake would
                # otherwise skip it as a mere dependent of a rerun job).
                resolved[name] = found if unfinished else [self.mark(p) for p in found]
            if unfinished:
                resolved["_unfinished"] = marker
            return resolved
        return _presigned(job_inputs)

    def stage_dir(self, stage: str, wildcards) -> str:
        return layout.stage_dir(self.root, wildcards.get("pair", layout.ALL_PAIRS), wildcards.experiment,
                                stage, wildcards.get("instance"))

    def is_unfinished(self, stage: str, wildcards) -> bool:
        return os.path.exists(os.path.join(self.stage_dir(stage, wildcards), layout.UNFINISHED))

    def is_done(self, stage: str, wildcards) -> bool:
        from snakemake.io import apply_wildcards
        values = dict(wildcards.items())
        return all(os.path.exists(apply_wildcards(p, values)) for p in self.workflow.get_rule(stage).output)

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

    def mark(self, path: str):
        if self.presence:
            from snakemake.io import ancient
            return ancient(path)
        return path

    # --- settings --------------------------------------------------------
    def _scope(self, experiment: str, pair: str) -> str | None:
        """The pair, where the experiment's ``per_pair`` overrides it; else
        None: the experiment's other pairs and its funnels share settings."""
        return pair if pair in self.config["experiments"][experiment].get("per_pair", {}) else None

    def _scopes(self):
        """One (experiment, pair) per distinct set of stage settings."""
        for experiment, spec in self.config["experiments"].items():
            yield experiment, layout.ALL_PAIRS
            yield from ((experiment, pair) for pair in spec.get("per_pair", {}))

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
        stage's policy), plus the attempt number for the step runner.

        Snakemake calls every resource function of every job, so a resource
        is a plain value where it is the same for every experiment, pair and
        attempt, and a function only where it is not.
        """
        self._default_class[stage] = default_class
        scopes = list(self._scopes())
        firsts = [self._job_resources(stage, default_class, e, p, 1) for e, p in scopes]
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
        resources["waypost_attempt"] = _presigned(lambda wildcards, attempt: attempt)
        return resources

    def _resource_function(self, stage: str, default_class: str, name: str):
        def value(wildcards, attempt):
            return self._job_resources(stage, default_class, wildcards.experiment,
                                       wildcards.get("pair", layout.ALL_PAIRS), attempt).get(name)
        return _presigned(value)

    # --- the step runner ------------------------------------------------
    #: The start of every stage rule's shell command; the step's own command follows.
    run = "{params.step} --snakemake-attempt {resources.waypost_attempt} -- "

    def step(self, stage: str):
        """A params function giving the step-runner options of a job (see ``run``)."""
        def prefix(wildcards, input, output):
            pair = wildcards.get("pair", layout.ALL_PAIRS)
            instance = wildcards.get("instance")
            stage_dir = layout.stage_dir(self.root, pair, wildcards.experiment, stage, instance)
            head = [self.python, "-m", "waypost.runner", "--stage-dir", stage_dir,
                    "--experiment", wildcards.experiment, "--pair", pair, "--stage", stage]
            tail = ["--instance", instance] if instance else []
            if self.tolerated(stage, wildcards.experiment, pair):
                tail.append("--tolerated")
            marker = os.path.join(stage_dir, layout.UNFINISHED)   # an input only to make Snakemake redo it
            for path in input:
                if path != marker:
                    tail += ["--input", path]
            for path in output:
                tail += ["--output", path]
            return " ".join([shlex.join(head), self._runner_options(stage, wildcards.experiment, pair)]
                            + ([shlex.join(tail)] if tail else []))
        return _presigned(prefix)

    def _runner_options(self, stage: str, experiment: str, pair: str) -> str:
        """The step runner's options that the stage's settings decide (quoted)."""
        key = (stage, experiment, self._scope(experiment, pair))
        if key not in self._step_options:
            settings = self.settings(experiment, pair, stage)
            engine = {key: settings.pop(key, None) for key in ENGINE_KEYS}
            policy = dict(engine["policy"] or {})
            worker_name, spec = self.worker(stage, self._default_class.get(stage, "cpu"), experiment, pair)
            runtime = (engine["resources"] or {}).get("runtime", spec.get("runtime"))
            if policy.get("runtime") is None and runtime:
                policy["runtime"] = runtime
            self._step_options[key] = shlex.join([
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
        """The default run's targets.

        presence: only the outputs that are missing. A present output is done,
        so its job is not even in the DAG: deleting one intermediate reruns
        exactly its job, and nothing downstream of it (their outputs are
        there). mtime: every output, and Snakemake's timestamp rule decides.
        """
        wanted = self.all_outputs()
        if self.presence:
            wanted = [path for path in wanted if not os.path.exists(path)
                      or os.path.exists(os.path.join(os.path.dirname(path), layout.UNFINISHED))]
        return wanted

    def all_outputs(self) -> list[str]:
        from snakemake.io import apply_wildcards
        targets = []
        for rule, instances in self._tracked:
            patterns = list(rule.output)
            per_experiment = "pair" not in rule.rule.wildcard_names
            for experiment in self.experiments:
                pairs = [layout.ALL_PAIRS] if per_experiment else self.pairs(experiment)
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


def _literal(value) -> bool:
    """Can Snakemake take ``value`` as a plain param? It formats wildcards
    into strings (and lists of them), so none may hold a brace."""
    return not any(isinstance(v, str) and ("{" in v or "}" in v)
                   for v in (value if isinstance(value, list) else [value]))
