"""The stage graph: what the stage rules declared through the helpers.

Its stages, in the order their rules were written, which stage reads which,
their instances (and those instances' named dimensions), the funnels, and
the path patterns of their files. ``.waypost/stages.json`` records it
(``facts``). It knows no Snakemake object: the wiring (``waypost.planning.wiring``)
tells it which rule is being defined, and its helpers' functions get a job's
wildcards as any mapping.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

from waypost.model import config as wconfig
from waypost.model import layout
from waypost.model.errors import WaypostError
from waypost.planning import fanout


class StageError(WaypostError):
    """A stage rule written in a way waypost can't run; the message names the rule."""


@dataclass
class Stage:
    """What a stage rule declared through the helpers."""
    name: str
    funnel: bool = False          # once per experiment, over all its axis values
    instances: object = None      # experiment → instance names, for a stage with instances
    parents: set = field(default_factory=set)
    order: int = 0
    gathers: bool = False         # it reads every instance of a stage (wp.each): made from a set of them
    gathered: set = field(default_factory=set)   # the stages it gathers (wp.each)


def presigned(function):
    """``function`` with its signature computed once: Snakemake asks for the
    signature of every function it calls, at every job (``inspect.signature``
    returns a preset ``__signature__`` at once)."""
    import inspect
    function.__signature__ = inspect.signature(function)
    return function


