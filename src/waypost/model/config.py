"""Loading, defaults, validation and merging of the pipeline config.

Errors name the file, the key and what was expected, and are raised before
anything runs. waypost's own keys have their schema in the package
(``schemas/config.schema.yaml``); a workflow's schema
(``workflow/schemas/config.schema.yaml``, optional) declares only what the
workflow adds: its stages' settings, its own experiment keys. The two are
merged here (``schema_for``) into one plain JSON schema of the kind
``snakemake.utils.validate`` takes, validated with jsonschema so the messages
can be precise. A workflow without a schema keeps its own top-level keys
(an existing Snakefile's config, with waypost's keys added): a key that
looks like a misspelt waypost key is only said (``_misspelt_keys``), as it
may be the pipeline's own.

Where waypost's keys are in a pipeline's config (``waypost_config``): under
a ``waypost:`` key, where they can't collide with the pipeline's own; else,
in a config with ``experiments`` at its top level (a waypost config as the
reference pipeline writes it), at the top level; else there are none, and
the defaults hold (records under ``.waypost/records``, one experiment,
``default``). Only a top-level config takes a workflow schema that extends
waypost's (one declaring ``experiments`` or ``stages``); any other schema
is the pipeline's own business.

The experiment's axis (``pairs`` in the reference pipeline) is the
workflow's word: the Snakefile names it (``Pipeline(..., axis="pair")``).
Inside the engine its values are always under ``pairs`` and its overrides
under ``per_pair`` (``prepare`` moves them there), whatever the workflow
calls them.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    import jsonschema

from waypost.model import locations, paramsets
from waypost.model.errors import ConfigError, WaypostError  # noqa: F401  (callers catch wconfig.ConfigError)
from waypost.model.layout import ALL_PAIRS, NAME_RULE
from waypost.model.layout import join as layout_join
from waypost.model.paramsets import ENGINE_KEYS

SCHEMA_FILE = os.path.join("schemas", "config.schema.yaml")   # below the workflow's directory
#: The key of a pipeline's config that holds waypost's keys (``waypost_config``).
SECTION = "waypost"
#: The root of a config that names none under ``waypost:`` (or has no waypost
#: key at all): beside Snakemake's own ``.snakemake/``, in the working
#: directory, so the records never mix with the pipeline's own output tree
#: (``results/`` of many a pipeline) and a ``rm -r results`` leaves them.
SECTION_ROOT = os.path.join(".waypost", "records")
#: The experiment of such a config when it names none.
DEFAULT_EXPERIMENT = "default"
#: The source named in messages when no config file was read.
NO_CONFIG_FILE = "(no config file)"
ENGINE_SCHEMA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas", "config.schema.yaml")


@dataclass(frozen=True)
class Axis:
    """The per-experiment axis a workflow names: ``word`` for one value
    (``pair``: the ``--pair`` option, the ``per_pair`` overrides, the
    ``{pair}`` wildcard), ``key`` for an experiment's list of them."""
    word: str
    key: str

    @property
    def per(self) -> str:
        return f"per_{self.word}"

    @classmethod
    def of(cls, word: str | None, key: str | None = None) -> Axis | None:
        if not word:
            return None
        return cls(word, key or word + "s")


@dataclass(frozen=True)
class Derived:
    """What ``prepare`` works out from a config, kept beside it rather than
    inside the user's keys: the workflow's ``axis`` (None: it has none) and
    each experiment's ``points`` (experiment → instance name → the point's
    values, in order; only the experiments with a parameter set). Every
    process that needs them prepares the config itself (a cluster job's
    Snakemake re-reads the Snakefile and the config files; the CLI and cron
    load them with the workflow's facts): nothing of it is written anywhere."""
    axis: Axis | None = None
    points: Mapping[str, Mapping[str, dict]] = field(default_factory=dict)
    #: waypost's keys were under ``waypost:`` (or there were none): the
    #: engine's schema alone is theirs (``waypost_config``).
    in_section: bool = False
    #: The config files read, for messages (``with_reuse_files``).
    source: str = ""

    def points_of(self, experiment: str) -> Mapping[str, dict]:
        """An experiment's points (empty without a parameter set)."""
        return self.points.get(experiment) or {}

    def parameters(self, experiment: str) -> tuple[str, ...]:
        """An experiment's parameters (of its points' set), in order."""
        found = self.points.get(experiment)
        return tuple(next(iter(found.values()))) if found else ()

    def axis_words(self) -> dict[str, str] | None:
        """The axis as JSON holds it (``waypost status --json``): word and key."""
        return {"word": self.axis.word, "key": self.axis.key} if self.axis else None


