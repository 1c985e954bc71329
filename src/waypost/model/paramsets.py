"""An experiment's parameter set as its points.

An experiment has at most one set of points (the instances of the stages
whose rule says ``instances=wp.grid``), one of:

- ``grid``: every combination of its axes' values (``grid_points``);
- ``zip``: lists of one length, a point per position (Maestro's
  ``global.parameters``);
- ``table``: a CSV file, a point per row, its columns the parameters (a
  column headed ``instance`` names the points); the file is read, relative
  to the config file's directory, whenever the config is;
- ``sample``: ``n`` points drawn at random with a ``seed``, each parameter
  from a range (``uniform``, ``loguniform``) or a list (``choice``).

Each gives instance name → the point's values (parameter → value), in
order. A point is named as a grid point is, by each parameter and its value
joined by ``-`` in the order the parameters are written (``mesh8-rep1``), so
a point keeps its name, directory and results whichever set makes it and
however the set grows. A parameter whose name ends in a digit is joined to
its value by ``.`` (``V1.0.25``); the experiment's ``labels`` write a
parameter's part as Maestro's ``label`` does (``SIZE.%%``: ``SIZE.10``). Whatever can't make points is one ConfigError naming
the file (the config's, or the table's, and its line) and the key.

A sample is reproducible: its draws use ``random.Random(seed).random()``
alone, the one method whose sequence for a seed Python guarantees to keep
across its versions (the ``random`` module's documentation, "Notes on
Reproducibility"); each point draws one number per parameter, in the order
written, and a point drawn again is drawn anew, so the first ``n`` points of
a seed are the same for any larger ``n``.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import random
import re

from waypost.model.errors import ConfigError
from waypost.model.layout import NAME_RULE, is_valid_name

#: The keys of an experiment that make its points, at most one of them.
SETS = ("grid", "zip", "table", "sample")
PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INSTANCE_COLUMN = "instance"   # a table's column that names its points
LABEL_VALUE = "%%"   # where a label (``labels``) puts the parameter's value

#: A stage's settings that steer the engine, not the step: not passed to it,
#: not hashed, and no parameter's name (a point's values join its settings).
ENGINE_KEYS = ("policy", "worker", "resources", "retention")

#: The most points one grid may have.
MAX_POINTS = 1_000_000

NAME_PART = re.compile(r"[A-Za-z0-9._-]+")


def round6(value: float) -> float:
    """``value`` rounded to 6 significant digits (a grid's spaced values)."""
    if value == 0:
        return 0.0
    return round(value, 5 - math.floor(math.log10(abs(value))))


def axis_values(spec, where: str) -> list:
    """One grid axis's values: its list, or ``{from, to, count}`` evenly
    spaced (both ends included; whole numbers when both ends are, else
    rounded to 6 significant digits). ConfigError (at ``where``) when they
    repeat."""
    if isinstance(spec, list):
        values = list(spec)
    else:
        first, last, count = spec["from"], spec["to"], spec["count"]
        whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (first, last))
        step = (last - first) / (count - 1) if count > 1 else 0
        values = [first if i == 0 else last if i == count - 1 else
                  round(first + i * step) if whole else round6(first + i * step) for i in range(count)]
        if len(set(values)) < count:
            limit = (f"at most {abs(last - first) + 1} whole numbers lie between them" if whole else
                     "they are rounded to 6 significant digits")
            raise ConfigError(f"{where}: {count} values from {first} to {last} repeat ({limit}): "
                              "expected a smaller count, or other ends")
    seen: dict[str, object] = {}
    for value in values:
        text = _value_text(value)
        if text in seen:
            raise ConfigError(f"{where}: {seen[text]!r} and {value!r} make the same instance name part {text!r}")
        seen[text] = value
    return values


def _value_text(value) -> str:
    return str(value)


