"""Names → stage paths: ``{root}/{pair}/{experiment}/{stage}[/{instance}]``.

Pair first, so all work on one language pair sits together. Every name that
becomes a path component is validated here: letters, digits, ``.``, ``_`` and
``-``, starting with a letter or digit (so no ``..``, no hidden names, no
option-looking names, nothing a shell would interpret).
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

from waypost.model.errors import WaypostError
from waypost.model.locations import join  # a location below a root (a path or a URL)

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
NAME_RE = re.compile(rf"^{NAME_PATTERN}$")
NAME_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit"

# Where per-experiment funnels (the report) live: a pair slot no real pair can
# take, because names must start with a letter or digit.
ALL_PAIRS = "_all"

MANIFEST = "_manifest.json"
RUNNING = "_running.json"
LOGS = "_logs"
ATTEMPTS = ".attempts"
# In ``.attempts/<n>/`` while an archive into it is under way (the names it
# moves): an archive cut short is finished by the next one, into the same <n>.
ARCHIVING = "_archiving.json"
# Marks a stage whose outputs are placeholders of a failed or skipped stage
# (kept so a funnel could run): the next run redoes the stage.
UNFINISHED = "_unfinished"
# Marks a stage that succeeded over parents that did not (a funnel): the next
# run looks at those parents again and redoes it when one of them is redone.
PROVISIONAL = "_provisional"
# At the root: one empty file per stage on hold, named by its stage directory
# with "~" for "/" (no name holds "~"), so a planning knows them all from one
# listing: given up (its max_series spent; dated 1970) or waiting out its
# series backoff (dated when the wait ends). A slot no pair can take (see ALL_PAIRS).
HELD = "_held"
# Where ``waypost find`` caches the catalog (relative to where it runs).
CATALOG_DB = os.path.join(".waypost", "catalog.sqlite")
# Files the engine writes into a stage directory; everything else is the step's.
ENGINE_FILES = {MANIFEST, RUNNING, LOGS, ATTEMPTS, UNFINISHED, PROVISIONAL}
# On a gs:// root, beside the local copy of a directory() (a prefix of
# objects) in the mirror: the generations of the objects it was copied from.
COPY_NOTE = ".{}.generations.json"


def is_in_progress(name: str) -> bool:
    """Is a file name one of waypost's own beside a job's files: one being
    written or fetched (``.tmp-``), or a copy's note (``COPY_NOTE``)?
    Never a job's output, side file or leftover."""
    return name.startswith(".tmp-") or (name.startswith(".") and name.endswith(COPY_NOTE.format("")[2:]))


class NameError_(WaypostError, ValueError):
    """A name that cannot be used as a path component."""


def is_valid_name(name: object) -> bool:
    return isinstance(name, str) and _valid(name)


@lru_cache(maxsize=1 << 16)   # the same names, asked for at every job of a planning (a study's points)
def _valid(name: str) -> bool:
    return bool(NAME_RE.match(name)) and ".." not in name


def check_name(name: object, what: str) -> str:
    if not is_valid_name(name):
        raise NameError_(f"{what} {name!r} is not a valid name (expected {NAME_RULE})")
    return name  # type: ignore[return-value]


def stage_dir(root: str, pair: str, experiment: str, stage: str, instance: str | None = None) -> str:
    parts = [check_name(pair, "pair") if pair != ALL_PAIRS else pair,
             check_name(experiment, "experiment"), check_name(stage, "stage")]
    if instance is not None:
        parts.append(check_name(instance, "instance"))
    return join(root, *parts)


#: In ``{root}/_all/{experiment}/``: which config the experiment's records
#: are made with (``waypost.snakemake``: two configs naming one experiment
#: must not overwrite each other's records without a word).
EXPERIMENT_MARK = "_experiment.json"


def experiment_mark(root: str, experiment: str) -> str:
    return join(root, ALL_PAIRS, check_name(experiment, "experiment"), EXPERIMENT_MARK)


def stage_name(pair: str, experiment: str, stage: str, *instance: str | None) -> str:
    """How messages name a stage: experiment/pair/stage[/instance] (no pair
    for a per-experiment funnel)."""
    return "/".join(part for part in (experiment, None if pair == ALL_PAIRS else pair, stage, *instance) if part)


def job_name(rule: str, wildcards: dict) -> str:
    """How messages and tables name a job of a rule in its own layout, as
    Snakemake names a job: ``rule[name=value, ...]`` (a rule without
    wildcards: its name)."""
    return rule + ("[" + ", ".join(f"{k}={v}" for k, v in wildcards.items()) + "]" if wildcards else "")


def job_instance(wildcards: dict) -> str | None:
    """The name under which a job of a rule in its own layout keeps its
    record, in its rule's stage directory (as an instance's): its wildcards'
    values in the rule's order, joined by ``__``. A value that is a name
    without ``_`` is itself; any other is ``x`` and the value with each
    character that can't be in a name (``_`` too, and a first ``.`` or
    ``-``, or a ``.`` after a ``.``) written ``_XX``, its UTF-8 bytes in hex.
    So two sets of values never share a name (``_`` is only ever an escape's
    or the separator's); one too long ends in its digest. None for a rule
    without wildcards (its one job)."""
    if not wildcards:
        return None
    name = "__".join(map(_job_value, wildcards.values()))
    if len(name) > 180:
        import hashlib
        name = name[:120] + "__" + hashlib.sha256(name.encode()).hexdigest()[:32]
    return name


def own_job(wildcards: dict, experiment: str | None) -> tuple[str, str | None]:
    """(experiment, record name) of a job of a rule in its own layout: the
    config's one ``experiment`` and every wildcard's value (``job_instance``);
    or, where the config declares several (``experiment`` None), the job's
    ``{experiment}`` wildcard's value and the other wildcards'."""
    if experiment is not None:
        return experiment, job_instance(wildcards)
    return str(wildcards["experiment"]), job_instance({k: v for k, v in wildcards.items() if k != "experiment"})


def _job_value(value) -> str:
    text = str(value)
    if "_" not in text and is_valid_name(text):
        return text
    if not text:
        return "x_"
    out, previous = ["x"], ""
    for i, char in enumerate(text):
        keep = char.isascii() and (char.isalnum() or (i and char == "-") or (i and char == "." and previous != "."))
        out.append(char if keep else "".join(f"_{b:02x}" for b in char.encode()))
        previous = char
    return "".join(out)


def held_entry(root: str, stage_dir: str) -> str:
    """The registry file (see HELD) of a stage directory under ``root``."""
    rel = stage_dir[len(root.rstrip("/")) + 1:]
    return join(root, HELD, rel.replace("/", "~"))


def stage_root(stage_dir: str, instance: str | None) -> str:
    """The root a stage directory is under (it is pair/experiment/stage[/instance] below it)."""
    parts = stage_dir.rstrip("/").split("/")
    return "/".join(parts[:-(4 if instance else 3)])
