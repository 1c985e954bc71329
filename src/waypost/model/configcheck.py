"""What the config's schema can't say (``check_semantics``: names that
must be the workflow's stages, an experiment's axis values or instances,
policies that parse, settings typed by their values), and the one check of
the names a command was given (``check_names``, ``check_instance_names``)."""

from __future__ import annotations

import json

from waypost.model import paramsets
from waypost.model.errors import ConfigError
from waypost.model.layout import ALL_PAIRS, NAME_RULE
from waypost.model.prepared import Axis, axis_words, derived
from waypost.model.stagesettings import INSTANCE_PATTERN, instance_matches, is_pattern, points, stage_settings


def check_semantics(config: dict, source: str, axis: Axis | None = None, stages: list[str] | None = None,
                    instanced: list[str] | None = None, instances: dict | None = None,
                    declared: frozenset = frozenset()) -> None:
    """What the schema can't say: names that must be the workflow's stages
    (``stages``, when known), an experiment's axis values or its instances
    (``instances``: experiment → names, when known; else its grid's
    points, when it has a grid), policies that parse, and the settings of a
    stage the workflow's schema doesn't declare (``declared``), typed by
    their values in the top-level ``stages`` (``typed_settings``).
    ``config`` is in the engine's axis names (see ``prepare``)."""
    check = _SemanticCheck(config, source, axis, stages, instanced)
    check.declared = declared
    if stages is not None:
        for stage in config.get("stages", {}):
            check.stage(f"stages.{stage}", stage)
    for name, experiment in config["experiments"].items():
        check.experiment(name, experiment, (instances or {}).get(name))
    if check.problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(check.problems))


def typed_mismatch(declared, value) -> str | None:
    """What ``value`` is when it is not of the kind ``declared`` is (a
    number, a whole number, text, true/false, a list, a mapping; a null
    declares nothing), else None."""
    kinds = ((bool, "true or false"), (int, "a whole number"), (float, "a number"), (str, "text"),
             (list, "a list"), (dict, "a mapping"))
    if declared is None or value is None:
        return None
    want = next((kind for kind, _ in kinds if isinstance(declared, kind)), None)
    have = next(((kind, name) for kind, name in kinds if isinstance(value, kind)), (None, type(value).__name__))
    if want is None or have[0] is want or (want is float and have[0] is int):
        return None
    return have[1]


