"""``waypost import``'s one entry: read a spec, work out its rules, write
the pipeline into a directory, and say what was written and what to write
by hand. Nothing is written when anything can't be (an error names the
spec's key), and nothing there is overwritten."""

from __future__ import annotations

import os
from dataclasses import dataclass

from waypost.ops.imports import emit, maestro, merlin
from waypost.ops.imports.study import SpecError, check_points, plan_rules

#: What an import writes, relative to its directory.
SNAKEFILE = os.path.join("workflow", "Snakefile")
CONFIG = os.path.join("config", "config.yaml")
POINTS = os.path.join("config", "points.csv")
WORKERS = os.path.join("config", "workers.yaml")


@dataclass
class Imported:
    written: list[str]
    rules: list[str]
    points: int
    notes: list[str]


def import_spec(kind: str, spec: str, target: str, pgen: str | None = None, pargs: list[str] | None = None,
                samples: str | None = None) -> Imported:
    for path in (SNAKEFILE, CONFIG):
        if os.path.exists(os.path.join(target, path)):
            raise SpecError(f"{os.path.join(target, path)}: exists; nothing was written (import into another "
                            "directory with --to DIR, or move it away)")
    if kind == "maestro":
        study = maestro.read(spec, pgen, pargs)
    else:
        study = merlin.read(spec, os.path.abspath(target), samples)
    check_points(study)
    rules = plan_rules(study)
    _placements(study, rules)
    specroot = os.path.relpath(os.path.dirname(os.path.abspath(spec)), os.path.join(os.path.abspath(target), "workflow"))
    files = {SNAKEFILE: emit.snakefile(study, rules, specroot)}
    points_file = None
    if study.table is not None:
        points_file = os.path.basename(POINTS)
        files[POINTS] = emit.points_csv(study)
    files[CONFIG] = emit.config_text(study, rules, points_file)
    classes = {rule.worker: rule.step.placement for rule in rules if rule.worker}
    if classes:
        files[WORKERS] = emit.workers_text(classes)
    if os.path.exists(os.path.join(target, WORKERS)) and WORKERS in files:
        study.notes.append(f"{os.path.join(target, WORKERS)}: kept as it is; add the classes the steps name "
                           f"({', '.join(classes)}) to its pools")
        del files[WORKERS]
    for path, text in files.items():
        full = os.path.join(target, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    notes = study.notes + [n for step in study.steps for n in step.notes]
    count = len(study.table) if study.table is not None else len(next(iter(study.parameters.values()), []))
    return Imported([os.path.join(target, p) for p in files], [r.name for r in rules], count, notes)


def _placements(study, rules) -> None:
    """A worker class for each placement (nodes, procs, exclusive) a step asks for."""
    for rule in rules:
        place = rule.step.placement
        if not place:
            continue
        name = f"n{int(place.get('nodes') or 1)}-p{int(place.get('procs') or 1)}"
        rule.worker = name + ("-exclusive" if place.get("exclusive") else "")
