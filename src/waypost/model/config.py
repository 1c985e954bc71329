"""Loading, defaults, validation and merging of the pipeline config.

Errors name the file, the key and what was expected, and are raised before
anything runs. waypost's own keys have their schema in the package
(``schemas/config.schema.yaml``); a workflow's schema
(``workflow/schemas/config.schema.yaml``, optional) declares only what the
workflow adds: its stages' settings, its own experiment keys. The two are
merged (``configschema.schema_for``) into one plain JSON schema of the kind
``snakemake.utils.validate`` takes, validated with jsonschema so the messages
can be precise. A workflow without a schema keeps its own top-level keys
(an existing Snakefile's config, with waypost's keys added): a key that
looks like a misspelt waypost key is only said (``configschema``), as it
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

This module prepares a config (``prepare``, ``complete``, ``load``) and is
the one import its callers use; each part lives in its own module:
``configfiles`` (reading and merging the files), ``configschema`` (the
merged schema, validation, defaults), ``configcheck`` (what the schema
can't say, and the names a command was given), ``stagesettings`` (a
stage's settings, instances, reuse sources), ``prepared`` (the prepared
config's type) and ``codeversion`` (a step's code version).
"""

from __future__ import annotations

import os

from waypost.model import locations, paramsets
from waypost.model.codeversion import CODE_PREFIX, code_digest, is_stage_code_version
from waypost.model.configcheck import check_instance_names, check_names, check_semantics, typed_mismatch
from waypost.model.configfiles import (
    DEFAULT_EXPERIMENT,
    NO_CONFIG_FILE,
    REUSE_DIR,
    SECTION,
    SECTION_ROOT,
    config_dir,
    load_yaml,
    merge,
    pipeline_dir,
    reuse_dir,
    snakemake_config,
    source_file,
    waypost_config,
    with_reuse_files,
)
from waypost.model.configschema import (
    ENGINE_SCHEMA,
    SCHEMA_FILE,
    apply_defaults,
    declared_stages,
    engine_schema,
    schema_for,
    validate,
    workflow_schema_path,
)
from waypost.model.errors import ConfigError, WaypostError
from waypost.model.layout import ALL_PAIRS
from waypost.model.prepared import Axis, Derived, Prepared, axis_words, derived, with_derived
from waypost.model.stagesettings import (
    INSTANCE_PATTERN,
    grid_point,
    is_pattern,
    match_instances,
    override_keys,
    per_point_keys,
    points,
    reuse_source,
    settings_hash,
    settings_json,
    source_of_instance,
    stage_settings,
    step_settings,
    step_settings_of,
)

#: What callers reach as ``wconfig.NAME``: the config's parts, in their modules.
__all__ = [
    "ALL_PAIRS", "CODE_PREFIX", "DEFAULT_EXPERIMENT", "ENGINE_SCHEMA", "INSTANCE_PATTERN", "NO_CONFIG_FILE", "REUSE_DIR",
    "SCHEMA_FILE", "SECTION", "SECTION_ROOT", "SETS_HINT", "Axis", "ConfigError", "Derived", "Prepared",
    "WaypostError", "apply_defaults", "axis_words", "check_instance_names", "check_names", "check_semantics",
    "code_digest", "complete", "config_dir", "declared_stages", "derived", "engine_schema", "expand_grids",
    "grid_point", "is_pattern", "is_stage_code_version", "load", "load_yaml", "match_instances", "merge",
    "override_keys", "per_point_keys", "pipeline_dir", "points", "prepare", "reuse_dir", "reuse_source",
    "schema_for", "settings_hash", "settings_json", "snakemake_config", "source_file", "source_of_instance",
    "stage_settings", "step_settings", "step_settings_of", "typed_mismatch", "validate", "waypost_config",
    "with_derived", "with_reuse_files", "workflow_schema_path",
]

#: What an experiment's points are made from (``waypost.model.paramsets``), for messages.
SETS_HINT = "grid: {PARAMETER: [VALUES], ...}, zip:, table: or sample:"


def _to_engine_axis(config: dict, axis: Axis | None) -> None:
    """The axis values under ``pairs``, the overrides under ``per_pair``
    (the engine's names), whatever the workflow calls them."""
    for experiment in config["experiments"].values():
        values = experiment.pop(axis.key) if axis else []
        overrides = experiment.pop(axis.per, {}) if axis else {}
        experiment["pairs"], experiment["per_pair"] = values, overrides


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


def load(path: str, workflow_dir: str, axis: Axis | None = None, stages: list[str] | None = None,
         instanced: list[str] | None = None) -> Prepared:
    config, source = with_reuse_files(load_yaml(path), path)
    return prepare(config, workflow_dir, source, axis=axis, stages=stages, instanced=instanced)
