"""Fan-out that follows the data, and instances with named dimensions.

``wp.parts(stage, "parts/{part}.txt")`` is a stage's instances: the files a
checkpoint stage wrote into its ``directory()`` output, found after that
checkpoint ran, through Snakemake's own checkpoint API
(``checkpoints.<stage>.get(**wildcards)``): until it ran, asking for them
raises Snakemake's ``IncompleteCheckpointException`` inside an input
function, and Snakemake re-evaluates the DAG once it has. A part's name
(what ``{part}`` matched) is the instance's name.

``wp.dims(part=wp.parts(...), teacher=teachers)`` is a stage's instances
over several named dimensions: one instance per combination, named by its
values joined with ``-`` in the order the dimensions are written
(``00-t1``); each dimension's values are what ``instances=`` takes (a list,
a function of the experiment, or of the experiment and the axis value, or
``wp.parts``). A rule reads a dimension's value as a placeholder
(``wp.stage("split", "parts/{part}.txt")``, ``instance="{teacher}"``) or a
param (``wp.dim("teacher")``), and gathers along some dimensions with
``wp.each(stage, file, over="part")``: no wildcard regex anywhere.

Snakemake's checkpoints are asked through ``waypost.planning.wiring.snake`` (``Snake``),
the one module that touches Snakemake's objects.
"""

from __future__ import annotations

import itertools
import re

from waypost import stores
from waypost.model import layout
from waypost.model.errors import WaypostError
from waypost.model.manifest import ManifestError
from waypost.model.records import made_here

# directories/, prefix, {name} or {name,constraint} (a regex, as in Snakemake's
# wildcards: braces only as a repetition, ``\d{2}``), suffix
_PATTERN = re.compile(r"((?:[^{}/]+/)*)([^{}/]*)\{(\w+)(?:\s*,\s*((?:[^{}]|\{\d+(?:,\d*)?\})+))?\}([^{}/]*)")


class FanoutError(WaypostError):
    """A fan-out written in a way waypost can't use; the message names the rule."""


def _where(rule: str | None) -> str:
    return f"rule {rule}: " if rule else ""


def spec_values(spec, experiment: str, pair: str) -> list[str]:
    """The values of one instances spec (a list, a function of the
    experiment or of the experiment and the axis value, ``Parts``, ``Dims``)."""
    if not callable(spec):
        return [str(name) for name in spec]
    return [str(name) for name in (spec(experiment, pair) if takes_axis_value(spec) else spec(experiment))]


_TAKES_AXIS_VALUE: dict = {}   # instances function → whether it takes the axis value (asked per job)


def takes_axis_value(function) -> bool:
    """Does an instances function take the axis value too (two arguments)?"""
    if isinstance(function, Parts | Named):
        return True
    try:
        return _TAKES_AXIS_VALUE[function]
    except (KeyError, TypeError):
        pass
    import inspect
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    found = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
    try:
        _TAKES_AXIS_VALUE[function] = found
    except TypeError:   # (an unhashable callable: asked again next time)
        pass
    return found


class Parts:
    """A stage's instances: the parts a checkpoint stage found in the data
    (see the module's docstring). ``pattern``: a path in the checkpoint's
    stage directory whose last part holds one ``{name}``, the dimension."""

    def __init__(self, pipeline, stage: str, pattern: str, rule: str | None):
        match = _PATTERN.fullmatch(pattern) if isinstance(pattern, str) else None
        if match is None or ".." in pattern.split("/"):
            raise FanoutError(f"{_where(rule)}wp.parts({stage!r}, {pattern!r}): expected a path in the stage's "
                              "directory whose last part holds one {name}, as in 'parts/{part}.txt' (or "
                              "'parts/{part,\\d+}.txt': what a part's name matches)")
        self.pipeline, self.stage = pipeline, layout.check_name(stage, "stage")
        self.rule = rule   # the rule it is written in (or whose instances it is: wp.out)
        self.pattern = pattern
        self.directory = match.group(1).rstrip("/")
        self.prefix, self.name, self.suffix = match.group(2), match.group(3), match.group(5)
        # A file is a part where its name is the prefix, a value, the suffix, as
        # glob_wildcards matches it: the value anything, or what the constraint matches.
        try:
            self.entry = re.compile(re.escape(self.prefix) + f"({match.group(4) or '.+'})" + re.escape(self.suffix))
        except re.error as exc:
            raise FanoutError(f"{_where(rule)}wp.parts({stage!r}, {pattern!r}): the constraint of {{{self.name}}} "
                              f"is not a regular expression ({exc})") from None
        self.dims = (self.name,)
        self._found: dict[str, list[str]] = {}   # checkpoint directory → its parts (once it ran)

    def __repr__(self) -> str:
        return f"wp.parts({self.stage!r}, {self.pattern!r})"

    def claim(self, rule: str) -> None:
        """The rule whose instances these are, for messages (when written before it)."""
        self.rule = self.rule or rule

    def file(self, value: str) -> str:
        """The part's file, relative to the checkpoint's stage directory."""
        return "/".join(p for p in (self.directory, f"{self.prefix}{value}{self.suffix}") if p)

    def __call__(self, experiment: str, pair: str) -> list[str]:
        stage_dir, store, _ = self.pipeline.fanout.checkpoint(self.stage, experiment, pair)
        if stage_dir not in self._found:
            self._found[stage_dir] = self._list(stage_dir, store)
        return self._found[stage_dir]

    def _list(self, stage_dir: str, store) -> list[str]:
        """The parts in the checkpoint's directory, as it is now that it ran."""
        directory = layout.join(stage_dir, self.directory) if self.directory else stage_dir
        values = []
        for entry in store.entries(directory):
            matched = None if entry.startswith(".") else self.entry.fullmatch(entry)
            if matched is None:
                continue
            value = matched.group(1)
            if not layout.is_valid_name(value):
                raise FanoutError(f"{layout.join(directory, entry)}: wp.parts({self.stage!r}, {self.pattern!r}): "
                                  f"{{{self.name}}} is {value!r}, which can't name an instance (expected "
                                  f"{layout.NAME_RULE}, no '..')")
            values.append(value)
        return sorted(values)


