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

from . import layout, manifest


class SteerError(RuntimeError):
    """Nothing was changed; the message says why."""


def _dirs_with_state(stage_dir: str) -> list[str]:
    """The stage dir itself, or its instance dirs when the stage has instances."""
    entries = manifest.workspace_entries(stage_dir)
    own = [e for e in entries if manifest.is_engine_file(e) or os.path.isfile(os.path.join(stage_dir, e))]
    instances = [os.path.join(stage_dir, e) for e in entries
                 if layout.is_valid_name(e) and os.path.isdir(os.path.join(stage_dir, e))]
    return [stage_dir] if own or not instances else sorted(instances)


def _consumers(root: str, experiments: list[str]) -> dict[str, set[str]]:
    """stage dir → the stage dirs whose manifests list one of its files as input."""
    consumers: dict[str, set[str]] = {}
    for pair in os.listdir(root) if os.path.isdir(root) else []:
        for experiment in experiments:
            base = os.path.join(root, pair, experiment)
            for stage in os.listdir(base) if os.path.isdir(base) else []:
                for directory in _dirs_with_state(os.path.join(base, stage)):
                    try:
                        data = manifest.read(directory)
                    except manifest.ManifestError:
                        continue
                    for item in (data or {}).get("inputs", []):
                        if item.get("manifest"):
                            producer = os.path.abspath(os.path.dirname(item["manifest"]))
                            consumers.setdefault(producer, set()).add(os.path.abspath(directory))
    return consumers


def rerun(config: dict, stage: str, experiments: list[str] | None = None, pairs: list[str] | None = None,
          instance: str | None = None, downstream: bool = False, dry_run: bool = False) -> list[tuple[str, str]]:
    """Archive the workspaces of a stage (and, with ``downstream``, of what
    consumed it) so the next run recomputes them. Returns (dir, archive)."""
    root = config["root"]
    if stage not in config["stages"]:
        raise SteerError(f"unknown stage {stage!r} (expected one of: {', '.join(config['stages'])})")
    experiments = experiments or list(config["experiments"])
    unknown = [e for e in experiments if e not in config["experiments"]]
    if unknown:
        raise SteerError(f"unknown experiment(s): {', '.join(unknown)}")
    selected = []
    for experiment in experiments:
        for pair in [*config["experiments"][experiment]["pairs"], layout.ALL_PAIRS]:
            if pairs and pair not in pairs:
                continue
            stage_dir = layout.stage_dir(root, pair, experiment, stage)
            if not os.path.isdir(stage_dir):
                continue
            dirs = [os.path.join(stage_dir, instance)] if instance else _dirs_with_state(stage_dir)
            selected += [os.path.abspath(d) for d in dirs if manifest.workspace_entries(d)]
    if not selected:
        raise SteerError(f"nothing to rerun: no stage {stage}{'/' + instance if instance else ''} with files "
                         f"for experiment(s) {', '.join(experiments)}" + (f", pair(s) {', '.join(pairs)}" if pairs else ""))
    if downstream:
        consumers = _consumers(root, experiments)
        todo = list(selected)
        while todo:
            for consumer in sorted(consumers.get(todo.pop(), ())):
                if consumer not in selected:
                    selected.append(consumer)
                    todo.append(consumer)
    busy = [f"{d} ({where})" for d in selected for alive, where in [manifest.attempt_in_flight(d)] if alive]
    if busy:
        raise SteerError("an attempt is running in " + "; ".join(busy) + "; nothing was changed")
    done = []
    for directory in selected:
        archived = "(dry run)" if dry_run else manifest.archive_workspace(directory)
        if archived:
            done.append((directory, archived))
    return done


def adopt(config: dict, stage: str, experiment: str, pair: str, instance: str | None = None,
          note: str | None = None, force: bool = False) -> dict:
    """Write the manifest of a stage whose files were put there by hand."""
    if stage not in config["stages"]:
        raise SteerError(f"unknown stage {stage!r} (expected one of: {', '.join(config['stages'])})")
    stage_dir = layout.stage_dir(config["root"], pair, experiment, stage, instance)
    files = sorted(os.path.relpath(os.path.join(top, name), stage_dir)
                   for top, dirs, names in os.walk(stage_dir)
                   for name in names if not any(manifest.is_engine_file(part) for part in
                                                os.path.relpath(os.path.join(top, name), stage_dir).split(os.sep)))
    if not files:
        raise SteerError(f"{stage_dir}: no files to adopt")
    alive, where = manifest.attempt_in_flight(stage_dir)
    if alive:
        raise SteerError(f"{stage_dir}: an attempt is running ({where}); nothing was changed")
    try:
        previous = manifest.read(stage_dir)
    except manifest.ManifestError:
        previous = None
    if previous and previous["state"] == "SUCCESS" and not previous.get("adopted") and not force:
        raise SteerError(f"{stage_dir}: already a SUCCESS stage with its own manifest (use --force to adopt "
                         "what is there now instead)")
    outputs = manifest.describe_outputs(stage_dir, [os.path.join(stage_dir, f) for f in files])
    record = manifest.build(experiment=experiment, pair=pair, stage=stage, instance=instance, state="SUCCESS",
                            attempts=[], outputs=outputs, inputs=[], settings={}, config_hash="",
                            code_version="", adopted=True)
    record["adopted_by"] = f"{getpass.getuser()}@{socket.gethostname()}"
    if note:
        record["note"] = note
    manifest.write_json_atomic(manifest.manifest_path(stage_dir), record)
    marker = os.path.join(stage_dir, layout.UNFINISHED)
    if os.path.exists(marker):
        os.unlink(marker)  # adopted files are done: the next run must not redo the stage
    return record
