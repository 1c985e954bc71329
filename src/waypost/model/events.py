"""Snakemake's job events, written and read in one place.

A Snakemake run started with ``snakemake_args(path)`` has waypost's logger
plugin (``snakemake_logger_plugin_waypost``) append what Snakemake reports
through its logger-plugin interface to ``path``, one JSON line per event:

- ``job_info`` — a job planned (in a dry run) or started: ``jobid``,
  ``rule``, ``wildcards``, ``reason``, ``checkpoint``;
- ``job_error`` — a job that failed: ``jobid``, ``rule``, ``message``
  (for a Slurm job, its state), ``external_jobid``;
- ``job_finished`` — ``jobid``;
- ``run_info`` — the run's job counts by rule (``stats``).

The planner adds its own (``note``): ``set_changed`` — a stage made from a
set of instances that changed (``stage``, ``change``), since Snakemake's
reason for that job is only "forced"; ``own_triggers`` — in ``waypost
plan``'s dry run (``OWN_TRIGGERS_ENV``), what a recorded job of a rule in
its own layout would be run with now (``planning.owntriggers``).
``waypost plan`` and ``waypost cron`` read these, never Snakemake's text.
"""

from __future__ import annotations

import json
import os

EVENTS_ENV = "WAYPOST_EVENTS"
# Set in ``waypost plan``'s dry run: report ``OWN_TRIGGERS`` events.
OWN_TRIGGERS_ENV = "WAYPOST_OWN_TRIGGERS"
OWN_TRIGGERS = "own_triggers"
PLUGIN = "waypost"


def snakemake_args(path: str) -> list[str]:
    """The options that make a Snakemake run report its events to ``path``."""
    return ["--logger", PLUGIN, f"--logger-{PLUGIN}-events", path]


def path_from_env() -> str | None:
    return os.environ.get(EVENTS_ENV) or None


def _files(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def from_record(record) -> dict | None:
    """The event a Snakemake log record carries, as waypost keeps it; None
    for a record that is no job event."""
    kind = getattr(record, "event", None)
    kind = str(kind) if kind is not None else None
    if kind == "job_info":
        return {"event": kind, "jobid": getattr(record, "jobid", None), "rule": getattr(record, "rule_name", None),
                "wildcards": {str(k): str(v) for k, v in (getattr(record, "wildcards", None) or {}).items()},
                "reason": str(getattr(record, "reason", "") or ""),
                "checkpoint": bool(getattr(record, "is_checkpoint", False)),
                "output": _files(getattr(record, "output", None))}
    if kind == "job_error":
        aux = getattr(record, "aux", None) or {}
        return {"event": kind, "jobid": getattr(record, "jobid", None), "rule": getattr(record, "rule_name", None),
                "message": str(getattr(record, "rule_msg", "") or ""),
                "external_jobid": aux.get("external_jobid") if isinstance(aux, dict) else None,
                "output": _files(getattr(record, "output", None))}
    if kind == "job_finished":
        return {"event": kind, "jobid": getattr(record, "job_id", None)}
    if kind == "run_info":
        stats = getattr(record, "stats", None) or {}
        return {"event": kind, "stats": {str(k): v for k, v in stats.items() if isinstance(v, int)}}
    return None


def append(path: str, event: dict) -> None:
    """One event, as one line written at once (writers in several threads
    or processes don't interleave)."""
    line = (json.dumps(event, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def note(kind: str, **fields) -> None:
    """An event of waypost's own planner, when this run reports its events."""
    path = path_from_env()
    if path:
        append(path, {"event": kind, **fields})


def read(path: str) -> list[dict]:
    """The events in ``path`` (none when it isn't there); a torn last line is skipped."""
    found = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and "event" in event:
                    found.append(event)
    except FileNotFoundError:
        pass
    return found


def jobs(found: list[dict]) -> list[dict]:
    """The jobs of a run (``job_info``), one per job id, in order; not the
    target rule ``all``."""
    seen, out = set(), []
    for event in found:
        if event["event"] == "job_info" and event.get("jobid") not in seen and event.get("rule") != "all":
            seen.add(event.get("jobid"))
            out.append(event)
    return out


def errors(found: list[dict]) -> list[dict]:
    """The jobs that failed (``job_error``)."""
    return [e for e in found if e["event"] == "job_error"]


def counts(found: list[dict]) -> dict[str, int]:
    """Jobs per rule, as the run's first ``run_info`` says (no ``total``, no ``all``)."""
    for event in found:
        if event["event"] == "run_info":
            return {k: v for k, v in event["stats"].items() if k not in ("total", "all")}
    return {}