class _SemanticCheck:
    """check_semantics's problems, collected one part of the config at a time."""

    def __init__(self, config: dict, source: str, axis: Axis | None, stages: list[str] | None,
                 instanced: list[str] | None):
        self.config, self.source, self.instanced = config, source, instanced
        self.derived = derived(config)
        self.word, self.key, self.per = (axis.word, axis.key, axis.per) if axis else \
            ("axis value", "axis values", "per_" + "axis")
        self.known = stages if stages is not None else list(config["stages"])
        self.problems: list[str] = []
        self.policies: dict[str, str | None] = {}   # a policy's JSON → its error (None: it parses)
        self.declared: frozenset = frozenset()     # stages the workflow's schema declares

    def problem(self, text: str) -> None:
        self.problems.append(f"{self.source}: {text}")

    def stage(self, where: str, stage: str) -> None:
        if stage not in self.known:
            self.problem(f"{where}: unknown stage {stage!r} "
                         f"(expected one of the workflow's stages: {', '.join(self.known)})")

    def experiment(self, name: str, experiment: dict, known_instances: list[str] | None) -> None:
        for stage, values in experiment.get("stages", {}).items():
            self.stage(f"experiments.{name}.stages.{stage}", stage)
            self.typed(f"experiments.{name}.stages.{stage}", stage, values, None)
        self.per_pair(name, experiment)
        self.reuse(name, experiment)
        if known_instances is None and name in self.derived.points:
            known_instances = list(self.derived.points[name])
        overrides = experiment.get("per_instance") or {}
        for pattern, settings in overrides.items():
            self.per_instance(name, experiment, pattern, settings, known_instances)
        self.experiment_policies(name, experiment, overrides)

    def per_pair(self, name: str, experiment: dict) -> None:
        pairs = experiment["pairs"]
        for pair, settings in experiment.get("per_pair", {}).items():
            if pair not in pairs:
                self.problem(f"experiments.{name}.{self.per}.{pair}: unknown {self.word} {pair!r} "
                             f"(expected one of this experiment's {self.key}: {', '.join(pairs)})")
            for stage, values in settings.items():
                self.stage(f"experiments.{name}.{self.per}.{pair}.{stage}", stage)
                self.typed(f"experiments.{name}.{self.per}.{pair}.{stage}", stage, values, None)

    def reuse(self, name: str, experiment: dict) -> None:
        pairs = experiment["pairs"]
        for stage, where in experiment.get("reuse", {}).items():
            self.stage(f"experiments.{name}.reuse.{stage}", stage)
            for pair, origin in (where.items() if isinstance(where, dict) else [(None, where)]):
                if pair is not None and pair not in pairs:
                    self.problem(f"experiments.{name}.reuse.{stage}.{pair}: unknown {self.word} {pair!r} "
                                 f"(expected one of this experiment's {self.key}: {', '.join(pairs) or 'none'})")
                if origin == name:
                    self.problem(f"experiments.{name}.reuse.{stage}: an experiment can't reuse its own stage")

    def per_instance(self, name: str, experiment: dict, pattern: str, settings: dict | None,
                     known_instances: list[str] | None) -> None:
        where = f"experiments.{name}.per_instance.{pattern}"
        if not INSTANCE_PATTERN.fullmatch(pattern) or ".." in pattern:
            self.problem(f"{where}: {pattern!r} is neither an instance name ({NAME_RULE}) nor a "
                         "shell pattern of one (*, ?, [...])")
            return
        if known_instances is not None and not any(instance_matches(pattern, i) for i in known_instances):
            self.problem(f"{where}: names no instance of experiment {name} "
                         f"({_some(known_instances, 'its instances')})")
        grid = bool(experiment.get("grid"))
        for stage, values in (settings or {}).items():
            self.stage(f"{where}.{stage}", stage)
            self.typed(f"{where}.{stage}", stage, values, experiment)
            if self.instanced is not None and stage in self.known and stage not in self.instanced:
                self.problem(f"{where}.{stage}: stage {stage} has no instances (per_instance is "
                             f"for the stages with instances: {', '.join(self.instanced) or 'none'})")
            for axis_name in sorted(set(values or {}) & set(self.derived.parameters(name))):
                self.problem(f"{where}.{stage}.{axis_name}: {axis_name} is "
                             + ("an axis of the grid" if grid else "a parameter of the points")
                             + ": a point's value is in its name (change the "
                             + ("grid" if grid else "points") + " instead)")

    def typed(self, where: str, stage: str, values, experiment: dict | None) -> None:
        """A stage the workflow's schema doesn't declare has the settings its
        top-level ``stages`` entry gives, typed by their values: an override
        of one has a value of its type, and a point's override (``experiment``
        given) names one of them or one its experiment gives."""
        if stage in self.declared or not isinstance(values, dict):
            return
        base = {k: v for k, v in (self.config.get("stages", {}).get(stage) or {}).items()
                if k not in paramsets.ENGINE_KEYS}
        for key, value in values.items():
            if key in paramsets.ENGINE_KEYS:
                continue
            if key in base:
                wrong = typed_mismatch(base[key], value)
                if wrong:
                    self.problem(f"{where}.{key}: {value!r} is {wrong}, and stages.{stage}.{key} is "
                                 f"{base[key]!r}: expected a value of its type")
            elif experiment is not None and base and key not in self._experiment_keys(experiment, stage):
                self.problem(f"{where}.{key}: not a setting of stage {stage} (its settings: "
                             f"{', '.join(base)}); a new one is declared with its default in stages.{stage}")

    @staticmethod
    def _experiment_keys(experiment: dict, stage: str) -> set:
        keys = set(experiment.get("stages", {}).get(stage) or {})
        for settings in (experiment.get("per_pair") or {}).values():
            keys |= set((settings or {}).get(stage) or {})
        return keys

    def experiment_policies(self, name: str, experiment: dict, overrides: dict) -> None:
        # Axis values without overrides share their settings: check the first.
        per_pair = experiment.get("per_pair", {})
        first_shared = next((pair for pair in experiment["pairs"] if pair not in per_pair), ALL_PAIRS)
        scopes = [(first_shared, ()), *((pair, ()) for pair in per_pair),
                  *((first_shared, (pattern,)) for pattern in overrides)]
        for pair, matched in scopes:
            for stage in self.known:
                self.policy(name, pair, stage, matched)

    def policy(self, name: str, pair: str, stage: str, matched: tuple) -> None:
        """One scope's policy parses (each distinct policy is parsed once)."""
        from waypost.model.policy import Policy, PolicyError

        policy = stage_settings(self.config, name, pair, stage, matched=matched)["policy"]
        text = json.dumps(policy, sort_keys=True)
        if text in self.policies:
            return
        try:
            Policy.from_config(policy)
            self.policies[text] = None
        except PolicyError as exc:
            self.policies[text] = str(exc)
            where = f"experiment {name}" + (f", {self.word} {pair}" if pair != ALL_PAIRS else "") \
                + (f", instance {matched[0]}" if matched else "")
            self.problem(f"policy of stage {stage} ({where}): {exc}")