class Prepared(dict):
    """A prepared config: the user's keys with their defaults (a plain
    mapping: JSON writes it as it did), and ``derived`` beside them. Copies
    (``copy.deepcopy``, ``with_derived``) keep ``derived``; ``dict(...)``
    doesn't."""

    derived: Derived

    def __init__(self, config: Mapping, derived: Derived):
        super().__init__(config)
        self.derived = derived


def derived(config: Mapping) -> Derived:
    """The derived values of a prepared config (none for a plain dict: no
    axis, no points)."""
    return getattr(config, "derived", None) or _NOTHING_DERIVED


_NOTHING_DERIVED = Derived()


def with_derived(config: Mapping, like: Mapping) -> Prepared:
    """``config`` carrying the derived values of ``like``."""
    return Prepared(config, derived(like))


# libyaml's loader where PyYAML has it (its wheels do): 5-10× faster than the
# pure-Python one, and every Snakemake process of a run (one or two per cluster
# job) loads the schema, the pools and the config.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: str) -> dict:
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_LOADER)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def pipeline_dir(workflow_dir: str) -> str:
    """A pipeline's top directory: above ``workflow/`` (the usual layout), or
    the Snakefile's own directory."""
    base = os.path.abspath(str(workflow_dir))
    return os.path.dirname(base) if os.path.basename(base) == "workflow" else base


@lru_cache(maxsize=1)
def engine_schema() -> dict:
    return load_yaml(ENGINE_SCHEMA)


def workflow_schema_path(workflow_dir: str) -> str:
    return os.path.join(workflow_dir, SCHEMA_FILE)


def _extension_schema(workflow_dir: str | None) -> tuple[str, dict]:
    """The workflow's schema where it extends waypost's (it declares one of
    waypost's keys: ``experiments`` or ``stages`` to add to, or another to be refused):
    (its path, it), else (its path, {}): a schema of the pipeline's own
    config, which the pipeline validates itself (``snakemake.utils.validate``)
    and waypost leaves alone."""
    path = workflow_schema_path(workflow_dir) if workflow_dir else ""
    own = load_yaml(path) if path and os.path.exists(path) else {}
    declared = own.get("properties")
    if not (isinstance(declared, dict) and set(engine_schema()["properties"]) & set(declared)):
        return path, {}
    return path, own


