"""The workflow's facts, as its Snakefile declared them: its stages in
order, which feed which, its funnels, its axis, each stage's code version.

The Snakefile records them in ``.waypost/stages.json`` each time it is read
(``Pipeline.finish``); when that file is missing, or older than the workflow's
files, or from another Snakefile, they are read again by letting Snakemake
parse the workflow (``--list-rules``: nothing runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from waypost.model.errors import WaypostError

GRAPH_FILE = os.path.join(".waypost", "stages.json")
#: Set when only the workflow's facts are read, to the file they go to: the
#: rules are read, nothing of the config is checked, no bucket is touched.
FACTS_ONLY_ENV = "WAYPOST_FACTS_ONLY"


class GraphError(WaypostError, RuntimeError):
    pass


def _current(snakefile: str) -> dict | None:
    """The recorded facts, if they are this Snakefile's and newer than its files."""
    try:
        with open(GRAPH_FILE) as f:
            data = json.load(f)
        recorded = os.stat(GRAPH_FILE).st_mtime
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("snakefile") != os.path.abspath(snakefile):
        return None
    try:
        if any(os.stat(path).st_mtime > recorded for path in data.get("sources", [])):
            return None
    except OSError:
        return None
    return data


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


def facts(config_path: str, workflow_dir: str) -> dict:
    """The workflow's facts (see the module's docstring). Reading them
    checks nothing of the config and touches no bucket: only the rules are
    asked for (the config is checked by whoever loads it next)."""
    snakefile = snakefile_in(workflow_dir)
    data = _current(snakefile)
    if data is None:
        if not os.path.exists(snakefile):
            raise GraphError(f"{snakefile}: no Snakefile there (--workflow names the directory that holds it)")
        # In a scratch directory: Snakemake leaves its .snakemake/ where it runs.
        with tempfile.TemporaryDirectory(prefix="waypost-facts-") as scratch:
            cmd = [sys.executable, "-m", "snakemake", "-s", os.path.abspath(snakefile), "-d", scratch,
                   "--configfile", os.path.abspath(config_path), "--list-rules"]
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, FACTS_ONLY_ENV: os.path.abspath(GRAPH_FILE)})
        data = _current(snakefile)
        if proc.returncode != 0 or data is None:
            output = (proc.stderr or proc.stdout).strip()
            hint = "" if proc.returncode else "\n(does the Snakefile call wp.finish() after its rules?)"
            raise GraphError(f"could not read the workflow ({snakefile}):\n{output[-2000:]}{hint}")
    return data


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


def load_config(config_path: str, workflow_dir: str, known: dict | None = None) -> dict:
    """A config checked against its workflow: the schemas, the stage names,
    the axis (``known``: the workflow's facts, when already read)."""
    from waypost.model import config as wconfig
    if known is None:
        wconfig.load_yaml(config_path)   # a missing or broken file: its own error first
        known = facts(config_path, workflow_dir)
    axis = known.get("axis") or {}
    return wconfig.load(config_path, workflow_dir, wconfig.Axis.of(axis.get("word"), axis.get("key")),
                        [*known["stages"], *known.get("own_layout", [])], known.get("instanced"))


def load(config_path: str, workflow_dir: str) -> dict[str, set[str]]:
    """stage → the stages it takes inputs from."""
    return parents(facts(config_path, workflow_dir))


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
