"""What Snakemake's rerun triggers would compare of each recorded job of a
rule in its own layout, now, for ``waypost plan`` (``ops.plan``) to
compare with what its record kept when it ran: its params, code, set of
inputs and software environment (``wiring.triggers.job_triggers``).

Asked only in ``plan``'s dry run (``events.OWN_TRIGGERS_ENV``), once
Snakemake has built its DAG: one ``own_triggers`` event per done job's
record (``record``, and ``triggers``, or ``error`` where the
rule can't make that job now). Presence mode gives a done job no inputs,
and the jobs above it are then not in the DAG at all: each recorded job is
asked of its rule itself.
"""

from __future__ import annotations

import os

from waypost import stores
from waypost.model import events, layout, manifest, records
from waypost.model import spec as wspec


def wanted() -> str | None:
    """The events file to report to, in ``plan``'s dry run; else None."""
    return events.path_from_env() if os.environ.get(events.OWN_TRIGGERS_ENV) else None


def report(snake, root: str, experiments: list[str], rules: list[str], step_param: str, path: str) -> None:
    """One ``own_triggers`` event per done job recorded under ``root`` of
    ``rules`` (rules in their own layout) in ``experiments``."""
    tree = stores.store_for(root)
    for experiment in experiments:
        for rule in rules:
            for _, directory in tree.state_dirs(layout.stage_dir(root, layout.ALL_PAIRS, experiment, rule)):
                values = _recorded_wildcards(tree, directory)
                if values is not None:
                    events.append(path, {"event": events.OWN_TRIGGERS, "record": directory,
                                         **_now(snake, rule, values, step_param)})


def _recorded_wildcards(tree, directory: str) -> dict | None:
    """The wildcards of a job made here whose record kept its triggers; None
    for any other record (none, adopted, reused, unfinished, older)."""
    try:
        data = tree.manifest(directory)
    except manifest.ManifestError:
        return None
    if not records.made_here(data) or not isinstance(data.get("triggers"), dict):
        return None
    values = data.get("wildcards")
    return values if isinstance(values, dict) else None


def _now(snake, rule: str, values: dict, step_param: str) -> dict:
    """What a job's spec line says of its triggers and inputs now, or the
    rule's error for a job it can't make now."""
    try:
        line = snake.current_spec(rule, values, step_param)
    except Exception as exc:   # (the Snakefile's own code: whatever it raises is its answer)
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    spec = wspec.decode(line)
    return {"triggers": spec.triggers}
