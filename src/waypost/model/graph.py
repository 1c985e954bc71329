"""The workflow's facts, as its Snakefile declared them: its stages in
order, which feed which, its funnels, its axis, each stage's code version.

The Snakefile records them in ``.waypost/stages.json`` each time it is read
(``Pipeline.finish``), with the config files and ``--config`` entries it was
read with; when that file is missing, or older than the workflow's files,
its config files or its profiles, or from another Snakefile or other
options, they are read again by letting Snakemake parse the workflow
(``--list-rules``: nothing runs) where ``snakemake`` would: in the current
directory, with the same profiles and config files.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from waypost.model.errors import WaypostError

GRAPH_FILE = os.path.join(".waypost", "stages.json")
#: Set when only the workflow's facts are read, to the file they go to: the
#: rules are read, nothing of the config is checked, no bucket is touched.
FACTS_ONLY_ENV = "WAYPOST_FACTS_ONLY"


class GraphError(WaypostError, RuntimeError):
    pass


def _current(snakefile: str, wanted: dict, profile_files: list[str]) -> dict | None:
    """The recorded facts, if they are this Snakefile's, read with the
    ``wanted`` options (``invocation``; any, when none is given: the
    workflow as it was last read here) and newer than its files, its config
    files and the profiles Snakemake would read (``profile_files``)."""
    try:
        with open(GRAPH_FILE) as f:
            data = json.load(f)
        recorded = os.stat(GRAPH_FILE).st_mtime
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("snakefile") != os.path.abspath(snakefile):
        return None
    if any(wanted.values()) and data.get("invocation") != wanted:
        return None
    try:
        if any(os.stat(path).st_mtime > recorded for path in data.get("sources", [])):
            return None
    except OSError:
        return None
    if any(os.path.exists(path) and os.stat(path).st_mtime > recorded for path in profile_files):
        return None
    return data


#: Set for the facts pass to the options it was given (``invocation``).
INVOCATION_ENV = "WAYPOST_FACTS_INVOCATION"


def invocation(config_path: str | None = None, profile: str | None = None,
               workflow_profile: str | None = None) -> dict:
    """The options a reading of the workflow was given: those of the facts
    pass (``INVOCATION_ENV``) in it, else these."""
    given = os.environ.get(INVOCATION_ENV)
    if given:
        return json.loads(given)
    return {"configfile": os.path.abspath(config_path) if config_path else None,
            "profile": profile, "workflow_profile": workflow_profile}


def profile_files(snakefile: str, profile: str | None, workflow_profile: str | None) -> list[str]:
    """The profiles' files Snakemake may read for this Snakefile (see
    Snakemake's ``--profile``, ``$SNAKEMAKE_PROFILE`` and
    ``--workflow-profile``, whose default is ``profiles/default`` here or
    beside the Snakefile): those there and those that may come."""
    names = [name for name in (profile, os.environ.get("SNAKEMAKE_PROFILE")) if name]
    dirs = [directory for name in names for directory in (
        name, os.path.expanduser(f"~/.config/snakemake/{name}"), f"/etc/xdg/snakemake/{name}")]
    own = workflow_profile or "default"
    dirs += [own, os.path.join("profiles", own),
             os.path.join(os.path.dirname(os.path.abspath(snakefile)), "profiles", own)]
    return [os.path.join(directory, "config.yaml") for directory in dirs]


SNAKEFILE_NAMES = ("Snakefile", "snakefile")


def snakefile_in(workflow_dir: str) -> str:
    """The Snakefile of a workflow directory (``Snakefile`` or ``snakefile``,
    as Snakemake looks for them); ``<dir>/Snakefile`` when there is none."""
    for name in SNAKEFILE_NAMES:
        path = os.path.join(workflow_dir, name)
        if os.path.exists(path):
            return path
    return os.path.join(workflow_dir, SNAKEFILE_NAMES[0])


def default_workflow_dir() -> str:
    """Where the commands find the workflow when not told: ``workflow/`` (the
    usual layout), else the current directory, as Snakemake's own search
    (``Snakefile``, ``snakefile``, ``workflow/Snakefile``...)."""
    if any(os.path.exists(os.path.join("workflow", name)) for name in SNAKEFILE_NAMES):
        return "workflow"
    if any(os.path.exists(name) for name in SNAKEFILE_NAMES):
        return "."
    return "workflow"


def facts(config_path: str | None, workflow_dir: str, profile: str | None = None,
          workflow_profile: str | None = None) -> dict:
    """The workflow's facts (see the module's docstring), read as
    ``snakemake`` reads the workflow here: in the current directory, with
    its profiles and the Snakefile's ``configfile:`` (``config_path``: a
    ``--configfile`` over it). Reading them checks nothing of the config and
    touches no bucket: only the rules are asked for (the config is checked
    by whoever loads it next)."""
    from waypost.model import config as wconfig
    if config_path:
        wconfig.load_yaml(config_path)   # a missing or broken file: its own line (file:line:column) first
    snakefile = snakefile_in(workflow_dir)
    wanted = invocation(config_path, profile, workflow_profile)
    data = _current(snakefile, wanted, profile_files(snakefile, profile, workflow_profile))
    if data is None:
        if not os.path.exists(snakefile):
            raise GraphError(f"{snakefile}: no Snakefile there (--workflow names the directory that holds it)")
        cmd = [sys.executable, "-m", "snakemake", "-s", os.path.abspath(snakefile), "--list-rules",
               *(["--configfile", os.path.abspath(config_path)] if config_path else []),
               *(["--profile", profile] if profile else []),
               *(["--workflow-profile", workflow_profile] if workflow_profile else [])]
        with _no_snakemake_log():
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, FACTS_ONLY_ENV: os.path.abspath(GRAPH_FILE),
                                       INVOCATION_ENV: json.dumps(wanted)})
        data = _current(snakefile, wanted, [])
        if proc.returncode != 0 or data is None:
            output = (proc.stderr or proc.stdout).strip()
            hint = "" if proc.returncode else "\n(does the Snakefile call wp.finish() after its rules?)"
            raise GraphError(f"could not read the workflow ({snakefile}):\n{output[-2000:]}{hint}")
    return data


@contextlib.contextmanager
def _no_snakemake_log():
    """Remove the log Snakemake writes for the facts pass
    (``.snakemake/log/<time>.snakemake.log``, and the folders if it made
    them): reading the workflow is waypost's own step, not a run of the
    user's, and a command refused for bad input leaves nothing behind."""
    log_dir = os.path.join(".snakemake", "log")
    made = [d for d in (".snakemake", log_dir) if not os.path.isdir(d)]
    before = set(os.listdir(log_dir)) if os.path.isdir(log_dir) else set()
    try:
        yield
    finally:
        if os.path.isdir(log_dir):
            for name in set(os.listdir(log_dir)) - before:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(log_dir, name))
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only where it is empty