@lru_cache(maxsize=8)
def schema_for(workflow_dir: str | None, axis: Axis | None, in_section: bool = False) -> dict:
    """waypost's schema with the workflow's merged in (see the module's
    docstring): the workflow's stages get the engine's stage keys and their
    own, strictly; a stage the workflow's schema does not declare takes the
    engine's keys only, or anything when the workflow declares no stage
    settings at all (no schema, or none under ``stages``). ``in_section``:
    waypost's keys are under ``waypost:``, and the engine's schema alone is
    theirs. The top level is open where no schema extends waypost's (the
    pipeline's own keys are beside them), or where it says so
    (``additionalProperties: true``)."""
    schema = copy.deepcopy(engine_schema())
    defs = schema["$defs"]
    path, own = _extension_schema(None if in_section else workflow_dir)
    for name, sub in (own.get("$defs") or {}).items():
        if name in defs:
            raise ConfigError(f"{path}: $defs.{name}: the name is waypost's own (in its schema); "
                              "rename it in the workflow's schema")
        defs[name] = sub
    root = {**own, "$defs": defs}
    if not in_section and (not own or own.get("additionalProperties") is True):
        schema["additionalProperties"] = True   # the pipeline's own keys, unknown to waypost (see _misspelt_keys)
    stage_base = defs["stage"]
    declared = {}
    for key, sub in (own.get("properties") or {}).items():
        if key == "stages":
            declared = _mapping(_resolve(sub, root).get("properties"), path, "properties.stages.properties")
        elif key == "experiments":
            each = _resolve(_mapping(_resolve(sub, root).get("additionalProperties"), path,
                                     "properties.experiments.additionalProperties"), root)
            experiment = defs["experiment"]
            for name, prop in _mapping(each.get("properties"), path,
                                       "properties.experiments.additionalProperties.properties").items():
                if name in experiment["properties"] or (axis and name in (axis.key, axis.per)):
                    raise ConfigError(f"{path}: experiments.{name}: the key is waypost's own; "
                                      "the workflow's schema can't declare it")
                experiment["properties"][name] = prop
            experiment.setdefault("required", []).extend(each.get("required", []))
        elif key in schema["properties"]:
            raise ConfigError(f"{path}: properties.{key}: the key is waypost's own (see waypost's "
                              "schema); the workflow's schema declares only what the workflow adds")
        else:
            schema["properties"][key] = sub
    schema["required"] = sorted(set(schema["required"]) | set(own.get("required", [])))
    for name, sub in declared.items():
        sub = _resolve(sub, root)
        properties = {**stage_base["properties"], **_mapping(sub.get("properties"), path,
                                                            f"properties.stages.properties.{name}.properties")}
        defs["stages"].setdefault("properties", {})[name] = {
            "type": "object", "additionalProperties": False, "properties": properties,
            "default": sub.get("default", {}), **({"required": sub["required"]} if "required" in sub else {})}
    stage_base["additionalProperties"] = not declared
    if axis:
        defs["experiment"]["properties"][axis.key] = {
            "type": "array", "minItems": 1, "uniqueItems": True, "items": {"$ref": "#/$defs/name"},
            "description": f"this experiment's {axis.key}"}
        defs["experiment"]["properties"][axis.per] = {
            "type": "object", "propertyNames": {"$ref": "#/$defs/name"},
            "additionalProperties": {"$ref": "#/$defs/stages"},
            "description": f"stage settings for one {axis.word} of this experiment (over its own)"}
        defs["experiment"].setdefault("required", []).append(axis.key)
    return schema


def _mapping(value, path: str, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {type(value).__name__}")
    return value


def _key_path(parts) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _describe(error: jsonschema.ValidationError) -> tuple[str, str]:
    """(key path, what is wrong and what was expected) for one schema error."""
    path = list(error.absolute_path)
    expected = error.schema.get("description") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        key = extra[0] if extra else "?"
        hint = f"expected one of: {', '.join(allowed)}" if allowed else "no keys are allowed here"
        return _key_path(path + [key]), f"unknown key {key!r} ({hint})"
    if error.validator == "required":
        return _key_path(path), f"{error.message.split(' is a required')[0]} is required but missing"
    if error.validator == "pattern" and error.schema.get("description") and "name" not in str(error.schema):
        return _key_path(path), f"{error.instance!r} is not {error.schema['description']}"
    if error.validator in ("pattern", "not") or (error.validator == "$ref" and "name" in str(error.schema)):
        return _key_path(path), f"{error.instance!r} is not a valid name (expected {NAME_RULE})"
    if error.validator == "type":
        want = error.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        detail = f" ({expected})" if expected else ""
        return _key_path(path), f"expected {want}{detail}, got {error.instance!r}"
    if error.validator == "enum":
        choices = ", ".join(map(str, error.validator_value))
        return _key_path(path), f"{error.instance!r} is not one of: {choices}"
    message = error.message
    if expected:
        message += f" (expected {expected})"
    return _key_path(path), message


def _name_errors(error: jsonschema.ValidationError):
    # propertyNames failures point at the parent; say which name is wrong.
    if error.validator == "propertyNames":
        for sub in error.context or []:
            what = error.schema["propertyNames"].get("description")
            yield _key_path(list(error.absolute_path) + [sub.instance]), \
                f"{sub.instance!r} is not {what}" if what else f"{sub.instance!r} is not a valid name (expected {NAME_RULE})"
        return
    yield _describe(error)


def _passed_mark(config: dict, schema: dict) -> str:
    """Where a pass of this config against this schema is remembered: a file
    named by the hash of both (their repr tells 1 from '1' and a date from its
    text), in the user's cache directory."""
    digest = hashlib.sha256(repr((schema, config)).encode()).hexdigest()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "waypost", "valid-configs", digest)


