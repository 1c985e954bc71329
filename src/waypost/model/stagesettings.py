"""A stage's settings in a prepared config: the global ones under an
experiment's, a pair's, the matching ``per_instance`` overrides' and a
grid point's values; the instances an override or a pattern matches;
where an experiment reuses a stage from; and the hash of settings."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from fnmatch import fnmatchcase

from waypost.model.configfiles import merge
from waypost.model.layout import join as layout_join
from waypost.model.paramsets import ENGINE_KEYS
from waypost.model.prepared import derived

#: An instance name, or a shell pattern of one (``per_instance`` keys, ``--instance``).
INSTANCE_PATTERN = re.compile(r"[A-Za-z0-9._*?\[\]!-]+")


def is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def instance_matches(key: str, instance: str) -> bool:
    return key == instance or (is_pattern(key) and fnmatchcase(instance, key))


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
    return tuple(key for key in overrides if instance_matches(key, instance))


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
    return [name for name in names if any(instance_matches(p, name) for p in patterns)]


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


_SETTINGS_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode   # one encoder for all


def settings_json(settings: dict) -> str:
    """Settings as ``settings_hash`` hashes them (compact JSON, keys sorted:
    as the step spec carries them too)."""
    return _SETTINGS_JSON(settings)


def settings_hash(settings: dict, blob: str | None = None) -> str:
    """A short hash of settings (``blob``: their ``settings_json``, when made already)."""
    return hashlib.sha256((settings_json(settings) if blob is None else blob).encode()).hexdigest()[:16]
