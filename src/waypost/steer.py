"""What users do to the file state by hand, done safely.

``rerun``: make stages be computed again by the next run. Their workspace
(outputs, manifest, logs) moves to ``.attempts/<n>/`` — archived, never
deleted — so in presence mode they are missing and only they are redone.
``--downstream`` adds every stage that consumed their outputs, found from
the ``inputs`` the manifests record (exact, instance by instance).

``adopt``: declare files placed by hand in a stage directory done, with a
manifest that says so (``adopted``), checksums and who adopted them.
"""

from __future__ import annotations

import getpass
import os
import socket

from . import layout, manifest, stagetree


class SteerError(RuntimeError):
    """Nothing was changed; the message says why."""


def _consumers(tree, experiments: list[str]) -> dict[str, set[str]]:
    """stage dir → the stage dirs whose manifests list one of its files as input."""
    consumers: dict[str, set[str]] = {}
    for directory in tree.manifest_dirs():
        parts = tree.relative(directory).split("/")
        if len(parts) < 3 or parts[1] not in experiments:
            continue
        try:
            data = tree.manifest(directory)
        except manifest.ManifestError:
            continue
        for item in (data or {}).get("inputs", []):
            if item.get("manifest"):
                producer = tree.key(os.path.dirname(item["manifest"]))
                consumers.setdefault(producer, set()).add(tree.key(directory))
    return consumers


def rerun(config: dict, stage: str, experiments: list[str] | None = None, pairs: list[str] | None = None,
          instance: str | None = None, downstream: bool = False, dry_run: bool = False) -> list[tuple[str, str]]:
    """Archive the workspaces of a stage (and, with ``downstream``, of what
    consumed it) so the next run recomputes them. Returns (dir, archive).
    On a gs:// root: one listing, the manifests read in one batch (only for
    ``downstream``), each archive a server-side move."""
    root = config["root"]
    if stage not in config["stages"]:
        raise SteerError(f"unknown stage {stage!r} (expected one of: {', '.join(config['stages'])})")
    experiments = experiments or list(config["experiments"])
    unknown = [e for e in experiments if e not in config["experiments"]]
    if unknown:
        raise SteerError(f"unknown experiment(s): {', '.join(unknown)}")
    tree = stagetree.open(root)
    selected = []
    for experiment in experiments:
        for pair in [*config["experiments"][experiment]["pairs"], layout.ALL_PAIRS]:
            if pairs and pair not in pairs:
                continue
            stage_dir = layout.stage_dir(root, pair, experiment, stage)
            if not tree.isdir(stage_dir):
                continue
            dirs = [layout.join(stage_dir, instance)] if instance else [d for _, d in tree.state_dirs(stage_dir)]
            selected += [tree.key(d) for d in dirs if tree.entries(d)]
    if not selected:
        raise SteerError(f"nothing to rerun: no stage {stage}{'/' + instance if instance else ''} with files "
                         f"for experiment(s) {', '.join(experiments)}" + (f", pair(s) {', '.join(pairs)}" if pairs else ""))
    if downstream:
        consumers = _consumers(tree, experiments)
        todo = list(selected)
        while todo:
            for consumer in sorted(consumers.get(todo.pop(), ())):
                if consumer not in selected:
                    selected.append(consumer)
                    todo.append(consumer)
    busy = [f"{d} ({where})" for d in selected for alive, where in [tree.in_flight(d)] if alive]
    if busy:
        raise SteerError("an attempt is running in " + "; ".join(busy) + "; nothing was changed")
    done = []
    for directory in selected:
        archived = "(dry run)" if dry_run else tree.archive(directory)
        if archived:
            done.append((directory, archived))
    return done


def adopt(config: dict, stage: str, experiment: str, pair: str, instance: str | None = None,
          note: str | None = None, force: bool = False) -> dict:
    """Write the manifest of a stage whose files were put there by hand (on
    a gs:// root: the objects are read for their sha256)."""
    if stage not in config["stages"]:
        raise SteerError(f"unknown stage {stage!r} (expected one of: {', '.join(config['stages'])})")
    stage_dir = layout.stage_dir(config["root"], pair, experiment, stage, instance)
    tree = stagetree.open(stage_dir)
    files = [f for f in tree.files(stage_dir)
             if not any(manifest.is_engine_file(part) for part in f.split("/"))]
    if not files:
        raise SteerError(f"{stage_dir}: no files to adopt")
    alive, where = tree.in_flight(stage_dir)
    if alive:
        raise SteerError(f"{stage_dir}: an attempt is running ({where}); nothing was changed")
    try:
        previous = tree.manifest(stage_dir)
    except manifest.ManifestError:
        previous = None
    if previous and previous["state"] == "SUCCESS" and not previous.get("adopted") and not force:
        raise SteerError(f"{stage_dir}: already a SUCCESS stage with its own manifest (use --force to adopt "
                         "what is there now instead)")
    outputs = tree.describe(stage_dir, files)
    record = manifest.build(experiment=experiment, pair=pair, stage=stage, instance=instance, state="SUCCESS",
                            attempts=[], outputs=outputs, inputs=[], settings={}, config_hash="",
                            code_version="", adopted=True)
    record["adopted_by"] = f"{getpass.getuser()}@{socket.gethostname()}"
    if note:
        record["note"] = note
    tree.write_manifest(stage_dir, record)
    tree.remove(layout.join(stage_dir, layout.UNFINISHED))  # adopted files are done: the next run must not redo them
    return record
