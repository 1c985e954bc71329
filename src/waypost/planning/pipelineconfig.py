"""The config a Snakefile's ``Pipeline`` reads: waypost's keys of the config
Snakemake loaded (its ``configfile:``, ``--configfile``, the profiles' and
the command line's ``--config``), or of the default config file where
Snakemake loaded none; validated, with their defaults; and, where the
config has waypost's keys at its top level, the Snakefile's own ``config``
with those defaults too (``wconfig.waypost_config`` says where the keys
are)."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass

from waypost.model import config as wconfig


@dataclass
class PipelineConfig:
    prepared: wconfig.Prepared   # waypost's keys, validated, with their defaults
    configfile: str              # the file they came from (``wconfig.NO_CONFIG_FILE``: none)
    source: str                  # the same, as errors name it
    default_configfile: str
    files: dict                  # the config files read and given, and the overrides (graph.facts)
    # Rules in their own layout follow presence mode only where the config
    # says so: else plain Snakemake's answer (waypost.planning.ownpresence).
    own_presence: bool
    # A config with waypost's keys at its top level is read by its
    # Snakefile with their defaults (the reference's); any other is the
    # pipeline's own, as plain Snakemake gives it.
    fills_config: bool
    declared: bool               # has it waypost's keys at all?

    def undeclared_experiments(self) -> str:
        """Why a workflow with stages (``wp.out``) can't run on a config
        that says nothing for waypost: its stage directories are named by
        experiments the config declares (only rules in their own layout
        have a default one)."""
        if self.configfile == wconfig.NO_CONFIG_FILE:
            return (f"{self.default_configfile}: config file not found (a workflow with waypost stages, wp.out, "
                    "reads its experiments from its config: give it one, or --configfile FILE)")
        return (f"invalid config:\n  {self.source}: (top level): 'experiments' is required but missing (a workflow "
                f"with waypost stages, wp.out, names its experiments: at the top level, or under `{wconfig.SECTION}:`)")


def read_config(config: dict, snake, default_configfile: str, check: bool, facts_only: bool,
                axis) -> PipelineConfig:
    """waypost's keys of the config Snakemake loaded (``config``), or of
    ``default_configfile`` where Snakemake loaded none and it is there: the
    config file, then the reuse/ files beside it, then ``--config
    KEY=VALUE``. ``ConfigError`` (its file, key and what is wrong) before
    anything changes; then the Snakefile's ``config`` is filled where it
    has waypost's keys at its top level."""
    read, given, overrides = snake.config_sources()
    configfile = (given or read or [None])[-1]
    loaded, read_here = dict(config), configfile is None and os.path.exists(default_configfile)
    if read_here:   # (the reference's layout: no configfile: directive)
        configfile, read = default_configfile, [default_configfile]
        loaded = wconfig.merge(wconfig.load_yaml(configfile), overrides)
    keys, source, top_level = wconfig.waypost_config(loaded, overrides, configfile)
    prepared = _prepared(keys, source, snake.basedir, check, not top_level, facts_only, axis)
    files = {"configfiles": [os.path.abspath(p) for p in read],
             "given_configfiles": [os.path.abspath(p) for p in given],
             "config_overrides": json.loads(json.dumps(overrides, default=str))}   # (a YAML date as text)
    if top_level:
        config.clear()
        config.update(prepared)   # the Snakefile's ``config``: its keys (the derived values are beside them)
    elif read_here:
        config.update(loaded)   # (the file Snakemake would have read with --configfile)
    return PipelineConfig(prepared, wconfig.source_file(source), source, default_configfile, files,
                          own_presence=keys.get("rerun_policy") == "presence", fills_config=top_level,
                          declared=top_level or wconfig.SECTION in loaded)


def _prepared(keys: dict, source: str, basedir: str, check: bool, in_section: bool, facts_only: bool,
              axis) -> wconfig.Prepared:
    """waypost's keys of the config, validated and with their defaults.
    For the facts pass (only the rules are asked for) it is the real one,
    unchecked: a Snakefile may read its config while it is loaded, and
    whoever loads the config next checks it and says what is wrong with
    it; one too broken to prepare at all gives its place to none, and
    the rules are still read."""
    if not facts_only:
        return wconfig.prepare(keys, basedir, source, check=check, axis=axis, in_section=in_section)
    try:
        return wconfig.prepare(copy.deepcopy(keys), basedir, source, check=False, axis=axis, in_section=in_section)
    except (wconfig.ConfigError, AttributeError, KeyError, TypeError, ValueError):
        return wconfig.prepare({"experiments": {}}, basedir, source, check=False, axis=axis)
