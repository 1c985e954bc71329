"""The config's schema: waypost's own merged with a workflow's
(``schema_for``, see ``waypost.model.config``), validation with messages
naming the file, the key and what was expected, and the schema's defaults."""

from __future__ import annotations

import contextlib
import copy
import difflib
import hashlib
import os
import sys
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jsonschema

from waypost.model.configfiles import SECTION, load_yaml
from waypost.model.errors import ConfigError
from waypost.model.layout import NAME_RULE
from waypost.model.prepared import Axis

SCHEMA_FILE = os.path.join("schemas", "config.schema.yaml")   # below the workflow's directory


ENGINE_SCHEMA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas", "config.schema.yaml")


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


def declared_stages(schema: dict) -> frozenset:
    """The stages whose settings the workflow's schema declares."""
    return frozenset(schema["$defs"]["stages"].get("properties") or {})