def grid_points(grid: dict, where: str, labels: dict | None = None) -> dict[str, dict]:
    """A grid's points, in order (the first axis slowest): instance name
    (``nu0.01-amp0.5``: each axis and its value, joined by ``-``) → the
    point's values. ConfigError naming ``where`` and the key when values
    repeat, a range is bad or a name can't be a directory name."""
    axes = {}
    for name, spec in grid.items():
        if name in ENGINE_KEYS:
            raise ConfigError(f"{where}.{name}: {name!r} is one of waypost's stage settings "
                              f"({', '.join(ENGINE_KEYS)}): name the axis otherwise")
        values = axis_values(spec, f"{where}.{name}")
        for value in values:
            part = name_part(name, value, labels)
            if not NAME_PART.fullmatch(part):
                raise ConfigError(f"{where}.{name}: the value {value!r} makes the instance name part {part!r}, "
                                  f"which is not a valid name ({NAME_RULE})")
        axes[name] = values
    size = math.prod(len(v) for v in axes.values())
    if size > MAX_POINTS:
        raise ConfigError(f"{where}: {size:,} points; a grid has at most {MAX_POINTS:,}")
    names = list(axes)
    return {"-".join(name_part(n, v, labels) for n, v in zip(names, combo)): dict(zip(names, combo))
            for combo in itertools.product(*axes.values())}


def points_of(experiment: dict, where: str, base: str) -> dict[str, dict] | None:
    """The points of an experiment's parameter set, None without one
    (``where``: the file and the experiment's key, for messages; ``base``:
    the config file's directory, a table's path is relative to it)."""
    given = [key for key in SETS if experiment.get(key) is not None]
    if len(given) > 1:
        raise ConfigError(f"{where}: {' and '.join(given)}: an experiment has one parameter set "
                                  f"(one of {', '.join(SETS)})")
    if not given:
        return None
    kind = given[0]
    spec, at = experiment[kind], f"{where}.{kind}"
    labels = _labels(experiment.get("labels"), f"{where}.labels")
    if kind == "grid":
        found = grid_points(spec, at, labels)
    elif kind == "zip":
        found = zip_points(spec, at, labels)
    elif kind == "table":
        found = table_points(spec, at, base, labels)
    else:
        found = sample_points(spec, at, labels)
    unknown = sorted(set(labels) - {name for values in found.values() for name in values})
    if unknown:
        raise ConfigError(f"{where}.labels: {', '.join(unknown)}: not a parameter of its {kind}")
    return found


def _labels(labels, where: str) -> dict[str, str]:
    """An experiment's ``labels``: parameter → how its part of a point's
    name is written, ``%%`` standing for the value (Maestro's ``label``)."""
    if labels is None:
        return {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) and LABEL_VALUE in v for v in labels.values()):
        raise ConfigError(f"{where}: expected parameter → a label with {LABEL_VALUE} where the value goes "
                          f"(SIZE.{LABEL_VALUE})")
    return {_parameter(name, f"{where}.{name}"): label for name, label in labels.items()}


def name_part(name: str, value, labels: dict | None = None) -> str:
    """A parameter's part of a point's name: its label with the value for
    ``%%`` when it has one; else the name and the value, joined by ``.``
    when the name ends in a digit (``V1.0.25``, never ``V10.25``, which
    could be ``V1`` = ``0.25`` or ``V10`` = ``.25``), else written together
    (``nu0.01``)."""
    text = _value_text(value)
    label = (labels or {}).get(name)
    if label:
        return label.replace(LABEL_VALUE, text)
    return f"{name}.{text}" if name[-1:].isdigit() else f"{name}{text}"


def _parameter(name, where: str) -> str:
    if not isinstance(name, str) or not PARAMETER.fullmatch(name):
        raise ConfigError(f"{where}: {name!r} can't name a parameter (expected a word: letters, digits "
                                  "and '_', not starting with a digit)")
    if name in ENGINE_KEYS or name == INSTANCE_COLUMN:
        raise ConfigError(f"{where}: {name!r} is one of waypost's own words ("
                                  f"{', '.join((*ENGINE_KEYS, INSTANCE_COLUMN))}): name the parameter otherwise")
    return name


def name_of(values: dict, labels: dict | None = None) -> str:
    """A point's instance name: each parameter's part (``name_part``), joined by ``-``."""
    return "-".join(name_part(key, value, labels) for key, value in values.items())


