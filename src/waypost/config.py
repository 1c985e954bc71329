"""Loading, defaults, validation and merging of the pipeline config.

Errors name the file, the key and what was expected, and are raised before
anything runs. waypost's own keys have their schema in the package
(``schemas/config.schema.yaml``); a workflow's schema
(``workflow/schemas/config.schema.yaml``, optional) declares only what the
workflow adds: its stages' settings, its own experiment keys. The two are
merged here (``schema_for``) into one plain JSON schema of the kind
``snakemake.utils.validate`` takes, validated with jsonschema so the messages
can be precise.

The experiment's axis (``pairs`` in the reference pipeline) is the
workflow's word: the Snakefile names it (``Pipeline(..., axis="pair")``).
Inside the engine its values are always under ``pairs`` and its overrides
under ``per_pair`` (``prepare`` moves them there), whatever the workflow
calls them.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    import jsonschema

from .layout import ALL_PAIRS, NAME_RULE
from .layout import join as layout_join

SCHEMA_FILE = os.path.join("schemas", "config.schema.yaml")   # below the workflow's directory
ENGINE_SCHEMA = os.path.join(os.path.dirname(__file__), "schemas", "config.schema.yaml")


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


class ConfigError(ValueError):
    """The config cannot be used; the message says where and why."""


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


@lru_cache(maxsize=8)
def schema_for(workflow_dir: str, axis: Axis | None) -> dict:
    """waypost's schema with the workflow's merged in (see the module's
    docstring): the workflow's stages get the engine's stage keys and their
    own, strictly; a stage the workflow's schema does not declare takes the
    engine's keys only, or anything when the workflow declares no stage
    settings at all (no schema, or none under ``stages``)."""
    schema = copy.deepcopy(engine_schema())
    defs = schema["$defs"]
    path = workflow_schema_path(workflow_dir)
    own = load_yaml(path) if os.path.exists(path) else {}
    for name, sub in (own.get("$defs") or {}).items():
        if name in defs:
            raise ConfigError(f"{path}: $defs.{name}: the name is waypost's own (in its schema); "
                              "rename it in the workflow's schema")
        defs[name] = sub
    root = {**own, "$defs": defs}
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
            yield _key_path(list(error.absolute_path) + [sub.instance]), \
                f"{sub.instance!r} is not a valid name (expected {NAME_RULE})"
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
    config[AXIS_KEY] = {"word": axis.word, "key": axis.key} if axis else None


#: Where a prepared config keeps the workflow's words for its axis (None: it has none).
AXIS_KEY = "_axis"


def axis_words(config: dict) -> tuple[str, str]:
    """(one, many) of a prepared config's axis, for messages and headings."""
    axis = config.get(AXIS_KEY)
    return (axis["word"], axis["key"]) if axis else ("axis value", "axis values")


