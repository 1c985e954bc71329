"""A prepared config's type: the user's keys with their defaults
(``Prepared``, a plain mapping) and what ``waypost.model.config.prepare``
works out from them beside it (``Derived``: the workflow's axis, each
experiment's points)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Axis:
    """The per-experiment axis a workflow names: ``word`` for one value
    (``pair``: the ``--pair`` option, the ``per_pair`` overrides, the
    ``{pair}`` wildcard), ``key`` for an experiment's list of them."""
    word: str
    key: str

    @property
    def per(self) -> str:
        return f"per_{self.word}"

    @classmethod
    def of(cls, word: str | None, key: str | None = None) -> Axis | None:
        if not word:
            return None
        return cls(word, key or word + "s")


@dataclass(frozen=True)
class Derived:
    """What ``prepare`` works out from a config, kept beside it rather than
    inside the user's keys: the workflow's ``axis`` (None: it has none) and
    each experiment's ``points`` (experiment → instance name → the point's
    values, in order; only the experiments with a parameter set). Every
    process that needs them prepares the config itself (a cluster job's
    Snakemake re-reads the Snakefile and the config files; the CLI and cron
    load them with the workflow's facts): nothing of it is written anywhere."""
    axis: Axis | None = None
    points: Mapping[str, Mapping[str, dict]] = field(default_factory=dict)
    #: waypost's keys were under ``waypost:`` (or there were none): the
    #: engine's schema alone is theirs (``waypost_config``).
    in_section: bool = False
    #: The config files read, for messages (``with_reuse_files``).
    source: str = ""

    def points_of(self, experiment: str) -> Mapping[str, dict]:
        """An experiment's points (empty without a parameter set)."""
        return self.points.get(experiment) or {}

    def parameters(self, experiment: str) -> tuple[str, ...]:
        """An experiment's parameters (of its points' set), in order."""
        found = self.points.get(experiment)
        return tuple(next(iter(found.values()))) if found else ()

    def axis_words(self) -> dict[str, str] | None:
        """The axis as JSON holds it (``waypost status --json``): word and key."""
        return {"word": self.axis.word, "key": self.axis.key} if self.axis else None


class Prepared(dict):
    """A prepared config: the user's keys with their defaults (a plain
    mapping: JSON writes it as it did), and ``derived`` beside them. Copies
    (``copy.deepcopy``, ``with_derived``) keep ``derived``; ``dict(...)``
    doesn't."""

    derived: Derived

    def __init__(self, config: Mapping, derived: Derived):
        super().__init__(config)
        self.derived = derived


def derived(config: Mapping) -> Derived:
    """The derived values of a prepared config (none for a plain dict: no
    axis, no points)."""
    return getattr(config, "derived", None) or _NOTHING_DERIVED


_NOTHING_DERIVED = Derived()


def with_derived(config: Mapping, like: Mapping) -> Prepared:
    """``config`` carrying the derived values of ``like``."""
    return Prepared(config, derived(like))


# libyaml's loader where PyYAML has it (its wheels do): 5-10× faster than the


def axis_words(config: Mapping) -> tuple[str, str]:
    """(one, many) of a prepared config's axis, for messages and headings."""
    axis = derived(config).axis
    return (axis.word, axis.key) if axis else ("axis value", "axis values")
