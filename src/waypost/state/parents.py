"""The stages that made a step's inputs: where each input came from and in
what state its producer ended (for ``depends`` and the manifest's inputs)."""

from __future__ import annotations

import os

from waypost.model import manifest, states
from waypost.model.job import outputs_base
from waypost.model.layout import MANIFEST
from waypost.model.records import Manifest


def _parent(stage_dir: str, path: str) -> tuple[str, Manifest | dict]:
    """The state of the stage that produced an input, and its manifest
    (``states.INPUT_ADOPTED``: placed by hand; ``INPUT_MISSING``: not there)."""
    try:
        data = manifest.read(stage_dir)
    except manifest.ManifestError:
        data = None
    if data is not None:
        return data["state"], data
    return (states.INPUT_ADOPTED if os.path.exists(path) else states.INPUT_MISSING), {}


def producer_dir(path: str, depth: int = 8) -> str:
    """The stage directory that made an input: the nearest directory above
    it with a manifest (a file in a ``directory()`` output, such as a
    checkpoint's parts, is below its stage's directory); the input's own
    directory when none has (placed by hand)."""
    own = directory = os.path.dirname(path)
    for _ in range(depth):
        if os.path.exists(os.path.join(directory, MANIFEST)):
            return directory
        parent = os.path.dirname(directory)
        if not parent or parent == directory:
            break
        directory = parent
    return own


def parent_state(stage_dir: str, path: str) -> str:
    return _parent(stage_dir, path)[0]


def describe_inputs(paths: list[str], made_by: dict[str, list[str]] | None = None) -> list[dict]:
    """Each input with the manifest of the stage that produced it.

    The checksum comes from that manifest (no re-hashing); an input without a
    manifest was placed by hand (adopted). ``made_by``: for an input a job
    of a rule in its own layout may have made, the record directories of
    the jobs that could have (the step spec's ``input_records``): its
    producer is the one whose manifest lists it.
    """
    described = []
    for path in paths:
        found = _recorded_producer(path, (made_by or {}).get(path, ()))
        stage_dir = found[0] if found else producer_dir(path)
        state, data = found[1:] if found else _parent(stage_dir, path)
        name = os.path.relpath(os.path.abspath(path), os.path.abspath(outputs_base(stage_dir, data)))
        described.append({
            "path": path,
            "manifest": os.path.join(stage_dir, MANIFEST) if data else None,
            "state": state,
            "sha256": next((o["sha256"] for o in data.get("outputs", []) if o["path"] == name), None),
            "provisional": bool(data.get("provisional")),
        })
        if found:   # (its manifest named as the input is: both relative, or both absolute)
            described[-1]["manifest"] = os.path.join(_as(path, stage_dir), MANIFEST)
            described[-1]["outputs_dir"] = data["outputs_dir"]
    return described


def _as(path: str, directory: str) -> str:
    """``directory`` absolute where ``path`` is, else relative to here."""
    return os.path.abspath(directory) if os.path.isabs(path) else os.path.relpath(directory)


def _recorded_producer(path: str, records: list[str]) -> tuple[str, str, Manifest] | None:
    """(record directory, state, manifest) of the job among ``records``
    whose manifest lists ``path`` among its outputs (a file of a
    ``directory()`` output: below one), or None."""
    for record in records:
        try:
            data = manifest.read(record)
        except manifest.ManifestError:
            continue
        if data is None:
            continue
        name = os.path.relpath(os.path.abspath(path), os.path.abspath(outputs_base(record, data)))
        if any(out["path"] == name or out["path"].startswith(name + "/") for out in data.get("outputs", [])):
            return record, data["state"], data
    return None