def validate(config: dict, schema: dict, source: str) -> None:
    """Raise ConfigError listing what is wrong with ``config`` (from
    ``source``). A config that passed is remembered, so the next command over
    the same files skips importing jsonschema (~75 ms) and validating; a
    failure is never remembered, and a cache that can't be written is none."""
    for key, near in _misspelt_keys(config, schema):
        print(f"waypost: {source}: {key}: taken as the pipeline's own key, not waypost's {near!r} (if you meant "
              f"{near!r}, rename it; waypost's keys under `{SECTION}:` never meet the pipeline's)", file=sys.stderr)
    mark = _passed_mark(config, schema)
    if os.path.exists(mark):
        return
    import jsonschema  # here, as it is slow to import; and cluster jobs don't validate (see prepare)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = list(dict.fromkeys(f"{source}: {key}: {what}" for e in errors for key, what in _name_errors(e)))
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines[:10]))
    with contextlib.suppress(OSError):   # read-only, or another process just wrote it
        os.makedirs(os.path.dirname(mark), exist_ok=True)
        open(mark, "x").close()


def _misspelt_keys(config: dict, schema: dict):
    """(key, waypost's key it looks like) for the top-level keys waypost
    doesn't know that look like one it does (``experiment`` for
    ``experiments``), where the pipeline's own keys are allowed
    (``schema_for``). Said, not refused: it may well be the pipeline's own
    key, and a typo must not silently drop a setting either."""
    if schema.get("additionalProperties") is not True:
        return
    known = sorted(schema["properties"])
    for key in config:
        if isinstance(key, str) and key not in schema["properties"]:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
            if near:
                yield key, near[0]


def _resolve(schema: dict, root: dict) -> dict:
    while isinstance(schema, dict) and "$ref" in schema:
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _fill_defaults(value: dict, schema: dict, root: dict, descend: bool) -> None:
    schema = _resolve(schema, root)
    for key, sub in schema.get("properties", {}).items():
        sub = _resolve(sub, root)
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if descend and isinstance(value.get(key), dict):
            _fill_defaults(value[key], sub, root, descend)


def apply_defaults(config: dict, schema: dict, stages: list[str] | None = None) -> dict:
    """Schema defaults for the top level, the global settings of each stage
    (``stages``: the workflow's, in its order; else those the config names)
    and each experiment's own keys (not its overrides: those only hold what
    was set)."""
    config = copy.deepcopy(config)
    _fill_defaults(config, schema, schema, descend=False)
    given = config.setdefault("stages", {})
    declared = schema["$defs"]["stages"].get("properties", {})
    config["stages"] = {}
    # (a stage the workflow doesn't have stays, for check_semantics to name)
    for name in dict.fromkeys([*(stages if stages is not None else declared), *given]):
        settings = given.get(name, {})
        if name in declared:
            sub = _resolve(declared[name], schema)
            settings = {**copy.deepcopy(sub.get("default", {})), **settings}
            _fill_defaults(settings, sub, schema, descend=True)
        config["stages"][name] = settings
    for experiment in (config.get("experiments") or {}).values():
        if isinstance(experiment, dict):
            _fill_defaults(experiment, schema["$defs"]["experiment"], schema, descend=False)
    return config


def _to_engine_axis(config: dict, axis: Axis | None) -> None:
    """The axis values under ``pairs``, the overrides under ``per_pair``
    (the engine's names), whatever the workflow calls them."""
    for experiment in config["experiments"].values():
        values = experiment.pop(axis.key) if axis else []
        overrides = experiment.pop(axis.per, {}) if axis else {}
        experiment["pairs"], experiment["per_pair"] = values, overrides


def axis_words(config: Mapping) -> tuple[str, str]:
    """(one, many) of a prepared config's axis, for messages and headings."""
    axis = derived(config).axis
    return (axis.word, axis.key) if axis else ("axis value", "axis values")


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
        if known_instances is not None and not any(_matches(pattern, i) for i in known_instances):
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


# --- grids and instances ---------------------------------------------------

#: An instance name, or a shell pattern of one (``per_instance`` keys, ``--instance``).
INSTANCE_PATTERN = re.compile(r"[A-Za-z0-9._*?\[\]!-]+")