class StageGraph:
    """The stages of one Snakefile (see the module's docstring).

    ``config``: the workflow's config (its experiments and their axis
    values); ``base``: the directory the rules' paths start with ("" on a
    bucket root, whose paths are relative to it)."""

    def __init__(self, config: dict, axis: wconfig.Axis | None, base: str):
        self.config = config
        self.axis = axis
        self.axis_wc = axis.word if axis else None   # the axis's wildcard name
        self.base = base
        self.stages: dict[str, Stage] = {}
        self.current: str | None = None   # the rule Snakemake is defining now (set by the wiring)
        self._dim_checks: list[tuple] = []   # dimensions the rules name, checked by ``check``

    # --- names -----------------------------------------------------------
    @property
    def experiments(self) -> list[str]:
        return list(self.config["experiments"])

    def axis_values(self, experiment: str) -> list[str]:
        return list(self.config["experiments"][experiment]["pairs"])

    def instances(self, stage: str, experiment: str, pair: str | None = None) -> list[str]:
        spec = self.stages[stage].instances
        if not callable(spec):
            return [str(name) for name in spec]
        if not fanout.takes_axis_value(spec):
            return [str(name) for name in spec(experiment)]
        pairs = [pair] if pair is not None else (self.axis_values(experiment) if self.axis_wc else [layout.ALL_PAIRS])
        return list(dict.fromkeys(str(name) for value in pairs for name in spec(experiment, value)))

    def pair(self, wildcards) -> str:
        """A job's axis value (the engine's ``pair``): ``_all`` for a funnel."""
        return wildcards.get(self.axis_wc, layout.ALL_PAIRS) if self.axis_wc else layout.ALL_PAIRS

    def values(self, experiment: str, pair: str, instance: str | None = None) -> dict:
        """Wildcard values of a job (for the patterns of its files)."""
        values = {"experiment": experiment, "instance": instance}
        if self.axis_wc:
            values[self.axis_wc] = pair
        return values

    def known(self, stage: str, consumer: str | None = None) -> Stage:
        if stage not in self.stages:
            where = f"rule {consumer}: " if consumer else ""
            raise StageError(f"{where}no stage {stage!r}: a stage is a rule with wp.out() outputs "
                             f"(the stages are: {', '.join(self.stages) or 'none yet'})")
        return self.stages[stage]

    def downstream(self, stage: str) -> set[str]:
        """Every stage that takes inputs from ``stage``, directly or not."""
        seen, todo = set(), [stage]
        while todo:
            current = todo.pop()
            for child, spec in self.stages.items():
                if current in spec.parents and child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen

    # --- paths -----------------------------------------------------------
    def path(self, stage: str, filename: str, funnel: bool, instance: str | None, pair: str | None = None) -> str:
        slot = layout.ALL_PAIRS if funnel or not self.axis_wc else (pair or "{" + self.axis_wc + "}")
        return layout.join(self.base, slot, "{experiment}", stage, *([instance] if instance else []), filename)

    def own_path(self, stage: Stage, filename: str) -> str:
        """Pattern of a file in a stage's own directory (with ``{instance}``
        when it has instances)."""
        return self.path(stage.name, filename, stage.funnel, "{instance}" if stage.instances is not None else None)

    def path_of(self, stage: str, filename: str, experiment: str, pair: str | None = None,
                instance: str | None = None) -> str:
        spec = self.known(stage)
        return self.path(stage, filename, spec.funnel, instance, pair or layout.ALL_PAIRS).format(experiment=experiment)

    def stage_of_path(self, pattern: str) -> list[str]:
        """The stage a path pattern is in, if it is under the root."""
        base = self.base.rstrip("/") + "/" if self.base else ""
        if not pattern.startswith(base):
            return []
        parts = pattern[len(base):].split("/")
        return [parts[2]] if len(parts) > 3 and parts[2] in self.stages else []

    # --- the helpers, in a rule being defined ------------------------------
    def declaring(self, helper: str) -> Stage:
        """The stage of the rule being defined (a helper that names no stage
        is only used in a rule's body)."""
        if self.current is None:
            raise StageError(f"wp.{helper}() is used in a rule's input, output or params: it stands for that "
                             "rule's stage (outside a rule, use wp.path_of(stage, ...))")
        if self.current not in self.stages:
            self.stages[self.current] = Stage(self.current, order=len(self.stages))
        return self.stages[self.current]

    def out(self, filename: str, instances=None, funnel: bool = False) -> str:
        if not isinstance(filename, str) or not filename or filename.startswith("/") or ".." in filename.split("/"):
            raise StageError(f"rule {self.current}: wp.out({filename!r}): expected a file name inside the "
                             "stage's directory")
        stage = self.declaring("out")
        if instances is not None:
            if stage.instances is not None and stage.instances is not instances:
                raise StageError(f"rule {stage.name}: its outputs name different instances")
            stage.instances = instances
            if isinstance(instances, fanout.Parts | fanout.Named):
                instances.claim(stage.name)   # (written before the rule: its messages name it)
            stage.parents.update(parts.stage for parts in fanout.checkpoint_parts(instances))
        stage.funnel = stage.funnel or funnel
        return self.own_path(stage, filename)

    def stage(self, stage: str | tuple, filename, instance: str | None = None):
        consumer = self.declaring("stage")
        named = [stage] if isinstance(stage, str) else list(stage)
        for name in named:
            consumer.parents.add(layout.check_name(name, "stage"))
        if callable(filename):
            return presigned(filename)
        if len(named) != 1:
            raise StageError(f"rule {consumer.name}: wp.stage({stage!r}, {filename!r}): several stages go "
                             "with a function that picks the path")
        placeholders = {field for text in (filename, instance) if isinstance(text, str)
                        for _, field, _, _ in string.Formatter().parse(text) if field}
        placeholders -= {"experiment", "instance", self.axis_wc}
        if placeholders:
            self._dim_checks.append((consumer.name, f"wp.stage({stage!r}, {filename!r})", placeholders, None, None))
        # (filled by the job's dimensions only where it names some: else a plain pattern)
        with_dims = bool(placeholders)

        def pattern(has_instance: bool) -> str:
            upstream = self.known(stage, consumer.name)
            own = instance if instance is not None else ("{instance}" if upstream.instances is not None else None)
            if own == "{instance}" and not has_instance:
                raise StageError(f"rule {consumer.name}: wp.stage({stage!r}, {filename!r}): stage {stage} has "
                                 "instances and this one has none: name one (instance=...) or take each (wp.each)")
            return self.path(stage, filename, upstream.funnel, own)

        def path(wildcards):
            found = pattern("instance" in wildcards.keys())  # noqa: SIM118 (a Namedlist: `in` looks at its values)
            values = dict(wildcards.items())
            if with_dims:
                return self._with_dims(consumer, found, values, f"wp.stage({stage!r}, {filename!r})")
            return found.format(**values)

        def as_pattern(has_instance: bool) -> str | None:
            """The path as a pattern of the consumer's wildcards; None where
            its instances' dimensions fill it (known once the rules are read)."""
            if with_dims:
                return None
            return pattern(has_instance)
        path.as_pattern = as_pattern
        return presigned(path)

    def _with_dims(self, consumer: Stage, pattern: str, values: dict, helper: str) -> str:
        """``pattern`` filled with a job's wildcards and its values of its
        stage's dimensions (``{part}``, ``{teacher}``)."""
        dims = fanout.values_of(consumer.instances, values["experiment"], self.pair(values), values.get("instance"))
        try:
            return pattern.format(**{**dims, **values})
        except KeyError as exc:
            raise StageError(f"rule {consumer.name}: {helper}: no dimension {exc.args[0]!r} (rule "
                             f"{consumer.name}'s instances have: {', '.join(fanout.dims_of(consumer.instances))})") \
                from None

    def each(self, stage: str, filename: str, over=None):
        consumer = self.declaring("each")
        layout.check_name(stage, "stage")
        consumer.parents.add(stage)
        consumer.gathers = True
        consumer.gathered.add(stage)
        along = None if over is None else ((over,) if isinstance(over, str) else tuple(over))
        if along is not None and (not along or not all(isinstance(d, str) and d for d in along)):
            raise StageError(f"rule {consumer.name}: wp.each({stage!r}, {filename!r}, over={over!r}): expected "
                             "the name of a dimension, or a list of them")
        if along is not None:
            self._dim_checks.append((consumer.name, None, set(), stage, along))

        def paths(wildcards):
            upstream = self.known(stage, consumer.name)
            pairs = ([layout.ALL_PAIRS] if upstream.funnel or not self.axis_wc else
                     self.axis_values(wildcards.experiment) if consumer.funnel else [self.pair(wildcards)])
            if along is not None:
                return [self.path_of(stage, filename, wildcards.experiment, pair, name) for pair in pairs
                        for name in self._gathered(consumer, upstream, along, wildcards, pair)]
            return [self.path_of(stage, filename, wildcards.experiment, pair, name) for pair in pairs
                    for name in (self.instances(stage, wildcards.experiment, pair)
                                 if upstream.instances is not None else [None])]
        return presigned(paths)

    def _gathered(self, consumer: Stage, upstream: Stage, along: tuple, wildcards, pair: str) -> list[str]:
        """The instances of ``upstream`` a job of ``consumer`` gathers along
        the dimensions ``along``: those whose other dimensions hold this
        job's values."""
        names = fanout.dims_in(upstream.instances, wildcards.experiment) if upstream.instances is not None else ()
        kept = [d for d in names if d not in along]
        values = dict(wildcards.items())
        instance = values.get("instance")
        own = fanout.values_of(consumer.instances, values["experiment"], self.pair(values), instance) \
            if consumer.instances is not None else {}
        if kept and not own and instance is not None and len(kept) == 1 and not fanout.dims_of(consumer.instances):
            own = {kept[0]: instance}   # one instance per value of the one dimension kept
        if not kept:   # along every dimension: all of them
            return self.instances(upstream.name, wildcards.experiment, pair)
        combos = upstream.instances.combinations(wildcards.experiment, pair)   # (a Dims: it keeps some)
        return [name for name, dims in combos.items() if all(dims[d] == own[d] for d in kept)]

    def dim(self, name: str):
        consumer = self.declaring("dim")
        self._dim_checks.append((consumer.name, f"wp.dim({name!r})", {name}, None, None))

        def value(wildcards):
            values = dict(wildcards.items())
            dims = fanout.values_of(consumer.instances, values["experiment"], self.pair(values),
                                    values.get("instance")) if consumer.instances is not None else {}
            if name not in dims:
                raise StageError(f"rule {consumer.name}: wp.dim({name!r}): its instances have no dimension {name!r} "
                                 f"(they have: {', '.join(fanout.dims_of(consumer.instances)) or 'none'})")
            return dims[name]
        return presigned(value)

    # --- once every rule is defined --------------------------------------
    def check(self, is_checkpoint) -> None:
        """Every ``wp.parts`` names a checkpoint stage without instances
        (``is_checkpoint(stage)``: its rule is a checkpoint), and every
        dimension a rule names is one its stages have."""
        for stage in self.stages.values():
            for parts in fanout.checkpoint_parts(stage.instances):
                _check_parts(stage.name, parts, self.stages, is_checkpoint)
        for name, helper, needed, upstream, along in self._dim_checks:
            consumer = self.stages[name]
            dims = fanout.dims_of(consumer.instances)
            if not all(getattr(spec, "known", True) for spec in (consumer.instances,
                                                                  upstream and self.known(upstream, name).instances)):
                continue   # a study's points, and no config that has them (the rules alone are read)
            if upstream is None:   # placeholders in a wp.stage
                missing = sorted(needed - set(dims))
                if missing:
                    raise StageError(f"rule {name}: {helper}: no dimension {missing[0]!r} (rule {name}'s "
                                     f"instances have: {', '.join(dims) or 'no named dimensions'})")
                continue
            _check_gather(name, consumer, dims, self.known(upstream, name), upstream, along)

    def instanced(self) -> list[str]:
        return [name for name, spec in self.stages.items() if spec.instances is not None]

    def facts(self) -> dict:
        """The graph's part of ``.waypost/stages.json`` (see ``waypost.model.graph``)."""
        return {"parents": {stage: sorted(spec.parents) for stage, spec in self.stages.items() if spec.parents},
                "stages": list(self.stages), "funnels": [s for s, spec in self.stages.items() if spec.funnel],
                "instanced": self.instanced(),
                "axis": {"word": self.axis.word, "key": self.axis.key} if self.axis else None}


