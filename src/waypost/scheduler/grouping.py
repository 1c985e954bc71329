"""How ready jobs share submissions, whatever the scheduler: each alone,
packed into job arrays, or run one after another in bundles.

A worker class with ``pack: N`` (workers.yaml) has up to N ready jobs of one
rule with the same request submitted as one job array, where the scheduler
has arrays (``base.Scheduler.arrays``; where it has none, each is submitted
alone); one with ``bundle: N`` has up to N of them run in one job, one after
another (a bundle wins over a pack). A group of one is submitted alone.
Pure logic over opaque jobs: the executor says what each job asks
(``Ask``) and submits what ``plan`` returns, in order.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, NamedTuple

SINGLE, ARRAY, BUNDLE = "single", "array", "bundle"


class Ask(NamedTuple):
    """One ready job and how it may share a submission: ``kin`` is what jobs
    sharing one must have in common (the rule, the request); ``pack`` and
    ``bundle`` its class's sizes (1: none)."""

    job: Any
    kin: Hashable
    pack: int = 1
    bundle: int = 1


class Submission(NamedTuple):
    """One submission: ``kind`` (``SINGLE``, ``ARRAY`` or ``BUNDLE``) and
    its jobs (one for ``SINGLE``; a bundle's first leads it)."""

    kind: str
    jobs: list


def plan(asks: Iterable[Ask], arrays: bool) -> list[Submission]:
    """The submissions for these ready jobs: the lone ones first, in order,
    then each pack's and each bundle's groups, cut to their size."""
    singles: list[Submission] = []
    groups: dict[tuple, list] = {}
    for ask in asks:
        if ask.bundle >= 2:
            key = (BUNDLE, ask.kin, max(ask.pack, ask.bundle))
        elif arrays and ask.pack >= 2:
            key = (ARRAY, ask.kin, ask.pack)
        else:
            singles.append(Submission(SINGLE, [ask.job]))
            continue
        groups.setdefault(key, []).append(ask.job)
    grouped = []
    for kind in (ARRAY, BUNDLE):
        for (of, _, size), jobs in groups.items():
            if of != kind:
                continue
            for start in range(0, len(jobs), size):
                chunk = jobs[start:start + size]
                grouped.append(Submission(kind if len(chunk) > 1 else SINGLE, chunk))
    return singles + grouped
