"""One job: a rule's job with its wildcards and experiment, the directory
that holds its records, its outputs and their base directory.

waypost knows two layouts of one model. A ``wp.out`` stage is a job whose
outputs' base is its record directory (the stage directory: its workspace,
its outputs, its records). A rule in its own layout keeps its outputs where
the rule puts them: its record directory holds only its records, and the
records name the outputs from their base (``outputs_dir``). The questions
whose answer depends on which are answered here, once: where an output
lives, what the records say of the outputs' place, whether what a step
leaves beside its outputs is its workspace or its side files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from waypost.model import locations
from waypost.model.errors import WaypostError
from waypost.model.layout import job_name, stage_name


class Unplaceable(WaypostError, ValueError):
    """A source's files don't fit a job (``Job.places_of``): one line, nothing changed."""


@dataclass(frozen=True)
class Job:
    """A job of ``rule`` (a stage's name, or a rule in its own layout's)
    whose records are in ``record_dir``, its ``outputs`` below
    ``outputs_base`` (None: the record directory itself)."""

    rule: str
    record_dir: str
    outputs: tuple[str, ...] = ()
    outputs_base: str | None = None
    wildcards: Mapping[str, Any] = field(default_factory=dict)
    experiment: str | None = None
    pair: str | None = None
    instance: str | None = None

    @classmethod
    def in_own_layout(cls, rule: str, record_dir: str, outputs: list[str], **who: Any) -> Job:
        """A job of a rule in its own layout: its outputs' base the deepest
        directory above them all (paths, or URLs in a bucket)."""
        base = os.path.commonpath([os.path.dirname(_key(o)) for o in outputs])
        if locations.is_bucket_url(record_dir):
            base = locations.prefix_of(record_dir) + base[1:]
        return cls(rule=rule, record_dir=record_dir, outputs=tuple(outputs), outputs_base=base, **who)

    @classmethod
    def of_step(cls, step, local=str) -> Job:
        """A step's job (``model.spec.StepSpec``), its paths as the step
        works with them (``local``: a bucket's URL to its local copy)."""
        record_dir, outputs = local(step.stage_dir), [local(o) for o in step.outputs]
        who = {"experiment": step.experiment, "pair": step.pair, "instance": step.instance}
        if step.own_layout:
            return cls.in_own_layout(step.stage, record_dir, outputs, wildcards=dict(step.wildcards), **who)
        return cls(rule=step.stage, record_dir=record_dir, outputs=tuple(outputs), **who)

    @classmethod
    def of_record(cls, record_dir: str, data: Mapping[str, Any] | None) -> Job:
        """The job a record (a manifest, a running marker; None: none
        readable) in ``record_dir`` is of: its outputs as it lists them,
        from its ``outputs_dir`` where it names one."""
        data = data or {}
        rel = data.get("outputs_dir")
        base = locations.resolve(record_dir, rel) if isinstance(rel, str) and rel else None
        # (a manifest lists each output as {"path": ...}; a running marker, as its path)
        listed = [o.get("path") if isinstance(o, Mapping) else o for o in data.get("outputs") or ()]
        top = base or record_dir
        wildcards = data.get("wildcards")
        return cls(rule=str(data.get("stage") or ""), record_dir=record_dir,
                   outputs=tuple(os.path.join(top, p) for p in listed if isinstance(p, str)),
                   outputs_base=base, wildcards=wildcards if isinstance(wildcards, Mapping) else {},
                   experiment=data.get("experiment"), pair=data.get("pair"), instance=data.get("instance"))

    # --- where things are ---------------------------------------------------------
    @property
    def outputs_in_record(self) -> bool:
        """Are its outputs in its record directory (a ``wp.out`` stage), not
        where its rule puts them (a rule in its own layout)?"""
        return self.outputs_base is None

    @property
    def base(self) -> str:
        """The directory its outputs' recorded paths are relative to."""
        return self.record_dir if self.outputs_base is None else self.outputs_base

    def output_path(self, rel: str) -> str:
        """Where an output its records name (``rel``, from ``base``) lives."""
        return os.path.join(self.base, rel)

    def relative(self, path: str) -> str:
        """An output's (or a side file's) path as its records name it: from ``base``."""
        return os.path.relpath(_key(path), _key(self.base))

    @property
    def outputs_dir(self) -> str | None:
        """Its records' ``outputs_dir``: where the outputs are, from the
        record directory (None: there)."""
        if self.outputs_base is None:
            return None
        return os.path.relpath(_key(self.outputs_base), _key(self.record_dir))

    @property
    def outputs_inside_record(self) -> tuple[str, ...]:
        """Its outputs in its record directory: all of a stage's; none of a
        rule in its own layout's."""
        return self.outputs if self.outputs_in_record else ()

    @property
    def outputs_outside_record(self) -> tuple[str, ...]:
        """Its outputs that are not in its record directory, where its rule
        put them: none of a stage's; all of a rule in its own layout's."""
        return () if self.outputs_in_record else self.outputs

    # --- what its records say --------------------------------------------------------
    @property
    def described_as(self) -> str:
        """What it is, as messages say: a stage, or a job of a rule in its own layout."""
        return "stage with its own manifest" if self.outputs_in_record else "job with its own record"

    @property
    def name(self) -> str:
        """How messages name it: experiment/pair/stage[/instance], or a rule
        in its own layout's job as Snakemake names it, ``rule[wildcards]``."""
        if self.outputs_in_record:
            return stage_name(self.pair or "", self.experiment or "", self.rule, self.instance)
        return job_name(self.rule, dict(self.wildcards))

    def record_fields(self) -> dict[str, Any]:
        """What its manifest says of its outputs' place beyond their paths:
        nothing for a ``wp.out`` stage; a rule in its own layout's
        ``outputs_dir``, ``wildcards`` and ``declared`` outputs in the
        rule's order."""
        if self.outputs_in_record:
            return {}
        return {"outputs_dir": self.outputs_dir, "wildcards": dict(self.wildcards),
                "declared": [self.relative(o) for o in self.outputs]}

    def marker_fields(self) -> dict[str, Any]:
        """What its running marker says of its outputs' place beyond their
        paths: nothing for a ``wp.out`` stage; a rule in its own layout's
        ``outputs_dir``."""
        return {} if self.outputs_in_record else {"outputs_dir": self.outputs_dir}

    # --- what a reuse brings where ------------------------------------------------------
    def places_of(self, source: str, data: Mapping[str, Any], temporary: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
        """Where each file the record in ``source`` (its manifest, ``data``)
        lists goes in this job: (target path, the source's entry, whose
        ``path`` is the file's from the source's outputs' base). A stage
        takes each at the same path in its record directory; a rule in its
        own layout maps the source's declared outputs onto its own position
        by position (the paths may differ: an experiment whose paths come
        from its config), a ``directory()`` output whole, and a side file
        into the directory that holds the output at the same position
        (``temporary``: its ``temp()`` outputs, which a source may have lost).
        Unplaceable when the source lacks what this job declares."""
        if self.outputs_in_record:
            return self._places_alike(source, data)
        return self._places_by_position(source, data, {os.path.abspath(t) for t in temporary})

    def _places_alike(self, source: str, data: Mapping[str, Any]) -> list[tuple[str, dict]]:
        places = [(os.path.join(self.record_dir, o["path"]), o) for o in data.get("outputs") or ()]
        brought = {os.path.abspath(target) for target, _ in places}
        missing = {d for d in map(os.path.abspath, self.outputs)   # (a directory() output: some file below it)
                   if d not in brought and not any(b.startswith(d + os.sep) for b in brought)}
        if missing:
            raise Unplaceable(f"{source}: the source stage has no {', '.join(sorted(missing))}")
        return places

    def _places_by_position(self, source: str, data: Mapping[str, Any], temporary: set[str]) -> list[tuple[str, dict]]:
        declared = data.get("declared")
        if not isinstance(declared, list) or not data.get("outputs_dir"):
            raise Unplaceable(f"{source}: not the record of a rule in its own layout (its manifest lists no "
                                "declared outputs): a stage's directory is reused by a stage rule")
        if len(declared) != len(self.outputs):
            raise Unplaceable(f"{source}: the source job declares {len(declared)} output(s), this one "
                                f"{len(self.outputs)}: they can't be matched position by position")
        # where each of the source's declared outputs goes (from the base)
        places = {rel: self.relative(out) for rel, out in zip(declared, self.outputs)}
        folders = {os.path.dirname(rel): os.path.dirname(target) for rel, target in places.items()}
        found = []
        for entry in data.get("outputs") or ():
            target = _place_by_position(entry, places, folders)
            if target is not None:   # (else a side file of a directory this job doesn't have)
                found.append((os.path.join(self.base, target), entry))
        there = {self.relative(target) for target, _ in found}
        missing = [places[d] for d in declared if places[d] not in there
                   and not any(f.startswith(places[d] + "/") for f in there)
                   and os.path.abspath(self.output_path(places[d])) not in temporary]
        if missing:
            raise Unplaceable(f"{source}: the source job has nothing for {', '.join(missing)}")
        return found


def _place_by_position(entry: Mapping[str, Any], places: dict[str, str], folders: dict[str, str]) -> str | None:
    """Where a source's file (its manifest's ``entry``) goes, from the
    job's outputs' base (``places``: each declared output of the source's
    to this job's at its position): a declared output to its own; a side
    file into the directory that holds the output at the same position
    (``folders``: each declared output's directory to its target's); a
    file of a ``directory()`` output below the job's. None: nowhere."""
    rel = entry["path"]
    if rel in places:
        return places[rel]
    if entry.get("side") and os.path.dirname(rel) in folders:
        return os.path.join(folders[os.path.dirname(rel)], os.path.basename(rel))
    inside = next((d for d in places if rel.startswith(d + "/")), None)   # in a directory() output
    return None if inside is None else places[inside] + rel[len(inside):]


def _key(location: str) -> str:
    """A location as an absolute path: a path's own; a bucket URL's key,
    rooted (gs://B/K at /B/K, the layout of its local copies), so that paths
    from one to another are reckoned alike."""
    if locations.is_bucket_url(location):
        return "/" + locations.object_name(location)
    return os.path.abspath(location)


def outputs_elsewhere(data: Mapping[str, Any] | None) -> bool:
    """Is a record (a manifest, a running marker) a job's whose outputs are
    not in its record directory (a rule in its own layout: ``outputs_dir``)?"""
    return bool((data or {}).get("outputs_dir"))


def wildcards_named(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The wildcards a record (a manifest) names its job by: a rule in its
    own layout's, as Snakemake names it; None for a stage's (named by
    experiment, pair and instance). Read from the record alone, without
    making its ``Job``: the catalog asks it of every manifest it reads."""
    wildcards = (data or {}).get("wildcards")
    return dict(wildcards) if outputs_elsewhere(data) and isinstance(wildcards, Mapping) else None


def outputs_base(record_dir: str, data: Mapping[str, Any] | None) -> str:
    """Where the outputs a record directory's record (manifest or marker)
    lists are (``Job.base``)."""
    return Job.of_record(record_dir, data).base