def _check_parts(name: str, parts, stages: dict, is_checkpoint) -> None:
    """A ``wp.parts`` of rule ``name`` names a checkpoint stage without instances."""
    source = stages.get(parts.stage)
    if source is None:
        raise StageError(f"rule {name}: {parts!r}: no stage {parts.stage!r} (the stages are: "
                         f"{', '.join(stages)})")
    if not is_checkpoint(parts.stage):
        raise StageError(f"rule {name}: {parts!r}: rule {parts.stage} is not a checkpoint "
                         f"(write `checkpoint {parts.stage}:` for a stage whose output decides the parts)")
    if source.instances is not None:
        raise StageError(f"rule {name}: {parts!r}: checkpoint {parts.stage} has instances; "
                         "parts come from a checkpoint with one job per experiment (and axis value)")


def _check_gather(name: str, consumer: Stage, dims, source: Stage, upstream: str, along) -> None:
    """A ``wp.each(upstream, ..., over=along)`` of rule ``name`` (whose
    instances have ``dims``): ``along`` are dimensions of ``source`` (the
    upstream stage), and the consumer's instances have those it keeps."""
    helper = f"wp.each({upstream!r}, ..., over={list(along) if len(along) > 1 else along[0]!r})"
    theirs = fanout.dims_of(source.instances)
    unknown = [d for d in along if d not in theirs]
    if unknown:
        raise StageError(f"rule {name}: {helper}: stage {upstream} has no dimension {unknown[0]!r} "
                         f"(its dimensions: {', '.join(theirs) or 'none: wp.dims(...) names them'})")
    kept = [d for d in theirs if d not in along]
    plain_one = consumer.instances is not None and not dims and len(kept) == 1
    missing = [d for d in kept if d not in dims]
    if missing and not plain_one:
        expected = source.instances.kept_instances(kept)
        raise StageError(f"rule {name}: {helper}: gathering along {', '.join(along)} keeps "
                         f"{', '.join(kept)}, and this stage's instances have no {missing[0]!r} (expected "
                         f"instances={expected})")