class Named:
    """Instances over named dimensions: each instance name stands for one
    value of each (``combinations``). ``Dims`` here; a study's points
    (``waypost.planning.points``) too."""
    dims: tuple[str, ...] = ()
    rule: str | None = None
    known = True   # are its dimensions known (a study's points: once a config has them)?

    def dims_in(self, experiment: str) -> tuple[str, ...]:
        """Its dimensions in one experiment."""
        return self.dims

    def combinations(self, experiment: str, pair: str) -> dict[str, dict]:
        raise NotImplementedError

    def __call__(self, experiment: str, pair: str | None = None) -> list[str]:
        return list(self.combinations(experiment, pair))

    def claim(self, rule: str) -> None:
        """The rule whose instances these are, for messages (when written before it)."""
        self.rule = self.rule or rule

    @property
    def parts(self) -> list[Parts]:
        return []

    def kept_instances(self, kept: list[str]) -> str:
        """The instances a stage that gathers these, keeping ``kept``, has (for messages)."""
        return f"wp.dims({', '.join(f'{d}=...' for d in kept)})"


class Dims(Named):
    """A stage's instances over named dimensions (see the module's docstring)."""

    def __init__(self, pipeline, dims: dict, rule: str | None):
        if not dims:
            raise FanoutError(f"{_where(rule)}wp.dims(): name at least one dimension (wp.dims(part=..., teacher=...))")
        for name, spec in dims.items():
            if name in ("experiment", "instance") or (pipeline.graph.axis_wc and name == pipeline.graph.axis_wc):
                raise FanoutError(f"{_where(rule)}wp.dims({name}=...): {name!r} is a wildcard of waypost's; "
                                  "name the dimension otherwise")
            if isinstance(spec, Dims | str) or not (callable(spec) or hasattr(spec, "__iter__")):
                raise FanoutError(f"{_where(rule)}wp.dims({name}={spec!r}): expected a list of names, a function "
                                  "of the experiment (and axis value), or wp.parts(...)")
        self.pipeline, self.rule = pipeline, rule
        self.specs = dict(dims)
        self.dims = tuple(dims)
        self._combos: dict[tuple, dict[str, dict]] = {}   # (experiment, pair) → name → its values

    def __repr__(self) -> str:
        return f"wp.dims({', '.join(self.dims)})"

    @property
    def parts(self) -> list[Parts]:
        return [spec for spec in self.specs.values() if isinstance(spec, Parts)]

    def combinations(self, experiment: str, pair: str) -> dict[str, dict]:
        """Instance name → its value of each dimension."""
        key = (experiment, pair)
        if key not in self._combos:
            columns = [spec_values(spec, experiment, pair) for spec in self.specs.values()]
            combos: dict[str, dict] = {}
            for values in itertools.product(*columns):
                name = "-".join(values)
                if name in combos:
                    raise FanoutError(f"{_where(self.rule)}experiment {experiment}: instance {name!r} stands for "
                                      f"{combos[name]} and for {dict(zip(self.dims, values))}: values of "
                                      f"{', '.join(self.dims)} joined by '-' must differ")
                combos[name] = dict(zip(self.dims, values))
            self._combos[key] = combos
        return self._combos[key]


def dims_of(spec) -> tuple[str, ...]:
    """The named dimensions of a stage's instances (none for a plain list or function)."""
    return spec.dims if isinstance(spec, Parts | Named) else ()


def dims_in(spec, experiment: str) -> tuple[str, ...]:
    """The named dimensions of a stage's instances in one experiment (a
    study's points: its parameter set's parameters)."""
    return spec.dims_in(experiment) if isinstance(spec, Named) else dims_of(spec)