def _some(names, what: str, shown: int = 6) -> str:
    names = list(names)
    if not names:
        return f"{what}: none"
    more = f", … ({len(names)} in all)" if len(names) > shown else ""
    return f"{what}: {', '.join(names[:shown])}{more}"


def _names(value) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def check_names(config: dict, experiments=None, pairs=None, stages=None, allow_all_pairs: bool = False) -> None:
    """The one check of the experiment, pair and stage names a command was
    given (each a name, a list of names or None): ConfigError naming the
    first that isn't configured, and what is (every ``waypost`` command
    answers the same, with exit code 2). Pairs are checked against the
    given experiments' pairs (all experiments' when none are given);
    ``allow_all_pairs`` admits the per-experiment slot of funnels (``_all``)."""
    known = config["experiments"]
    chosen = _names(experiments)
    for name in chosen:
        if name not in known:
            raise ConfigError(f"unknown experiment {name!r} (expected one of: {', '.join(known)})")
    scope = chosen or list(known)
    pairs_known = {p for e in scope for p in known[e]["pairs"]}
    for name in _names(pairs):
        if name not in pairs_known and not (allow_all_pairs and name == ALL_PAIRS):
            where = ("any experiment" if not chosen else
                     f"experiment {chosen[0]}" if len(chosen) == 1 else f"experiments {', '.join(chosen)}")
            word = axis_words(config)[0]
            raise ConfigError(f"unknown {word} {name!r}: not a {word} of {where}")
    for name in _names(stages):
        if name not in config["stages"]:
            raise ConfigError(f"unknown stage {name!r} (expected one of: {', '.join(config['stages'])})")


def check_instance_names(config: dict, names: list[str] | None, experiments=None, found=()) -> None:
    """The one check of the instance names a command was given: each that
    is not a shell pattern must be a grid point of the given experiments
    (all, when none are given) or be in ``found`` (instance directories
    there are: names, or stage → its names, and then the error lists each
    stage's own). ConfigError naming the first that is neither."""
    chosen = _names(experiments) or list(config["experiments"])
    order = {stage: i for i, stage in enumerate(config.get("stages") or {})}   # (the config's order)
    per_stage = {stage: sorted(set(found[stage])) for stage in sorted(found, key=lambda s: order.get(s, len(order)))
                 if found[stage]} if isinstance(found, dict) else {}
    if per_stage:
        found = set().union(*per_stage.values())
    for name in names or []:
        if not INSTANCE_PATTERN.fullmatch(name) or ".." in name:
            raise ConfigError(f"instance {name!r} is neither a valid name ({NAME_RULE}) nor a shell pattern")
        if is_pattern(name):
            continue
        known = {}
        for experiment in chosen:
            known.update(dict.fromkeys(points(config, experiment)))
        known.update(dict.fromkeys(sorted(set(found) - set(known))))
        if name not in known:
            where = f"experiment {chosen[0]}" if len(chosen) == 1 else f"experiments {', '.join(chosen)}"
            listed = "; ".join(_some(found, f"{stage}'s instances") for stage, found in per_stage.items()) \
                if per_stage else _some(known, "instances")
            raise ConfigError(f"unknown instance {name!r}: not an instance of {where} "
                              f"({listed}; or a shell pattern, quoted)")