def is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def _matches(key: str, instance: str) -> bool:
    return key == instance or (is_pattern(key) and fnmatchcase(instance, key))


def _some(names, what: str, shown: int = 6) -> str:
    names = list(names)
    if not names:
        return f"{what}: none"
    more = f", … ({len(names)} in all)" if len(names) > shown else ""
    return f"{what}: {', '.join(names[:shown])}{more}"




#: What an experiment's points are made from (``waypost.model.paramsets``), for messages.
SETS_HINT = "grid: {PARAMETER: [VALUES], ...}, zip:, table: or sample:"


def source_file(source: str) -> str:
    """The config file of a source (``with_reuse_files``: it is named first)."""
    return source.split(" + ")[0]


def config_dir(source: str) -> str | None:
    """The directory of a source's config file (None: no file was read)."""
    path = source_file(source)
    return None if path == NO_CONFIG_FILE else os.path.dirname(os.path.abspath(path))


def expand_grids(config: dict, source: str) -> dict[str, dict[str, dict]]:
    """Each experiment's parameter set (``grid``, ``zip``, ``table``,
    ``sample``) as its points (``Derived.points``): see ``waypost.model.paramsets``."""
    base = os.path.dirname(source_file(source))
    found = {}
    for name, experiment in config["experiments"].items():
        points_of = paramsets.points_of(experiment, f"{source}: experiments.{name}", base)
        if points_of is not None:
            found[name] = points_of
    return found


def points(config: Mapping, experiment: str) -> Mapping[str, dict]:
    """An experiment's grid points: instance name → values (empty without a grid)."""
    return derived(config).points_of(experiment)


def grid_point(config: Mapping, experiment: str, instance: str | None) -> dict | None:
    """The grid values of an instance that is a point of the experiment's grid."""
    found = derived(config).points.get(experiment)
    return found.get(instance) if found and instance is not None else None


def override_keys(config: dict, experiment: str, instance: str | None) -> tuple[str, ...]:
    """The experiment's ``per_instance`` keys that match an instance (its
    name, or a pattern), in the order written: the later wins."""
    overrides = config["experiments"][experiment].get("per_instance") if instance is not None else None
    if not overrides:
        return ()
    return tuple(key for key in overrides if _matches(key, instance))


def per_point_keys(config: dict, stage: str) -> set[str]:
    """The settings of ``stage`` that may differ from instance to instance:
    grid axes, and what a ``per_instance`` override sets for it."""
    keys = set()
    for name, experiment in config["experiments"].items():
        keys |= set(derived(config).parameters(name))
        for settings in (experiment.get("per_instance") or {}).values():
            keys |= set((settings or {}).get(stage) or {})
    return keys


def match_instances(patterns: list[str] | None, names):
    """The names matching any of ``patterns`` (each a name or a shell
    pattern); all of them when there are none."""
    if not patterns:
        return list(names)
    return [name for name in names if any(_matches(p, name) for p in patterns)]


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


def prepare(config: dict, workflow_dir: str, source: str, check: bool = True, axis: Axis | None = None,
            stages: list[str] | None = None, instanced: list[str] | None = None,
            in_section: bool = False) -> Prepared:
    """Validate a loaded config and fill in its defaults, with the axis moved
    to the engine's names. ``stages``: the workflow's stages, when known
    (the Snakefile knows them once its rules are read: see
    ``Pipeline.finish``, which calls ``complete``), and those of them with
    instances (``instanced``). ``check=False`` skips the
    schema validation: for a cluster job's own Snakemake process, whose main
    process validated the same files when it submitted the job.
    ``in_section``: the keys are those under ``waypost:`` (``waypost_config``)."""
    schema = schema_for(os.path.abspath(workflow_dir), axis, in_section)
    if check:
        validate(config, schema, f"{source}: {SECTION}" if in_section else source)
    config = apply_defaults(config, schema, stages)
    if config.get("mounts"):   # for this process; its jobs get them in their step spec (stores.mounted)
        locations.declare_mounts(config["mounts"])
    _to_engine_axis(config, axis)
    config = Prepared(config, Derived(axis, expand_grids(config, source), in_section, source))
    if stages is not None:
        check_semantics(config, source, axis, stages, instanced, declared=declared_stages(schema))
    return config


