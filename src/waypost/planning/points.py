"""A study's points as a stage's instances, over named dimensions.

An experiment's parameter set (``grid``, ``zip``, ``table`` or ``sample``
in the config: ``waypost.model.paramsets``) makes its points: instance name
(``mesh8-rep1``) → the point's values. ``wp.grid`` is those points as a
stage's instances (``instances=wp.grid``), and each parameter is one of
their dimensions, as a ``wp.dims`` dimension is: its value is a
placeholder in the rule's ``wp.stage`` paths and a param (``wp.dim``), and
``wp.each(stage, file, over="rep")`` gathers along it.

``wp.grid.per("mesh")`` is one instance per value of some parameters (of
the values the points have, in their order): named as a point is by those
parameters (``mesh8``; with the experiment's ``labels``), a stage with them gathers, along the other
parameters, the points with its values. A dimension's value is the value's
text, as in the instance name (``8``; ``wp.setting("mesh")`` is the
number).

The points are the config's (``Resolver.points``); a workflow read for its
rules alone (``waypost.model.graph``) has none, and its points' dimensions are
then not known (``known``): nothing is checked against them.
"""

from __future__ import annotations

from waypost.model import layout, paramsets
from waypost.planning.fanout import FanoutError, Named
from waypost.planning.reading import in_one_line
from waypost.planning.stagegraph import StageError


def _text(value) -> str:
    """A value as its instance names write it (``waypost.model.paramsets.name_part``)."""
    return str(value)


class Points(Named):
    """``wp.grid``: every point of an experiment's parameter set."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self._combos: dict[str, dict[str, dict]] = {}

    def __repr__(self) -> str:
        return "wp.grid"

    def claim(self, rule: str) -> None:
        pass   # (one for every rule: its messages name none)

    def _points(self, experiment: str) -> dict[str, dict]:
        return self.pipeline.resolver.points.get(experiment) or {}

    def __call__(self, experiment: str, pair: str | None = None) -> list[str]:
        return self.pipeline.resolver.grid(experiment)   # (an experiment without points: said at wp.finish())

    @property
    def known(self) -> bool:
        return any(self.pipeline.resolver.points.values())

    def labels(self, experiment: str) -> dict[str, str]:
        """How the experiment's point names write its parameters (its ``labels``)."""
        return (self.pipeline.resolver.config["experiments"].get(experiment) or {}).get("labels") or {}

    def dims_in(self, experiment: str) -> tuple[str, ...]:
        points = self._points(experiment)
        return tuple(next(iter(points.values()))) if points else ()

    @property
    def dims(self) -> tuple[str, ...]:
        """Every experiment's parameters (they may differ), in their order."""
        return tuple(dict.fromkeys(d for experiment in self.pipeline.resolver.points for d in self.dims_in(experiment)))

    def combinations(self, experiment: str, pair: str | None = None) -> dict[str, dict]:
        if experiment not in self._combos:
            self._combos[experiment] = {name: {key: _text(value) for key, value in values.items()}
                                        for name, values in self._points(experiment).items()}
        return self._combos[experiment]

    def kept_instances(self, kept: list[str]) -> str:
        return f"wp.grid.per({', '.join(map(repr, kept))})"

    @in_one_line
    def per(self, *parameters: str) -> Per:
        """One instance per value of these parameters (see the module's docstring)."""
        rule = self.pipeline.graph.current
        where = f"rule {rule}: " if rule else ""
        if not parameters or not all(isinstance(p, str) and p for p in parameters) \
                or len(set(parameters)) < len(parameters):
            raise StageError(f"{where}wp.grid.per{parameters!r}: expected the names of some of the points' "
                              "parameters, each once (wp.grid.per(\"size\"))")
        return Per(self, parameters, rule)


class Per(Named):
    """``wp.grid.per(...)``: one instance per value of some parameters."""

    def __init__(self, points: Points, parameters: tuple[str, ...], rule: str | None):
        self.points, self.dims, self.rule = points, tuple(parameters), rule
        self._combos: dict[str, dict[str, dict]] = {}

    def __repr__(self) -> str:
        return f"wp.grid.per({', '.join(map(repr, self.dims))})"

    def missing(self, experiment: str) -> str | None:
        """A parameter the experiment's points don't have, if one is."""
        have = self.points.dims_in(experiment)
        return next((p for p in self.dims if p not in have), None)

    def combinations(self, experiment: str, pair: str | None = None) -> dict[str, dict]:
        if experiment not in self._combos:
            found: dict[str, dict] = {}
            for values in self.points.combinations(experiment).values():
                mine = {p: values[p] for p in self.dims if p in values}
                if len(mine) < len(self.dims):
                    return {}   # (said before any job: Resolver.check_points)
                name = paramsets.name_of(mine, self.points.labels(experiment))
                if not layout.is_valid_name(name):
                    raise FanoutError(f"rule {self.rule}: {self!r}: the values {mine} make the "
                                      f"instance name {name!r}, which is not a valid name ({layout.NAME_RULE})")
                found.setdefault(name, mine)
            self._combos[experiment] = found
        return self._combos[experiment]
