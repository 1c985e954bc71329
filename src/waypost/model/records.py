"""The records waypost writes, each built in one place.

- ``manifest(...)`` — ``_manifest.json``: a stage's last series, written last.
- ``attempt(...)`` — one attempt in a manifest or a running marker.
- ``marker(...)`` — ``_running.json``: an attempt at work, or the series a
  scheduler's job left open.

Their layout is ``schemas/records.schema.json`` (version ``SCHEMA_VERSION``),
strict: every field is named there. Reading is more tolerant
(``manifest.parse`` and ``schemas/manifest.schema.json``): older manifests,
and ones written by hand or by other tools, are read as they are. With
``WAYPOST_CHECK_RECORDS=1`` (the test suite sets it) every record is checked
against the schema as it is written, and a record that does not fit stops
its writer (RecordError): a test fails where a field went astray.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, TypedDict, TypeGuard, TypeVar

from waypost import __version__, with_site
from waypost.model.errors import WaypostError

SCHEMA_VERSION = 1
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas", "records.schema.json")
CHECK_ENV = "WAYPOST_CHECK_RECORDS"


class RecordError(WaypostError, ValueError):
    """A record waypost was about to write does not fit its schema."""


class Attempt(TypedDict, total=False):
    number: int
    series: int
    action: str
    state: str | None
    exit_code: int | None
    signal: int | None
    checks: dict
    check_exit_codes: dict
    decision: dict | None
    start: str
    end: str | None
    duration_s: float | None
    host: str | None
    run: str | None
    scheduler: str | None
    scheduler_job_id: str | None
    runtime_limit_s: float | None
    command: str | None
    script: str
    workspace: str
    log: str | None
    worker: dict
    why: str
    error: str
    how: str
    settings: dict
    config_hash: str
    resumes: dict
    wrote: list[str]
    interrupted_by: str


class StepGroup(TypedDict):
    pgid: int
    start: int | None
    kill_grace: float


class _MarkerBase(TypedDict):
    schema: int
    pid: int | None
    host: str | None
    run: str | None
    series: int
    series_base: int
    outputs: list[str]
    scheduler: str | None
    scheduler_job_id: str | None
    attempts: list[Attempt]


class Marker(_MarkerBase, total=False):
    step_group: StepGroup
    outputs_dir: str
    before: list[str]


class Manifest(TypedDict, total=False):
    schema: int
    experiment: str
    pair: str
    stage: str
    instance: str | None
    state: str
    created: str
    run: str | None
    attempts: list[Attempt]
    outputs: list[dict]
    inputs: list[dict]
    settings: dict
    config_hash: str
    code_version: str
    reused_from: str | None
    adopted: bool
    waypost_version: str
    # besides, as they apply (manifest.schema.json has each):
    reused_manifest: Manifest | None   # the source's own record, kept with a reused copy
    source_created: str | None
    adopted_by: str | None
    note: str | None
    provisional: bool | None   # made over parents that did not succeed
    given_up: bool | None
    next_series_after: str | None
    series_base: int
    reason: str | None
    triggers: dict | None   # a rule in its own layout: what Snakemake's rerun triggers compare
    goes_on: dict | None    # cancelled from outside: the series the next run goes on with in place
    stopped_run: str | None  # a stop cue ended the series and its run: why


#: a scheduler's job: (the scheduler's name, as ``waypost.scheduler.by_name``
#: knows it, the job's id)
JobRef = tuple[str, str]
#: the keys under which attempts and running markers name the scheduler, and
#: its job, their runner ran in
SCHEDULER_KEY, JOB_ID_KEY = "scheduler", "scheduler_job_id"
#: where records written before schedulers had names kept the job: Slurm's
LEGACY_JOB_KEY, LEGACY_SCHEDULER = "slurm_job_id", "slurm"


def job_fields(job: JobRef | None) -> dict[str, str | None]:
    """A record's fields naming ``job`` (both None: it ran in no scheduler's job)."""
    return {SCHEDULER_KEY: job[0] if job else None, JOB_ID_KEY: str(job[1]) if job else None}


def job_of(record: Mapping[str, Any]) -> JobRef | None:
    """The scheduler's job an attempt or a running marker names, if any; a
    record from before schedulers had names (only ``slurm_job_id``) names
    a Slurm job."""
    if record.get(JOB_ID_KEY):
        return str(record.get(SCHEDULER_KEY) or LEGACY_SCHEDULER), str(record[JOB_ID_KEY])
    legacy = record.get(LEGACY_JOB_KEY)
    return (LEGACY_SCHEDULER, str(legacy)) if legacy else None


def upgrade(record: dict) -> dict:
    """An older record read as this waypost writes it, in place: a running
    marker or manifest and its attempts that name a Slurm job under
    ``slurm_job_id`` name it under ``scheduler``/``scheduler_job_id``, so
    that a series going on from one writes records of this layout."""
    for one in (record, *(a for a in record.get("attempts") or [] if isinstance(a, dict))):
        if LEGACY_JOB_KEY in one:
            job = job_of(one)
            del one[LEGACY_JOB_KEY]
            one.update(job_fields(job))
    return record


def attempt(*, number: int, series: int, action: str, start: str, run: str | None, host: str | None,
            job: JobRef | None, command: str | None, worker: dict, log: str | None = None,
            script: str | None = None, runtime_limit_s: float | None = None, state: str | None = None,
            exit_code: int | None = None, end: str | None = None, duration_s: float | None = None,
            why: str | None = None, error: str | None = None, how: str | None = None,
            settings: dict | None = None, config_hash: str | None = None, resumes: dict | None = None) -> Attempt:
    """An attempt, open (``state`` None) until its end is filled in.
    ``job``: the scheduler's job its runner ran in (``job_fields``)."""
    record: Attempt = {
        "number": number, "series": series, "action": action, "state": state, "exit_code": exit_code,
        "signal": None, "checks": {}, "decision": None, "start": start, "end": end, "duration_s": duration_s,
        "host": host, "run": run, **job_fields(job),
        "runtime_limit_s": runtime_limit_s, "command": command, "workspace": ".", "log": log, "worker": worker,
    }
    for key, value in (("script", script), ("why", why), ("error", error), ("how", how), ("settings", settings),
                       ("config_hash", config_hash), ("resumes", resumes)):
        if value is not None:
            record[key] = value
    return record


