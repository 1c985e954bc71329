"""Drift of the done jobs of rules in their own layout, for ``waypost
plan``: what Snakemake's rerun triggers compare (params, code, the set of
inputs, the software environment), as the job's record kept it when it ran
against what the workflow would run it with now (the dry run's
``own_triggers`` events, ``planning.owntriggers``). In plain mode Snakemake
reruns such a job too (``plan``'s next run says why); in presence mode this
is where the difference shows. Inputs outside the root edited since are
``inputdrift``'s."""

from __future__ import annotations

from waypost.model import events
from waypost.ops.inputdrift import dir_key


def now_of(found: list[dict]) -> dict[str, dict]:
    """A dry run's ``own_triggers`` events, by record directory."""
    return {dir_key(e["record"]): e for e in found if e.get("event") == events.OWN_TRIGGERS and e.get("record")}


def differs(data: dict, directory: str, now: dict[str, dict]) -> list[str]:
    """How a done job's record (``data``, its manifest) differs from what the
    workflow would run it with now, one line per trigger; empty when it
    doesn't, or when either side is unknown (a record of before, a job not asked)."""
    current, recorded = now.get(dir_key(directory)), data.get("triggers")
    if current is None or not isinstance(recorded, dict):
        return []
    if current.get("error"):
        return [f"its rule can't make this job now: {current['error']}"]
    triggers = current.get("triggers") or {}
    what = _params(recorded.get("params") or [], triggers.get("params") or [])
    if recorded.get("code") != triggers.get("code"):
        what.append("code: " + _code_change(triggers.get("code") or recorded.get("code") or {}))
    what += _inputs(recorded.get("inputs") or [], triggers.get("inputs") or [])
    software = _changed_keys(recorded.get("software_env") or {}, triggers.get("software_env") or {})
    if software:
        what.append("software environment: " + ", ".join(software) + " changed")
    return what


def _changed_keys(before: dict, after: dict) -> list[str]:
    return sorted(key for key in {*before, *after} if before.get(key) != after.get(key))


def _params(before: list[str], after: list[str]) -> list[str]:
    """Params as Snakemake's trigger words it: what only the record has, and
    what only now has."""
    old, new = sorted(set(before) - set(after)), sorted(set(after) - set(before))
    if not (old or new):
        return []
    return [f"params: {', '.join(old) or '(none)'} → {', '.join(new) or '(none)'}"]


def _code_change(code: dict) -> str:
    if "script" in code:
        return f"script {code['script']} changed"
    if "run" in code:
        return "the run: block changed"
    return "the shell command changed"


def _inputs(before: list, after: list) -> list[str]:
    """The set of inputs: what was added and what went."""
    old, new = set(map(str, before)), set(map(str, after))
    added, gone = sorted(new - old), sorted(old - new)
    parts = ([f"added {', '.join(added)}"] if added else []) + ([f"no longer {', '.join(gone)}"] if gone else [])
    return ["inputs: " + "; ".join(parts)] if parts else []
