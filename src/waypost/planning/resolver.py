"""The resolver: what the config says for each stage job.

A job's settings, policy, worker class and resources, and where it is
reused from, per *scope*: the experiment, the axis value where the
experiment's overrides or reuse name it, and the ``per_instance`` overrides
that match its instance. Jobs of one scope are alike, so each answer is
computed once per scope (a grid point's own values go on top). The config
is complete once ``freeze`` has been told every instance name the rules
know (at ``wp.finish()``); nothing changes after.
"""

from __future__ import annotations

from functools import cached_property

from waypost import scheduler as wscheduler
from waypost import stores
from waypost.model import config as wconfig
from waypost.model import layout
from waypost.model import workers as wworkers
from waypost.model.policy import Policy
from waypost.planning import fanout
from waypost.planning.stagegraph import StageGraph, presigned

#: ``setting``'s default when the rule gives none: the setting must be in the config
NO_DEFAULT = object()

REUSE_CLASS = "cpu"   # the worker class reuse jobs get, when the pool has it


class Resolver:
    def __init__(self, config: dict, graph: StageGraph, workers: dict, source: str):
        self.config = config
        self.graph = graph
        self.workers = workers
        self.pool = config["pool"]
        self.source = source
        experiments = config["experiments"]
        self._named_pairs = {name: set(spec.get("per_pair", {})).union(
            *(where for where in spec.get("reuse", {}).values() if isinstance(where, dict)))
            for name, spec in experiments.items()}
        # Per instance, only where an experiment's per_instance overrides match
        # it (see scope); a grid point's own values on top (see point).
        self._overridden = {name: bool(spec.get("per_instance")) for name, spec in experiments.items()}
        self._overridden_by: dict[str, list[str]] = {name: [] for name in experiments}   # see freeze
        self.points = {name: wconfig.points(config, name) for name in experiments}
        self._reusing = {name: set(spec.get("reuse", {})) for name, spec in experiments.items()}
        self._reused = set().union(*self._reusing.values())
        self._matched: dict[tuple, tuple] = {}
        self._point_keys: dict[str, set] = {}
        self._settings: dict[tuple, dict] = {}
        self._policies: dict[tuple, Policy] = {}
        self._tolerated: dict[tuple, bool] = {}
        self._resources: dict[tuple, dict] = {}   # (stage, experiment, scope, attempt) → resources

    def any_overridden(self) -> bool:
        """Has some experiment ``per_instance`` overrides?"""
        return any(self._overridden.values())

    def override_instances(self, grid) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """For the experiments with ``per_instance`` overrides: experiment →
        the instance names of its stages, which the overrides must match,
        and experiment → those known so far where a checkpoint finds more
        (its overrides can't be checked before). A stage over the grid
        (``instances=grid``) in an experiment without one is an error."""
        stages = self.graph.stages
        instanced = self.graph.instanced()
        for stage in instanced:
            self._check_points(stage, stages[stage].instances, grid)
        found, unchecked = {}, {}
        for experiment in self.graph.experiments:
            if not self._overridden[experiment]:
                continue
            names, parts = {}, False
            for stage in instanced:
                if fanout.checkpoint_parts(stages[stage].instances):
                    parts = True   # found by a checkpoint as it runs: an override may name them
                    continue
                names.update(dict.fromkeys(self.graph.instances(stage, experiment)))
            (unchecked if parts else found)[experiment] = list(names)
        return found, unchecked

    def _check_points(self, stage: str, spec, grid) -> None:
        """A stage over the points (``instances=wp.grid``, or
        ``wp.grid.per(...)``) needs them in every experiment, and the
        parameters it names."""
        per = getattr(spec, "points", None) is grid
        if spec is not grid and not per:
            return
        for experiment in self.graph.experiments:
            where = f"{self.source}: experiments.{experiment}"
            if not self.points[experiment]:
                raise wconfig.ConfigError(f"{where}: no parameter set, and rule {stage} runs once per point of it "
                                          f"({'instances=' + repr(spec)}): add one ({wconfig.SETS_HINT})")
            missing = spec.missing(experiment) if per else None
            if missing:
                have = ", ".join(spec.points.dims_in(experiment))
                raise wconfig.ConfigError(f"{where}: rule {stage} runs once per value of {missing!r} "
                                          f"(instances={spec!r}), and this experiment's points have no parameter "
                                          f"{missing!r} (their parameters: {have})")
            if per:
                try:
                    spec.combinations(experiment)
                except fanout.FanoutError as exc:
                    raise wconfig.ConfigError(f"{where}: {exc}") from None

    def freeze(self, known: dict[str, list[str]]) -> None:
        """The instance names known per experiment (of those with
        ``per_instance`` overrides), once the config is complete: one of
        them per set of overrides that match some, for ``scopes``."""
        for experiment, names in known.items():
            groups: dict[tuple, str] = {}
            for instance in names:
                groups.setdefault(wconfig.override_keys(self.config, experiment, instance), instance)
            self._overridden_by[experiment] = [instance for matched, instance in groups.items() if matched]

    # --- scopes ------------------------------------------------------------
    def scope(self, experiment: str, pair: str, instance: str | None = None):
        """The pair, where the experiment's ``per_pair`` or ``reuse`` names it,
        else None: the experiment's other pairs and its funnels are alike;
        with the ``per_instance`` overrides that match the instance, when
        some do (instances no override names are alike too). A grid point's
        own values are not in it (see ``stage_settings``)."""
        scope = pair if pair in self._named_pairs[experiment] else None
        if instance is None or not self._overridden[experiment]:
            return scope
        matched = self._matched.get((experiment, instance))
        if matched is None:
            matched = self._matched[(experiment, instance)] = wconfig.override_keys(self.config, experiment, instance)
        return (scope, matched) if matched else scope

    def scopes(self):
        """One (experiment, pair, instance) per distinct set of stage settings
        and reuse (an instance for each set of ``per_instance`` overrides
        that match some instances, once ``freeze`` has them)."""
        for experiment, pairs in self._named_pairs.items():
            yield experiment, layout.ALL_PAIRS, None
            yield from ((experiment, pair, None) for pair in sorted(pairs))
            yield from ((experiment, layout.ALL_PAIRS, instance) for instance in self._overridden_by[experiment])

    def point(self, experiment: str, instance: str | None) -> str | None:
        """The instance, when it is a point of the experiment's grid (whose
        values are its own settings), else None."""
        points = self.points[experiment]
        return instance if points and instance in points else None

    # --- settings ------------------------------------------------------------
    def stage_settings(self, experiment: str, pair: str, stage: str, instance: str | None = None) -> dict:
        """The merged settings, shared: not to be changed (a grid point's: a
        new dict each time, its values over its scope's settings)."""
        scope = self.scope(experiment, pair, instance)
        key = (experiment, scope, stage)
        if key not in self._settings:
            matched = scope[1] if isinstance(scope, tuple) else ()
            self._settings[key] = wconfig.stage_settings(self.config, experiment, pair, stage, matched=matched)
        point = self.point(experiment, instance)
        if point is not None:
            return {**self._settings[key], **self.points[experiment][point]}
        return self._settings[key]

    def scope_settings(self, experiment: str, scope, stage: str) -> dict:
        """A scope's settings, once ``stage_settings`` made them."""
        return self._settings[(experiment, scope, stage)]

    def setting(self, stage: str, key: str, default=NO_DEFAULT):
        """One setting of a stage as a rule's param: a plain value when it is
        the same in every scope (and no grid point or instance override
        sets it), else a function of the job's wildcards. With no
        ``default``, a setting that no scope has is said in one line before
        any job runs (not passed on as ``None``, which a shell command would
        take for the text "None"); one that only some scopes have is said
        for a job of a scope without it, as Snakemake says a params
        function's error."""
        scoped = [self.stage_settings(e, p, stage, i) for e, p, i in self.scopes()]
        per_point = key in self._per_point_keys(stage)
        if default is NO_DEFAULT and not per_point and scoped and not any(key in s for s in scoped):
            raise wconfig.ConfigError(self._no_setting(stage, key, f"stages.{stage}"))
        values = [s.get(key, default) for s in scoped]
        if not per_point and values and all(v == values[0] for v in values) and _literal(values[0]):
            return values[0]

        def value(wildcards):
            settings = self.stage_settings(wildcards.experiment, self.graph.pair(wildcards), stage,
                                           wildcards.get("instance"))
            if key not in settings and default is NO_DEFAULT:
                raise wconfig.ConfigError(self._no_setting(stage, key, f"experiments.{wildcards.experiment}"))
            return settings.get(key, default)
        return presigned(value)

    def _no_setting(self, stage: str, key: str, where: str) -> str:
        return (f"{self.source}: {where} has no setting {key!r} for stage {stage}, whose rule asks for it "
                f"(wp.setting({key!r})): set it in the config's stages.{stage} (or an experiment's), or give the "
                f"rule a default: wp.setting({key!r}, DEFAULT)")

    def _per_point_keys(self, stage: str) -> set[str]:
        if stage not in self._point_keys:
            self._point_keys[stage] = wconfig.per_point_keys(self.config, stage)
        return self._point_keys[stage]

    def grid(self, experiment: str) -> list[str]:
        points = self.points.get(experiment)
        if not points:
            raise wconfig.ConfigError(f"{self.source}: experiments.{experiment} has no parameter set: a stage with "
                                      f"instances=wp.grid needs one ({wconfig.SETS_HINT})")
        return list(points)

    def policy(self, experiment: str, pair: str, stage: str, instance: str | None = None) -> Policy:
        key = (experiment, self.scope(experiment, pair, instance), stage)
        if key not in self._policies:
            self._policies[key] = Policy.from_config(self.stage_settings(experiment, pair, stage, instance)["policy"])
        return self._policies[key]

    def tolerated(self, stage: str, experiment: str, pair: str, instance: str | None = None) -> bool:
        """Does a funnel downstream of ``stage`` accept its failure?"""
        key = (stage, experiment, self.scope(experiment, pair, instance))
        if key not in self._tolerated:
            stages = self.graph.stages
            self._tolerated[key] = any(
                self.policy(experiment, pair, child, instance if stages[child].instances is not None else None)
                .tolerates_failure for child in self.graph.downstream(stage))
        return self._tolerated[key]

    # --- reuse -----------------------------------------------------------------
    def reuse_location(self, experiment: str, pair: str, stage: str, instance: str | None = None) -> str | None:
        """The stage directory an experiment takes this stage from (its
        ``reuse`` setting), or None when the stage is computed here."""
        if stage not in self._reusing[experiment]:
            return None
        source = wconfig.reuse_source(self.config, experiment, pair, stage)
        if source is None:
            return None
        if layout.is_valid_name(source):   # another experiment under the same root
            location = layout.stage_dir(self.config["root"], pair, source, stage, instance)
        else:
            location = wconfig.source_of_instance(source, instance)
        return stores.absolute(location)

    def reuse_experiment(self, experiment: str, pair: str, stage: str) -> str | None:
        """The experiment of this config, under the same root, that an
        experiment takes this stage from (its ``reuse`` names it), or None:
        computed here, or taken from a directory or another root."""
        if stage not in self._reusing[experiment]:
            return None
        source = wconfig.reuse_source(self.config, experiment, pair, stage)
        return source if source in self.config["experiments"] else None

    def reusers(self, experiment: str, pair: str, stage: str) -> list[str]:
        """The experiments that take this stage of ``experiment`` (at this
        pair) by its name (``reuse_experiment``)."""
        return [other for other in self._reusing if stage in self._reusing[other]
                and self.reuse_experiment(other, pair, stage) == experiment]

    def is_reused(self, stage: str) -> bool:
        """Does some experiment take this stage from elsewhere?"""
        return stage in self._reused

    def reused_from(self, stage: str, values: dict) -> str | None:
        """Where a job (its wildcard values) is reused from, if it is."""
        if stage not in self._reused:   # (asked at every job: most stages no experiment reuses)
            return None
        return self.reuse_location(values["experiment"], self.graph.pair(values), stage, values.get("instance"))

    # --- workers and resources -----------------------------------------------
    def worker(self, stage: str, default_class: str, experiment: str, pair: str,
               instance: str | None = None) -> tuple[str, dict]:
        """The worker class of a job (the rule's, unless the config names
        another for this stage, experiment, pair or instance) and its spec in the pool."""
        name = self.stage_settings(experiment, pair, stage, instance).get("worker", default_class)
        return name, wworkers.worker_class(self.workers, self.pool, name, f"stage {stage}")

    @cached_property
    def resource_names(self) -> dict[str, str]:
        """The resource names the pool's scheduler has for workers.yaml's keys
        of its own (asked once a class of the pool was found: the pool is there)."""
        return wscheduler.resource_names(self.workers["pools"][self.pool]["executor"])

    def job_resources(self, stage: str, default_class: str, experiment: str, pair: str, attempt: int,
                      instance: str | None = None) -> dict:
        key = (stage, experiment, self.scope(experiment, pair, instance), attempt)
        if key not in self._resources:
            instance = instance if isinstance(key[2], tuple) else None   # (its scope's settings decide)
            settings = self.stage_settings(experiment, pair, stage, instance)
            _, spec = self.worker(stage, default_class, experiment, pair, instance)
            if (self.reuse_location(experiment, pair, stage)
                    and REUSE_CLASS in self.workers["pools"][self.pool]["classes"]):
                # a reuse job only copies files: no GPU node for that
                spec = wworkers.worker_class(self.workers, self.pool, REUSE_CLASS, f"stage {stage}")
            policy = self.policy(experiment, pair, stage, instance)
            overrides = dict(settings.get("resources") or {})
            if policy.runtime is not None:
                overrides["runtime"] = policy.runtime
            self._resources[key] = wworkers.resources(spec, overrides, attempt, policy.runtime_growth,
                                                      policy.memory_growth, self.resource_names)
        return self._resources[key]

    def resources(self, stage: str, default_class: str, per_job: bool = False) -> dict:
        """A stage rule's resources: the worker class's in the selected pool,
        per job and attempt (runtime and memory grow per the stage's policy).
        Snakemake calls every resource function of every job, so a resource
        is a plain value where it is the same for every scope and attempt,
        and a function only where it is not (``per_job``: always one)."""
        scopes = list(self.scopes())
        firsts = [self.job_resources(stage, default_class, e, p, 1, i) for e, p, i in scopes]
        growing = set()
        for e, p, i in scopes:
            policy = self.policy(e, p, stage, i)
            growing |= ({"runtime"} if policy.runtime_growth != 1 else set()) \
                | ({"mem_mb"} if policy.memory_growth != 1 else set())
        resources = {}
        for name in dict.fromkeys(n for first in firsts for n in first):
            values = [first.get(name) for first in firsts]
            if name not in growing and not per_job and all(v == values[0] for v in values):
                resources[name] = values[0]
            else:
                resources[name] = self._resource_function(stage, default_class, name)
        return resources

    def _resource_function(self, stage: str, default_class: str, name: str):
        def value(wildcards, attempt):
            return self.job_resources(stage, default_class, wildcards.experiment, self.graph.pair(wildcards),
                                      attempt, wildcards.get("instance")).get(name)
        return presigned(value)


def _literal(value) -> bool:
    """Can Snakemake take ``value`` as a plain param? It formats wildcards
    into strings (and lists of them), so none may hold a brace."""
    return not any(isinstance(v, str) and ("{" in v or "}" in v)
                   for v in (value if isinstance(value, list) else [value]))