def marker(*, pid: int | None, host: str | None, run: str | None, series: int, series_base: int,
           outputs: list[str], job: JobRef | None, attempts: list[Attempt],
           step_group: StepGroup | None = None) -> Marker:
    """A running marker: ``pid``/``host`` the runner at work (None: a series
    a scheduler's job left, for the next job to go on with); ``step_group`` its
    step's process group on that host, while a step runs (``stepgroup.record``)."""
    record: Marker = {"schema": SCHEMA_VERSION, "pid": pid, "host": host, "run": run, "series": series,
                      "series_base": series_base, "outputs": outputs,
                      **job_fields(job), "attempts": attempts}
    if step_group is not None:
        record["step_group"] = step_group
    return record


def manifest(*, experiment: str, pair: str, stage: str, instance: str | None, state: str, created: str,
             attempts: list[Attempt], outputs: list[dict], inputs: list[dict], settings: dict,
             config_hash: str, code_version: str, reused_from: str | None = None, adopted: bool = False,
             run: str | None = None, **more: Any) -> Manifest:
    """A manifest; ``more``: the fields that apply to this one (see Manifest)."""
    record: Manifest = {
        "schema": SCHEMA_VERSION, "experiment": experiment, "pair": pair, "stage": stage, "instance": instance,
        "state": state, "created": created, "run": run, "attempts": attempts, "outputs": outputs,
        "inputs": inputs, "settings": settings, "config_hash": config_hash, "code_version": code_version,
        "reused_from": reused_from, "adopted": adopted, "waypost_version": __version__,
    }
    record.update({k: v for k, v in more.items() if v is not None})   # type: ignore[typeddict-item]
    return record


_validators: dict[str, Any] = {}


def made_here(data: Manifest | None) -> TypeGuard[Manifest]:
    """Does a manifest say its stage succeeded, made here (not reused, not
    adopted): the only kind whose recorded inputs say what it was made from?"""
    return data is not None and data.get("state") == "SUCCESS" and not data.get("reused_from") \
        and not data.get("adopted")


def _validator(kind: str):
    if kind not in _validators:
        with_site()   # jsonschema is a site-package
        import jsonschema
        with open(SCHEMA_FILE) as f:
            schema = json.load(f)
        _validators[kind] = jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{kind}"})
    return _validators[kind]


def problems(kind: str, record: Mapping[str, Any]) -> list[str]:
    """Where ``record`` does not fit the schema of ``kind`` (``manifest``,
    ``marker``, ``attempt``): one line each, empty when it fits."""
    return [f"{'.'.join(map(str, e.absolute_path)) or kind}: {e.message}"
            for e in sorted(_validator(kind).iter_errors(record), key=lambda e: list(map(str, e.path)))]


_Record = TypeVar("_Record", bound=Mapping[str, Any])


def checked(kind: str, record: _Record, where: str) -> _Record:
    """``record``, checked against its schema when ``WAYPOST_CHECK_RECORDS``
    is set (RecordError naming ``where`` and each problem); as it is otherwise."""
    if os.environ.get(CHECK_ENV):
        found = problems(kind, record)
        if found:
            raise RecordError(f"{where}: the {kind} waypost was about to write does not fit "
                              f"{os.path.basename(SCHEMA_FILE)}: " + "; ".join(found[:5]))
    return record
