"""What the commands of ``waypost`` (see cli) share: the config and the
workflow's facts they read, a root reached first, and the Snakemake
arguments given after ``--``, with the profile's ``config:`` entries they
must carry."""

from __future__ import annotations

import json
import os

from waypost.model import config as wconfig
from waypost.model import graph


def workflow_facts(args) -> dict:
    """The workflow's stages, funnels, axis and config files (see graph),
    once per command: read as ``snakemake`` reads it here, with the
    command's ``--config`` file (a ``--configfile``), ``--profile`` and
    ``--workflow-profile``, if given."""
    if getattr(args, "_facts", None) is None:
        args._facts = graph.facts(args.config, args.workflow, snakemake_profile(args),
                                  getattr(args, "workflow_profile", None))
    return args._facts


def snakemake_profile(args) -> str | None:
    """The Snakemake profile a command runs the workflow with (``run``,
    ``plan``, ``cron``: ``--profile``), if any."""
    return getattr(args, "profile", None) if args.command in ("run", "plan", "cron") else None


def load_config(args) -> dict:
    return graph.load_config(args.workflow, workflow_facts(args))


def config_file(args) -> str | None:
    """The pipeline's config file: the one given, else the one the
    workflow's reading found (its ``configfile:``, or ``config/config.yaml``)."""
    if args.config:
        return args.config
    facts = workflow_facts(args)
    return ([*facts.get("configfiles", []), *facts.get("given_configfiles", [])] or [None])[-1]


def reach(root: str) -> None:
    """A gs:// root whose storage endpoint can't be reached: one line (a
    StorageError, exit 1) within seconds, instead of gcsfs's minute of
    retries."""
    from waypost import stores
    stores.reach(root)


# Snakemake options that take stage (rule) names, which waypost checks first.
STAGE_OPTIONS = ("--until", "--omit-from")


def stage_args(snakemake_args: list[str]) -> list[str]:
    """The stage names given to STAGE_OPTIONS among extra Snakemake arguments."""
    names, taking = [], False
    for arg in snakemake_args:
        option, eq, value = arg.partition("=")
        if arg.startswith("-"):
            taking = option in STAGE_OPTIONS
            if taking and eq:
                names.append(value)
        elif taking:
            names.append(arg)
    return names


def _config_entries(snakemake_args: list[str]) -> tuple[list[str], list[str]]:
    """(the values of ``--config``/``-C`` among extra Snakemake arguments,
    the other arguments)."""
    entries, rest, taking = [], [], False
    for arg in snakemake_args:
        if arg.startswith("-"):
            taking = arg in ("--config", "-C")
            if taking:
                continue
        if taking:
            entries.append(arg)
        else:
            rest.append(arg)
    return entries, rest


def with_profile_config(profile: str, extra: list[str], select: dict | None = None) -> list[str]:
    """Extra Snakemake arguments with their ``--config`` entries (and a
    ``select``) in one ``--config`` that also carries the profile's own
    ``config:`` entries (``pool=cloud``): a ``--config`` replaces the
    profile's list rather than adding to it."""
    given, rest = _config_entries(extra)
    if not (select or given):
        return extra
    try:
        entries = [f"{k}={v}" for k, v in profile_config(profile)[1].items()]
    except wconfig.ConfigError:
        entries = []   # a profile only Snakemake finds: its entries are its own business
    if select:
        entries.append("select=" + json.dumps(select, separators=(",", ":")))
    return ["--config", *entries, *given, *rest]


def extra_args(args) -> list[str]:
    return args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args


def profile_config(profile: str) -> tuple[str, dict[str, str]]:
    """A Snakemake profile's file and its ``config:`` entries (key → value).
    Snakemake takes that list whole: a later ``config:`` or ``--config``
    replaces it rather than adding to it, so whoever sets one must carry the
    profile's entries (``with_profile_config`` does, for run, plan and cron)."""
    candidates = [profile, os.path.join("profiles", profile), os.path.expanduser(f"~/.config/snakemake/{profile}"),
                  f"/etc/xdg/snakemake/{profile}"]
    for directory in candidates:
        path = os.path.join(directory, "config.yaml")
        if os.path.exists(path):
            entries = wconfig.load_yaml(path).get("config") or []
            if isinstance(entries, dict):
                return path, {str(k): str(v) for k, v in entries.items()}
            found = {}
            for entry in entries if isinstance(entries, list) else [entries]:
                key, _, value = str(entry).partition("=")
                found[key.strip()] = value.strip().strip("'\"")
            return path, found
    raise wconfig.ConfigError(f"profile {profile!r} not found (looked in {', '.join(candidates)})")