def named(rows, what, labels: dict | None = None) -> dict[str, dict]:
    """Instance name → values of each (name, values) of ``rows`` (a None
    name: made from the values); ``what(i)``: where the i-th row is written.
    ConfigError on a name that is not valid, or a point named twice."""
    found: dict[str, tuple[int, dict]] = {}
    for i, (name, values) in enumerate(rows):
        name = name_of(values, labels) if name is None else name
        if not is_valid_name(name):
            raise ConfigError(f"{what(i)}: the point {values} makes the instance name {name!r}, which is "
                                      f"not a valid name ({NAME_RULE}, no '..')")
        if name in found:
            raise ConfigError(f"{what(i)}: the point {name} again (first at {what(found[name][0])}): "
                                      "each point once")
        found[name] = (i, values)
        if len(found) > MAX_POINTS:
            raise ConfigError(f"{what(i)}: more than {MAX_POINTS:,} points")
    return {name: values for name, (_, values) in found.items()}


# --- zip ---------------------------------------------------------------------

def zip_points(spec: dict, where: str, labels: dict | None = None) -> dict[str, dict]:
    """A point per position of lists of one length."""
    lists = {_parameter(name, f"{where}.{name}"): values for name, values in spec.items()}
    lengths = {name: len(values) if isinstance(values, list) else None for name, values in lists.items()}
    if None in lengths.values() or len(set(lengths.values())) > 1 or not lists:
        shown = ", ".join(f"{name} {'not a list' if n is None else n}" for name, n in lengths.items())
        raise ConfigError(f"{where}: lists of one length are zipped, a point per position; these are: "
                                  f"{shown or 'none'}")
    rows = [(None, dict(zip(lists, combo))) for combo in zip(*lists.values())]
    return named(rows, lambda i: f"{where} (position {i + 1})", labels)


# --- table -------------------------------------------------------------------

# A number as a table's cell writes one: digits, a point, an exponent (not
# Python's ``1_000``, ``inf`` or ``nan``, which stay text).
_WHOLE = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def cell_value(text: str):
    """A CSV cell's value: a whole number, a number, or the text."""
    bare = text.strip()
    if _WHOLE.fullmatch(bare):
        return int(bare)
    if _NUMBER.fullmatch(bare):
        value = float(bare)
        return value if math.isfinite(value) else text
    return text


def table_points(spec, where: str, base: str, labels: dict | None = None) -> dict[str, dict]:
    """A point per row of a CSV file: ``spec`` its path, or ``{file,
    columns}`` (``columns``: the parameters, for a file without a header
    line)."""
    file, columns = (spec, None) if isinstance(spec, str) else (spec.get("file"), spec.get("columns"))
    path = os.path.normpath(os.path.join(base, file)) if base else file
    lines = _csv_lines(path, where)
    if columns is None:
        if not lines:
            raise ConfigError(f"{where}: {path}: empty (expected a header line naming the columns, then "
                                      "a row per point)")
        (first, header), lines = lines[0], lines[1:]
        at = f"{path}: line {first}"
    else:
        header, at = list(columns), f"{where}.columns"
    header = [str(c).strip() for c in header]
    _check_header(header, at)
    if not lines:
        raise ConfigError(f"{where}: {path}: no rows (a point per row)")
    rows = [_row_point(header, row, f"{path}: line {number}") for number, row in lines]
    return named(rows, lambda i: f"{path}: line {lines[i][0]}", labels)


def _csv_lines(path: str, where: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of each line of a CSV file that has a value."""
    try:
        with open(path, newline="") as f:
            return [(n, row) for n, row in enumerate(csv.reader(f), 1) if any(cell.strip() for cell in row)]
    except FileNotFoundError:
        raise ConfigError(f"{where}: {path}: file not found (a table's path is relative to the config "
                                  "file's directory)") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{where}: {path}: can't be read as CSV: {exc}") from None


def _check_header(header: list[str], at: str) -> None:
    """A table's columns: each named once, each a parameter (or the instance's name)."""
    seen = set()
    for name in header:
        if name in seen:
            raise ConfigError(f"{at}: the column {name!r} is named twice")
        seen.add(name)
        if name != INSTANCE_COLUMN:
            _parameter(name, at)


def _row_point(header: list[str], row: list[str], at: str) -> tuple[str | None, dict]:
    """A row's (instance name or None, values): a value in every column."""
    if len(row) != len(header):
        raise ConfigError(f"{at}: {len(row)} values, and {len(header)} columns ({', '.join(header)})")
    cells = dict(zip(header, (cell.strip() for cell in row)))
    empty = next((name for name, text in cells.items() if not text), None)
    if empty:
        raise ConfigError(f"{at}: no value in the column {empty!r}")
    name = cells.pop(INSTANCE_COLUMN, None)
    return name, {key: cell_value(text) for key, text in cells.items()}