def complete(config: dict, workflow_dir: str, source: str, axis: Axis | None, stages: list[str],
             instanced: list[str] | None = None, instances: dict | None = None) -> Prepared:
    """A prepared config (``prepare`` without ``stages``) once the workflow's
    stages are known: each has its settings with their defaults, in the
    workflow's order, and every stage name the config uses is checked;
    ``instances``: experiment → the instance names of its stages, which
    the ``per_instance`` overrides must match."""
    schema = schema_for(os.path.abspath(workflow_dir), axis, derived(config).in_section)
    filled = apply_defaults({"stages": config.get("stages", {})}, {**schema, "properties": {}}, stages)
    config = with_derived({**config, "stages": filled["stages"]}, config)
    check_semantics(config, source, axis, stages, instanced, instances, declared_stages(schema))
    return config


def declared_stages(schema: dict) -> frozenset:
    """The stages whose settings the workflow's schema declares."""
    return frozenset(schema["$defs"]["stages"].get("properties") or {})


def waypost_config(config: Mapping, overrides: Mapping, configfile: str | None) -> tuple[dict, str, bool]:
    """waypost's keys of a pipeline's ``config`` as Snakemake loaded it (see
    the module's docstring), with the ``reuse/`` files beside ``configfile``
    (the config file read last; None: none was) merged over them and the
    ``--config`` ``overrides`` over those: (the keys, the source for
    messages, whether they are at the config's top level). The pipeline's
    ``config`` itself is not changed."""
    section = config.get(SECTION)
    top_level = section is None and "experiments" in config
    where = configfile or NO_CONFIG_FILE
    if section is not None and not isinstance(section, dict):
        raise ConfigError(f"{where}: {SECTION}: expected a mapping of waypost's keys (root, experiments, ...), "
                          f"got {type(section).__name__}")
    keys = copy.deepcopy(dict(config) if top_level else section or {})
    if not top_level:
        keys.setdefault("root", SECTION_ROOT)
        keys.setdefault("experiments", {DEFAULT_EXPERIMENT: {}})
    keys, source = with_reuse_files(keys, configfile) if configfile else (keys, where)
    given = overrides if top_level else overrides.get(SECTION)
    keys = merge(keys, given if isinstance(given, dict) else {})
    if not top_level and "select" in overrides:   # (``waypost run``'s ``--config select=...``)
        keys["select"] = overrides["select"]
    return keys, source, top_level


def snakemake_config(configfiles: list[str], given_files: list[str], overrides: Mapping) -> dict:
    """The ``config`` Snakemake gives a Snakefile: the files its
    ``configfile:`` names (``configfiles``), in order, under those given
    with ``--configfile`` (``given_files``) and the ``--config`` entries
    (``overrides``), each merged over the one before."""
    loaded: dict = {}
    for path in configfiles:
        loaded = merge(loaded, load_yaml(path))
    given: dict = {}
    for path in given_files:
        given = merge(given, load_yaml(path))
    return merge(loaded, merge(given, dict(overrides)))


def load(path: str, workflow_dir: str, axis: Axis | None = None, stages: list[str] | None = None,
         instanced: list[str] | None = None) -> Prepared:
    config, source = with_reuse_files(load_yaml(path), path)
    return prepare(config, workflow_dir, source, axis=axis, stages=stages, instanced=instanced)


# `waypost reuse` writes its pointers here, next to the config file; they are
# merged over the config (one file per experiment, so they are easy to drop).
REUSE_DIR = "reuse"


def reuse_dir(config_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(config_path)), REUSE_DIR)


def with_reuse_files(config: dict, config_path: str) -> tuple[dict, str]:
    """The config with ``reuse/*.yaml`` beside it merged over it, and a
    source naming every file read (for error messages)."""
    directory = reuse_dir(config_path)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith((".yaml", ".yml")))
    except FileNotFoundError:
        return config, config_path
    for name in names:
        config = merge(config, load_yaml(os.path.join(directory, name)))
    return config, " + ".join([config_path] + [os.path.join(REUSE_DIR, n) for n in names])


def merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def reuse_source(config: dict, experiment: str, pair: str, stage: str) -> str | None:
    """Where an experiment takes a stage from (see the ``reuse`` key), or None."""
    where = config["experiments"][experiment].get("reuse", {}).get(stage)
    if isinstance(where, dict):
        return where.get(pair)
    return where


def source_of_instance(source: str, instance: str | None) -> str:
    """Where one instance of a stage is taken from: ``{instance}`` in the
    source filled in (``.../train_teacher/{instance}/.attempts/2``: an
    archived run of each instance), else the instance's directory below it."""
    if "{instance}" in source:
        return source.replace("{instance}", instance or "")
    return layout_join(source, instance) if instance else source


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


def stage_settings(config: dict, experiment: str, pair: str, stage: str, instance: str | None = None,
                   matched: tuple[str, ...] | None = None) -> dict:
    """Global stage settings ← the experiment's ← the pair's ← the
    ``per_instance`` overrides that match the instance, in the order written
    ← the instance's grid values, when it is a point of the grid (last
    wins). ``matched``: the overrides to apply (``override_keys``), without
    the grid values (which are added per point: see Pipeline).

    ``policy`` is always there: the global ``policy`` with the stage's own
    merged over it.
    """
    exp = config["experiments"][experiment]
    settings = merge({"policy": config.get("policy", {})}, config["stages"].get(stage, {}))
    settings = merge(settings, exp.get("stages", {}).get(stage, {}))
    settings = merge(settings, exp.get("per_pair", {}).get(pair, {}).get(stage, {}))
    for key in (override_keys(config, experiment, instance) if matched is None else matched):
        settings = merge(settings, (exp["per_instance"][key] or {}).get(stage) or {})
    point = grid_point(config, experiment, instance) if matched is None else None
    if point:
        settings.update(point)
    return settings



def step_settings(config: dict, experiment: str, pair: str, stage: str, instance: str | None = None) -> dict:
    """What a stage's step is given (and its manifest records): its settings
    (of one instance) without the engine's keys."""
    return {k: v for k, v in stage_settings(config, experiment, pair, stage, instance).items()
            if k not in ENGINE_KEYS}


def step_settings_of(config: dict):
    """``step_settings`` for one config, made once per experiment, pair,
    stage and set of matching overrides (a grid point's values on top): for
    commands that compare many manifests with the config. Its answers are
    shared: not to be changed."""
    cache: dict[tuple, dict] = {}

    def of(experiment: str, pair: str, stage: str, instance: str | None = None) -> dict:
        matched = override_keys(config, experiment, instance)
        key = (experiment, pair, stage, matched)
        if key not in cache:
            cache[key] = {k: v for k, v in stage_settings(config, experiment, pair, stage, matched=matched).items()
                          if k not in ENGINE_KEYS}
        point = grid_point(config, experiment, instance)
        return {**cache[key], **point} if point else cache[key]
    return of


#: A stage's code version (``waypost.model.codeversion``) is this prefix and
#: 12 hex digits; manifests of waypost before it hold the repository's
#: ``git describe`` (another format: not comparable, see ``plan.drift``).
CODE_PREFIX = "sha256:"


def is_stage_code_version(value: str | None) -> bool:
    return bool(value) and value.startswith(CODE_PREFIX)


def code_digest(command: str, files: list[tuple[str, bytes]]) -> str:
    """A step's code version: its command as the rule writes it (paths of the
    files it runs made relative, the interpreter named ``python``), those
    files' contents ((name, sha256 digest) each) and waypost's version."""
    from waypost import __version__
    digest = hashlib.sha256(f"waypost {__version__}\0{command}\0".encode())
    for name, content in files:
        digest.update(name.encode() + b"\0" + content + b"\0")
    return CODE_PREFIX + digest.hexdigest()[:12]


_SETTINGS_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode   # one encoder for all


def settings_json(settings: dict) -> str:
    """Settings as ``settings_hash`` hashes them (compact JSON, keys sorted:
    as the step spec carries them too)."""
    return _SETTINGS_JSON(settings)


def settings_hash(settings: dict, blob: str | None = None) -> str:
    """A short hash of settings (``blob``: their ``settings_json``, when made already)."""
    return hashlib.sha256((settings_json(settings) if blob is None else blob).encode()).hexdigest()[:16]