def record(data: dict, path: str | None = None) -> None:
    """Record the facts (``Pipeline.finish``) in ``path`` (``GRAPH_FILE``
    when None); a file that holds them already is only touched: newer than
    the files they were read from."""
    path = path or GRAPH_FILE
    try:
        with open(path) as f:
            if json.load(f) == data:
                os.utime(path)
                return
    except (OSError, ValueError):
        pass
    from waypost.model.manifest import write_json_atomic
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, data, durable=False)


def load_config(workflow_dir: str, known: dict) -> dict:
    """The config of the workflow as its last reading here found it
    (``known``: its facts): its config files read again as Snakemake reads
    them, waypost's keys checked against the schemas, the stage names, the
    axis."""
    from waypost.model import config as wconfig
    files = known.get("configfiles", [])
    given = known.get("given_configfiles", [])
    overrides = known.get("config_overrides") or {}
    loaded = wconfig.snakemake_config(files, given, overrides)
    keys, source, top_level = wconfig.waypost_config(loaded, overrides, (given or files or [None])[-1])
    axis = known.get("axis") or {}
    return wconfig.prepare(keys, workflow_dir, source, axis=wconfig.Axis.of(axis.get("word"), axis.get("key")),
                           stages=recorded_rules(known),
                           instanced=known.get("instanced"), in_section=not top_level)


def recorded_rules(known: dict) -> list[str]:
    """Every rule whose jobs keep records, of the workflow's facts: its
    stages (``wp.out``), then its rules in their own layout."""
    return [*known["stages"], *known.get("own_layout", [])]


def in_experiments_slot(known: dict) -> list[str]:
    """The rules whose jobs keep their records in an experiment's slot of
    the root (``layout.ALL_PAIRS``), not one per pair: its funnels and its
    rules in their own layout."""
    return [*known["funnels"], *known.get("own_layout", [])]


def named_by_wildcards(known: dict, rule: str) -> bool:
    """Is a job of ``rule`` named by its wildcards (a rule in its own
    layout: as Snakemake names it), not by experiment, pair and instance (a
    stage)?"""
    return rule in known.get("own_layout", [])


def load(known: dict) -> dict[str, set[str]]:
    """stage → the stages it takes inputs from."""
    return parents(known)


def parents(data: dict) -> dict[str, set[str]]:
    """stage → the stages it takes inputs from, of the workflow's facts."""
    return {stage: set(data["parents"].get(stage, [])) for stage in data["stages"]}


def code_versions() -> dict[str, str]:
    """stage → the code version its jobs would record now, as the last parse
    of the workflow here recorded it (``waypost plan``'s dry run refreshes
    it); empty when no parse recorded them (no file, or an older one)."""
    try:
        with open(GRAPH_FILE) as f:
            return dict(json.load(f).get("code") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def ancestors(parents: dict[str, set[str]], stage: str) -> set[str]:
    seen, todo = set(), [stage]
    while todo:
        for parent in parents.get(todo.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def descendants(parents: dict[str, set[str]], stage: str) -> set[str]:
    children: dict[str, set[str]] = {}
    for child, of in parents.items():
        for parent in of:
            children.setdefault(parent, set()).add(child)
    return ancestors(children, stage)