# --- sample ------------------------------------------------------------------

DRAWS_PER_POINT = 100   # a sample gives up when its points repeat this much (too few values to draw from)


def _range(spec, where: str, positive: bool = False) -> tuple:
    if not (isinstance(spec, list) and len(spec) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in spec)
            and spec[0] < spec[1] and (not positive or spec[0] > 0)):
        raise ConfigError(f"{where}: expected [low, high], two numbers, low below high"
                                  f"{', both above 0' if positive else ''}; got {spec!r}")
    return spec[0], spec[1]


def _drawer(spec, where: str):
    """A function of a uniform number in [0, 1) giving one value of a parameter."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ConfigError(f"{where}: expected one of uniform: [low, high], loguniform: [low, high], "
                                  f"choice: [values]; got {spec!r}")
    (kind, arg), = spec.items()
    at = f"{where}.{kind}"
    if kind == "choice":
        if not isinstance(arg, list) or not arg:
            raise ConfigError(f"{at}: expected a list of values; got {arg!r}")
        return lambda u: arg[min(int(u * len(arg)), len(arg) - 1)]
    if kind not in ("uniform", "loguniform"):
        raise ConfigError(f"{where}: unknown kind {kind!r} (expected uniform, loguniform or choice)")
    low, high = _range(arg, at, positive=kind == "loguniform")
    whole = all(isinstance(v, int) for v in (low, high))   # whole ends: whole numbers (both ends included)
    if kind == "uniform":
        if whole:
            return lambda u: low + min(int(u * (high - low + 1)), high - low)
        return lambda u: round6(low + u * (high - low))
    a, b = math.log(low), math.log(high)
    return lambda u: min(max(round(math.exp(a + u * (b - a))), low), high) if whole \
        else round6(math.exp(a + u * (b - a)))


def sample_points(spec: dict, where: str, labels: dict | None = None) -> dict[str, dict]:
    """``n`` distinct points drawn with ``seed`` (see the module's docstring)."""
    n, seed, parameters = spec.get("n"), spec.get("seed"), spec.get("parameters")
    for key, value in (("n", n), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "n" else 0):
            raise ConfigError(f"{where}.{key}: expected a whole number{' above 0' if key == 'n' else ''}; "
                                      f"got {value!r}")
    if n > MAX_POINTS:
        raise ConfigError(f"{where}.n: {n:,} points; a sample has at most {MAX_POINTS:,}")
    if not isinstance(parameters, dict) or not parameters:
        raise ConfigError(f"{where}.parameters: expected parameter → uniform: [low, high], "
                                  "loguniform: [low, high] or choice: [values]")
    drawers = {_parameter(name, f"{where}.parameters.{name}"): _drawer(s, f"{where}.parameters.{name}")
               for name, s in parameters.items()}
    rng = random.Random(seed)
    found: dict[str, dict] = {}
    for _ in range(n * DRAWS_PER_POINT):
        values = {name: draw(rng.random()) for name, draw in drawers.items()}
        name = name_of(values, labels)
        if not is_valid_name(name):
            raise ConfigError(f"{where}: the point {values} makes the instance name {name!r}, which is "
                                      f"not a valid name ({NAME_RULE}, no '..')")
        found.setdefault(name, values)
        if len(found) == n:
            return found
    raise ConfigError(f"{where}: {len(found)} distinct points in {n * DRAWS_PER_POINT} draws, and n is {n}: "
                              "expected a smaller n, or more values to draw from")