def check_semantics(config: dict, source: str, axis: Axis | None = None, stages: list[str] | None = None) -> None:
    """What the schema can't say: names that must be the workflow's stages
    (``stages``, when known) or an experiment's axis values, and policies
    that parse. ``config`` is in the engine's axis names (see ``prepare``)."""
    from .policy import Policy, PolicyError

    word, key, per = (axis.word, axis.key, axis.per) if axis else ("axis value", "axis values", "per_" + "axis")
    problems = []
    known = stages if stages is not None else list(config["stages"])

    def unknown_stage(where: str, stage: str) -> None:
        if stage not in known:
            problems.append(f"{source}: {where}: unknown stage {stage!r} "
                            f"(expected one of the workflow's stages: {', '.join(known)})")
    if stages is not None:
        for stage in config.get("stages", {}):
            unknown_stage(f"stages.{stage}", stage)
    checked: dict[str, str | None] = {}
    for name, experiment in config["experiments"].items():
        pairs = experiment["pairs"]
        per_pair = experiment.get("per_pair", {})
        for stage in experiment.get("stages", {}):
            unknown_stage(f"experiments.{name}.stages.{stage}", stage)
        for pair, settings in per_pair.items():
            if pair not in pairs:
                problems.append(f"{source}: experiments.{name}.{per}.{pair}: unknown {word} {pair!r} "
                                f"(expected one of this experiment's {key}: {', '.join(pairs)})")
            for stage in settings:
                unknown_stage(f"experiments.{name}.{per}.{pair}.{stage}", stage)
        for stage, where in experiment.get("reuse", {}).items():
            unknown_stage(f"experiments.{name}.reuse.{stage}", stage)
            for pair, origin in (where.items() if isinstance(where, dict) else [(None, where)]):
                if pair is not None and pair not in pairs:
                    problems.append(f"{source}: experiments.{name}.reuse.{stage}.{pair}: unknown {word} {pair!r} "
                                    f"(expected one of this experiment's {key}: {', '.join(pairs) or 'none'})")
                if origin == name:
                    problems.append(f"{source}: experiments.{name}.reuse.{stage}: an experiment can't reuse its own stage")
        # Axis values without overrides share their settings: check the first.
        first_shared = next((pair for pair in pairs if pair not in per_pair), ALL_PAIRS)
        for pair in [first_shared, *per_pair]:
            for stage in known:
                policy = stage_settings(config, name, pair, stage)["policy"]
                text = json.dumps(policy, sort_keys=True)
                if text not in checked:
                    try:
                        Policy.from_config(policy)
                        checked[text] = None
                    except PolicyError as exc:
                        checked[text] = str(exc)
                        where = f"experiment {name}" + (f", {word} {pair}" if pair != ALL_PAIRS else "")
                        problems.append(f"{source}: policy of stage {stage} ({where}): {exc}")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def prepare(config: dict, workflow_dir: str, source: str, check: bool = True, axis: Axis | None = None,
            stages: list[str] | None = None) -> dict:
    """Validate a loaded config and fill in its defaults, with the axis moved
    to the engine's names. ``stages``: the workflow's stages, when known
    (the Snakefile knows them once its rules are read: see
    ``Pipeline.finish``, which calls ``complete``). ``check=False`` skips the
    schema validation: for a cluster job's own Snakemake process, whose main
    process validated the same files when it submitted the job."""
    schema = schema_for(os.path.abspath(workflow_dir), axis)
    if check:
        validate(config, schema, source)
    config = apply_defaults(config, schema, stages)
    _to_engine_axis(config, axis)
    if stages is not None:
        check_semantics(config, source, axis, stages)
    return config


def complete(config: dict, workflow_dir: str, source: str, axis: Axis | None, stages: list[str]) -> dict:
    """A prepared config (``prepare`` without ``stages``) once the workflow's
    stages are known: each has its settings with their defaults, in the
    workflow's order, and every stage name the config uses is checked."""
    schema = schema_for(os.path.abspath(workflow_dir), axis)
    filled = apply_defaults({"stages": config.get("stages", {})}, {**schema, "properties": {}}, stages)
    config = {**config, "stages": filled["stages"]}
    check_semantics(config, source, axis, stages)
    return config


def load(path: str, workflow_dir: str, axis: Axis | None = None, stages: list[str] | None = None) -> dict:
    config, source = with_reuse_files(load_yaml(path), path)
    return prepare(config, workflow_dir, source, axis=axis, stages=stages)


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


def stage_settings(config: dict, experiment: str, pair: str, stage: str) -> dict:
    """Global stage settings ← the experiment's ← the pair's (last wins).

    ``policy`` is always there: the global ``policy`` with the stage's own
    merged over it.
    """
    exp = config["experiments"][experiment]
    settings = merge({"policy": config.get("policy", {})}, config["stages"].get(stage, {}))
    settings = merge(settings, exp.get("stages", {}).get(stage, {}))
    settings = merge(settings, exp.get("per_pair", {}).get(pair, {}).get(stage, {}))
    return settings


# Settings that steer the engine, not the step: not passed to it, not hashed.
ENGINE_KEYS = ("policy", "worker", "resources", "retention")


def step_settings(config: dict, experiment: str, pair: str, stage: str) -> dict:
    """What a stage's step is given (and its manifest records): its settings
    without the engine's keys."""
    return {k: v for k, v in stage_settings(config, experiment, pair, stage).items() if k not in ENGINE_KEYS}


#: A stage's code version (``Pipeline.stage_code_version``) is this prefix and
#: 12 hex digits; manifests of waypost before it hold the repository's
#: ``git describe`` (another format: not comparable, see ``plan.drift``).
CODE_PREFIX = "sha256:"


def is_stage_code_version(value: str | None) -> bool:
    return bool(value) and value.startswith(CODE_PREFIX)


def code_digest(command: str, files: list[tuple[str, bytes]]) -> str:
    """A step's code version: its command as the rule writes it (paths of the
    files it runs made relative, the interpreter named ``python``), those
    files' contents ((name, sha256 digest) each) and waypost's version."""
    from . import __version__
    digest = hashlib.sha256(f"waypost {__version__}\0{command}\0".encode())
    for name, content in files:
        digest.update(name.encode() + b"\0" + content + b"\0")
    return CODE_PREFIX + digest.hexdigest()[:12]


def settings_hash(settings: dict) -> str:
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