def values_of(spec, experiment: str, pair: str, instance: str | None) -> dict[str, str]:
    """A job's value of each of its stage's dimensions."""
    if instance is None:
        return {}
    if isinstance(spec, Parts):
        return {spec.name: instance}
    if isinstance(spec, Named):
        combos = spec.combinations(experiment, pair)
        if instance not in combos:
            raise FanoutError(f"{_where(spec.rule)}instance {instance!r} of experiment {experiment} is not one of "
                              f"its {', '.join(spec.dims_in(experiment))} combinations")
        return combos[instance]
    return {}


class Planning:
    """What one planning knows of its checkpoints, once they ran, and which
    done stages were made from parts that changed since (presence mode)."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.after: set[str] = set()   # stages made from checkpoints' parts (set by ``follow``)
        self._checkpoints: dict[tuple, tuple] = {}
        self._changed: dict[str, str | None] = {}

    def follow(self, stages: dict) -> None:
        """The stages whose instances are a checkpoint's parts, and those
        that gather them (``wp.each``), transitively."""
        after = {name for name, spec in stages.items() if checkpoint_parts(spec.instances)}
        grew = True
        while grew:
            more = {name for name, spec in stages.items() if spec.gathered & after} - after
            after |= more
            grew = bool(more)
        self.after = after

    def checkpoint(self, stage: str, experiment: str, pair: str) -> tuple[str, object, dict | None]:
        """(stage directory, a store over it, file → sha256 of its manifest, None without one)
        of a checkpoint job that ran; IncompleteCheckpointException (from
        Snakemake's ``checkpoints.<stage>.get``) until it has. Read after it
        ran, not from the planning's snapshot of the root made before."""
        pipeline = self.pipeline
        spec = pipeline.graph.known(stage)
        slot = layout.ALL_PAIRS if spec.funnel or not pipeline.graph.axis_wc else pair
        key = (stage, experiment, slot)
        if key not in self._checkpoints:
            pipeline.snake.await_checkpoint(stage, pipeline.graph.values(experiment, slot))
            stage_dir = layout.stage_dir(pipeline.root, slot, experiment, stage)
            store = stores.store_for(stage_dir, quiet=True)
            try:
                data = store.manifest(stage_dir)
            except (ManifestError, OSError):   # unusable: nothing to compare the parts with
                data = None
            # None: no manifest (placed by hand, or unusable): what was made
            # from its parts is not compared with it.
            self._checkpoints[key] = (stage_dir, store, None if not data else {
                o.get("path"): o.get("sha256") for o in data.get("outputs") or [] if isinstance(o, dict)})
        return self._checkpoints[key]

    def changed(self, stage: str, stage_dir: str) -> str | None:
        """Why a done stage directory of a stage made from parts is to be
        redone: a part it was made from changed (its checkpoint ran again
        with other data), or a stage directory it gathered is to be redone.
        None: its manifest's inputs are what they are now (or it records
        none, or is not a SUCCESS made here)."""
        if stage not in self.after:
            return None
        if stage_dir not in self._changed:
            self._changed[stage_dir] = None   # (no cycles; a guard all the same)
            self._changed[stage_dir] = self._why(stage_dir)
        return self._changed[stage_dir]

    def decided(self, stage_dir: str) -> bool:
        """Has ``changed`` answered for this stage directory already?"""
        return stage_dir in self._changed

    def _why(self, stage_dir: str) -> str | None:
        pipeline = self.pipeline
        data = pipeline.state.recorded(stage_dir)
        if not made_here(data):
            return None
        for record in data.get("inputs") or []:
            made_by = record.get("manifest") if isinstance(record, dict) else None
            if not isinstance(made_by, str) or not made_by.endswith("/" + layout.MANIFEST):
                continue
            parent_dir = made_by[:-len(layout.MANIFEST) - 1]
            place = self.place(parent_dir)
            if place is None or place[2] not in pipeline.graph.stages:
                continue
            pair, experiment, stage, instance = place
            name = layout.stage_name(pair, experiment, stage, instance)
            if pipeline.snake.is_checkpoint(stage) and instance is None:
                _, _, current = self.checkpoint(stage, experiment, pair)
                rel = str(record.get("path", ""))[len(parent_dir) + 1:]
                if current is not None and current.get(rel) != record.get("sha256"):
                    return f"made from {name}'s {rel}, which " + ("changed" if rel in current else "is gone")
            elif stage in self.after:
                local_dir = parent_dir if not pipeline.mirror else parent_dir[len(pipeline.root.rstrip("/")) + 1:]
                if self.changed(stage, local_dir):
                    return f"made from {name}, which is redone"
        return None

    def place(self, stage_dir: str) -> tuple | None:
        """(pair, experiment, stage, instance) of a recorded stage directory
        under the root; None elsewhere."""
        rel = stores.below(self.pipeline.root, stage_dir)
        parts = rel.split("/") if rel else []
        if len(parts) not in (3, 4):
            return None
        return parts[0], parts[1], parts[2], parts[3] if len(parts) == 4 else None


def checkpoint_parts(spec) -> list[Parts]:
    """The checkpoint parts a stage's instances come from."""
    if isinstance(spec, Parts):
        return [spec]
    if isinstance(spec, Named):
        return spec.parts
    return []
