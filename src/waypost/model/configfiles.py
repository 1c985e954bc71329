"""Reading a pipeline's config files: YAML loading, merging, where
waypost's keys sit in a pipeline's config (``waypost_config``: see
``waypost.model.config``), the ``reuse/`` files merged over a config, and
the sources named in messages."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping

import yaml

from waypost.model.errors import ConfigError

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


def source_file(source: str) -> str:
    """The config file of a source (``with_reuse_files``: it is named first)."""
    return source.split(" + ")[0]


def config_dir(source: str) -> str | None:
    """The directory of a source's config file (None: no file was read)."""
    path = source_file(source)
    return None if path == NO_CONFIG_FILE else os.path.dirname(os.path.abspath(path))


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
