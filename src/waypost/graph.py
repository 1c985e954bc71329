"""The stage graph (which stages feed which), as the Snakefile declared it.

The rules say it (``wp.needs``), so the Snakefile records it in
``.waypost/stages.json`` each time it is parsed; when that file is missing
(no run yet in this directory) it is made by letting Snakemake parse the
workflow (``--list-rules``: nothing runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

GRAPH_FILE = os.path.join(".waypost", "stages.json")


class GraphError(RuntimeError):
    pass


def load(config_path: str, workflow_dir: str, root: str = "") -> dict[str, set[str]]:
    """stage → the stages it takes inputs from (``root``: the config's, for
    the options a gs:// root needs)."""
    from .remote_stage import snakemake_options

    if not os.path.exists(GRAPH_FILE):
        cmd = [sys.executable, "-m", "snakemake", "-s", os.path.join(workflow_dir, "Snakefile"),
               "--configfile", config_path, *snakemake_options(root), "--list-rules", "--quiet", "all"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(GRAPH_FILE):
            raise GraphError(f"could not read the stage graph from the workflow ({' '.join(cmd)}):\n"
                             f"{(proc.stderr or proc.stdout)[-2000:]}")
    with open(GRAPH_FILE) as f:
        data = json.load(f)
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
