"""``waypost plan``: what the next run would do and why, and which done
stages were made with other settings, code or inputs than the current ones.

The first part is Snakemake's own dry run (``snakemake -n``): its jobs and
reasons, as Snakemake reports them to waypost's logger plugin (``events``),
regrouped by experiment, pair and stage. The second (drift) reads
the manifests: presence mode never reruns a done stage because the config
or code changed, so after a mid-study fix this is where a user sees what
``waypost rerun`` could redo.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

from waypost import stores
from waypost.model import config as wconfig
from waypost.model import events, graph, layout, manifest, records
from waypost.model.diffs import resumed_work, settings_diff
from waypost.model.job import outputs_elsewhere
from waypost.ops import owndrift
from waypost.ops.inputdrift import EDITED, InputEdits
from waypost.state import lifecycle


def dry_run(profile: str, config_path: str | None, workflow_dir: str, extra: list[str],
            reading: dict | None = None) -> tuple[int, str, list]:
    """Snakemake's dry run: (its exit status, its output, its events).
    ``reading``: the options it reads the workflow with as the workflow's
    facts name them (``graph.invocation``), so that the facts it records
    serve the next command read that way without a reading of its own."""
    with tempfile.TemporaryDirectory(prefix="waypost-plan-") as tmp:
        path = os.path.join(tmp, "events.jsonl")
        cmd = [sys.executable, "-m", "snakemake", "-s", graph.snakefile_in(workflow_dir),
               "--profile", profile, "-n", *(["--configfile", config_path] if config_path else []), *extra,
               *events.snakemake_args(path)]
        env = {**os.environ, events.EVENTS_ENV: path, events.OWN_TRIGGERS_ENV: "1"}
        if reading is not None:
            env[graph.INVOCATION_ENV] = json.dumps(reading)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        return proc.returncode, proc.stdout + proc.stderr, events.read(path)


def parse_jobs(found: list[dict], axis_word: str = "pair") -> list[dict]:
    """The jobs of a dry run's events: rule, wildcards and reason (the
    workflow's axis wildcard under the engine's name, ``pair``), and the
    planner's word when a stage's set of inputs changed."""
    changed = {e.get("stage"): e.get("change") for e in found if e["event"] == "set_changed"}
    waits = {e.get("stage") for e in found if e["event"] == "reuse_waits"}
    jobs = []
    for event in events.jobs(found):
        wildcards = dict(event["wildcards"])
        if axis_word in wildcards:
            wildcards["pair"] = wildcards.pop(axis_word)
        job = {"rule": event["rule"], "wildcards": wildcards, "reason": event["reason"]}
        name = layout.stage_name(wildcards.get("pair", layout.ALL_PAIRS), wildcards.get("experiment", ""),
                                 job["rule"], wildcards.get("instance"))
        if name in changed:
            job["set_changed"] = changed[name]
        if name in waits:
            job["reuse_waits"] = True
        jobs.append(job)
    return jobs


def why(job: dict, config: dict) -> str:
    """A job's reason in the user's words."""
    w = job["wildcards"]
    reason = job["reason"]
    if w.get("experiment") in config["experiments"]:
        source = wconfig.reuse_source(config, w["experiment"], w.get("pair", layout.ALL_PAIRS), job["rule"])
        if source and job.get("reuse_waits"):
            return f"reuse from {source}, once its {job['rule']} there is made (in this run)"
        if source:
            return f"reuse from {source}"
    if job.get("set_changed"):
        return f"redo: {job['set_changed']}"
    if reason.startswith("Forced execution") and w.get("experiment") in config["experiments"]:
        stage_dir = layout.stage_dir(config["root"], w.get("pair", layout.ALL_PAIRS), w["experiment"], job["rule"],
                                     w.get("instance"))
        life = lifecycle.read(stores.store_for(stage_dir), stage_dir)
        if life.live:
            return f"an attempt is still at work ({life.live.where}): its job will not start a second"
        if life.interrupted:
            return "redo: its last attempt was interrupted (its runner is gone), whatever the files say"
        if life.next_series_due:
            return f"redo: it ended {(life.manifest or {}).get('state', 'without success')} and a funnel went on over it"
        return "forced (--forcerun / --forceall)"
    if reason.startswith("Missing output files"):
        return "outputs missing"
    if reason.startswith("Input files updated by another job"):
        return "inputs are being redone"
    if reason.startswith("Updated input files"):
        return "inputs are newer (mtime mode)"
    changed = [words for cause, words in PROVENANCE if cause in reason]
    return "; ".join(changed) if changed else reason or "?"


# Snakemake's rerun triggers other than mtime (a rule in its own layout, as
# in plain Snakemake): their reasons, in a user's words.
PROVENANCE = (("Params have changed", "its params changed since it ran"),
              ("Code has changed", "its code changed since it ran"),
              ("Set of input files has changed", "its set of inputs changed since it ran"),
              ("Software environment definition has changed", "its software environment changed since it ran"))


def reuse_held(found: list[dict]) -> list[str]:
    """The reused stages a dry run did not schedule, each waiting for a
    source this run doesn't make (``StateView.reuse_plan``), with why."""
    return list(dict.fromkeys(e["why"] for e in found if e["event"] == "reuse_held"))


# A reason's details in parentheses (an attempt's host and pid): reasons
# that differ only there are one group of a row.
DETAIL = re.compile(r"\s*\([^()]*\)")


def next_run(jobs: list[dict], config: dict) -> list[dict]:
    """One row per experiment × pair × stage, instances together: its
    ``instances``, ``why`` (its reasons, joined) and ``reasons``: one group
    per reason (``why``, ``count`` of jobs, their ``instances``), most jobs
    first; reasons that differ only in a detail in parentheses are one group
    (``why`` with ``(…)``), so 2,000 instances make a row or two, not 2,000."""
    rows: dict[tuple, dict] = {}
    for job in jobs:
        w = job["wildcards"]
        key = (w.get("experiment", ""), w.get("pair", layout.ALL_PAIRS), job["rule"])
        row = rows.setdefault(key, {"experiment": key[0], "pair": key[1], "stage": key[2],
                                    "instances": [], "why": set(), "reasons": {}})
        reason = why(job, config)
        group = row["reasons"].setdefault(DETAIL.sub(" (…)", reason), {"why": set(), "count": 0, "instances": []})
        group["why"].add(reason)
        group["count"] += 1
        if "instance" in w:
            row["instances"].append(w["instance"])
            group["instances"].append(w["instance"])
        row["why"].add(reason)
    order = {stage: i for i, stage in enumerate(config["stages"])}
    out = sorted(rows.values(), key=lambda r: (r["experiment"], r["pair"] == layout.ALL_PAIRS, r["pair"],
                                              order.get(r["stage"], 99)))
    for row in out:
        groups = []
        for shape, group in row["reasons"].items():
            reasons = group["why"]
            groups.append({**group, "why": next(iter(reasons)) if len(reasons) == 1 else shape})
        row["reasons"] = sorted(groups, key=lambda g: (-g["count"], g["why"]))
        row["why"] = "; ".join(sorted({g["why"] for g in row["reasons"]}))
    return out


def only_instances(rows: list[dict], keep) -> list[dict]:
    """next_run's rows with only the instances ``keep`` (a function of a
    list of names) returns, each group too; rows left without any dropped."""
    out = []
    for row in rows:
        instances = keep(row["instances"])
        if not instances:
            continue
        kept = set(instances)
        groups = [{**g, "instances": [i for i in g["instances"] if i in kept]} for g in row["reasons"]]
        groups = [{**g, "count": len(g["instances"])} for g in groups if g["instances"]]
        out.append({**row, "instances": instances, "reasons": groups,
                    "why": "; ".join(sorted({g["why"] for g in groups}))})
    return out


def _output_digests(tree, stage_dir: str, cache: dict) -> dict:
    if stage_dir not in cache:
        try:
            data = tree.manifest(stage_dir) or {}
        except manifest.ManifestError:
            data = {}
        cache[stage_dir] = {o["path"]: o.get("sha256") for o in data.get("outputs", [])}
    return cache[stage_dir]


def _short(code_version: str) -> str:
    return code_version[len(wconfig.CODE_PREFIX):]


def drift(config: dict, code_versions: dict[str, str], funnels: list[str],
          instances: list[str] | None = None, own_now: dict[str, dict] | None = None) -> tuple[list[dict], int]:
    """Done stages made with other settings, code or inputs than now, one row
    each (on a gs:// root: from one listing and one batch read of the
    manifests), and how many done stages recorded a code version of before
    per-stage ones (``git describe`` of the repository: not comparable, so
    not drift). ``code_versions``: stage → its code version now. Each
    instance is compared with its own settings (its ``per_instance``
    overrides, its grid values); an instance no longer of its experiment's
    grid is left out (nothing reads it). ``instances``: only those
    (names or shell patterns). A job of a rule in its own layout is compared
    by what Snakemake's rerun triggers compare (``owndrift``; ``own_now``:
    the dry run's ``own_triggers`` events, by record)."""
    rows, digests, unknown = [], {}, 0
    edits = InputEdits()   # inputs outside the root edited since, and what was made from them
    tree = stores.store_for(config["root"])
    settings_of = wconfig.step_settings_of(config)
    for experiment, pair, stage, instance, directory in _stage_dirs(config, tree, funnels, instances):
        try:
            data = tree.manifest(directory)
        except manifest.ManifestError:
            continue
        own = outputs_elsewhere(data)
        if not data or (own and not records.made_here(data)):
            continue
        current = None if own else settings_of(experiment, pair, stage, instance)
        row = {"experiment": experiment, "pair": pair, "stage": stage, "instance": instance,
               "created": data.get("created"), "reused_from": None, "stage_dir": directory}
        if data.get("given_up") or data["state"] != "SUCCESS":
            what = _unfinished(config, data, instance, current)
            if what:
                rows.append({**row, **what})
            continue
        if data.get("adopted"):
            continue
        if own:
            what = owndrift.differs(data, directory, own_now or {})
        else:
            what, code_unknown = _differs(tree, data, current, code_versions.get(stage), digests)
            unknown += code_unknown
            what += _funnel_missing_values(tree, data, config["experiments"][experiment]["pairs"], pair)
        edited = edits.edited(data)
        what += [EDITED.format(**edit) for edit in edited]
        row.update(reused_from=data.get("reused_from"), what=what)
        if what:
            rows.append(row)
        edits.saw(directory, data, row, edited)
    return rows + edits.finish(config), unknown


def _stage_dirs(config: dict, tree, funnels: list[str], instances: list[str] | None):
    """(experiment, pair, stage, instance, directory) of each stage directory
    ``drift`` compares: a point no longer of its experiment's grid is left
    out (nothing reads it); ``instances``: only those."""
    for experiment, exp in config["experiments"].items():
        points = wconfig.points(config, experiment)
        for pair in [*exp["pairs"], layout.ALL_PAIRS]:
            for stage in config["stages"]:
                # (without an axis, every stage lives in the experiment's one slot)
                if exp["pairs"] and (stage in funnels) != (pair == layout.ALL_PAIRS):
                    continue
                dirs = tree.state_dirs(layout.stage_dir(config["root"], pair, experiment, stage))
                if instances:
                    dirs = [(i, d) for i, d in dirs if i is not None and wconfig.match_instances(instances, [i])]
                on_grid = bool(points) and any(instance in points for instance, _ in dirs)
                for instance, directory in dirs:
                    if not (on_grid and instance not in points):
                        yield experiment, pair, stage, instance, directory


def _unfinished(config: dict, data: dict, instance: str | None, current: dict) -> dict | None:
    """What ``plan`` says of a stage that did not succeed: given up, whose
    settings changed since (no run starts it again: a change that could make
    it succeed waits for a person to say so); or whose next series goes on
    with work made under other settings."""
    if data.get("given_up"):
        differs = settings_diff(data.get("settings") or {}, current)
        return {"what": ["given up; its settings changed since: " + ", ".join(differs) + ": `waypost retry`"],
                "given_up": True} if differs else None
    resumed = _resumes_under_other_settings(config, data, instance, current)
    return {"what": [resumed], "unfinished": True} if resumed else None


def _differs(tree, data: dict, current: dict, code_now: str | None, digests: dict) -> tuple[list[str], int]:
    """How a done stage's manifest differs from now: its settings, its code
    (1 as the second value when its recorded code version is of before
    per-stage ones: not comparable), inputs redone since it was made."""
    what, unknown = [], 0
    differs = settings_diff(data.get("settings") or {}, current)
    if differs:
        what.append("settings: " + ", ".join(differs))
    recorded = data.get("code_version")
    if recorded and code_now and not wconfig.is_stage_code_version(recorded):
        unknown = 1
    elif recorded and code_now and recorded != code_now:
        what.append(f"code: {_short(recorded)} → {_short(code_now)}")
    changed = [tree.relative(i["path"]) for i in data.get("inputs", [])
               if i.get("manifest") and i.get("sha256") and
               _output_digests(tree, os.path.dirname(i["manifest"]), digests).get(
                   os.path.basename(i["path"])) not in (None, i["sha256"])]
    if changed:
        what.append("inputs redone since: " + ", ".join(changed))
    return what, unknown


def _resumes_under_other_settings(config: dict, data: dict, instance: str | None, current: dict) -> str | None:
    """For a stage that did not succeed, when the policy has its next series
    go on in its workspace (a restart in place, a rerun in the workspace as
    it is) and the work there was made under other settings than now: says
    so (a checkpoint made with ``epochs: 50`` resumed after it became 40)."""
    from waypost.model.policy import Policy, PolicyError, begin_series, describe_start
    attempts = [a for a in data.get("attempts") or [] if isinstance(a, dict)]
    if not attempts or not all(data.get(k) for k in ("experiment", "pair", "stage")) \
            or data["experiment"] not in config["experiments"]:
        return None
    try:
        policy = Policy.from_config(wconfig.stage_settings(config, data["experiment"], data["pair"], data["stage"],
                                                           instance)["policy"])
    except PolicyError:
        return None
    last_no = max(a.get("series", 1) for a in attempts)
    start = begin_series(policy, [a for a in attempts if a.get("series", 1) == last_no])
    goes_on = policy.goes_on_in_workspace(start.action, start.rerun)
    found = resumed_work(attempts, data.get("settings") or {}, current) if goes_on else None
    if found is None:
        return None
    number, differs = found
    in_place = outputs_elsewhere(data)
    return (f"the next series will {describe_start(policy, start.action, start.rerun, in_place)}, going on with attempt "
            f"{number}'s work, made under other settings: {', '.join(differs)} (`waypost rerun` starts afresh)")


def _funnel_missing_values(tree, data: dict, values: list[str], pair: str) -> list[str]:
    """A funnel made before axis values joined its experiment read none of
    their stages: say which (presence mode keeps it; `waypost rerun` redoes it)."""
    if pair != layout.ALL_PAIRS or not values:
        return []
    read = {tree.relative(i["path"]).split(os.sep, 1)[0] for i in data.get("inputs") or []}
    if not read & set(values):       # it reads no per-value stage (or recorded no inputs)
        return []
    added = [value for value in values if value not in read]
    return [f"inputs: none from {', '.join(added)} (added since)"] if added else []


def collapse(rows: list[dict], config: dict) -> list[dict]:
    """Drift rows that say the same of the same stage, as one (with their
    count and cells): an edit shows as one line per stage it touches."""
    groups: dict[tuple, dict] = {}
    for row in rows:
        group = groups.setdefault((row["stage"], tuple(row["what"])), {
            "stage": row["stage"], "what": row["what"], "unfinished": bool(row.get("unfinished")),
            "given_up": bool(row.get("given_up")),
            "count": 0, "experiments": [], "pairs": [],
            "instances": [], "made": [], "reused_from": [], "cells": []})
        group["count"] += 1
        group["cells"].append({k: row[k] for k in ("experiment", "pair", "instance")})
        for key, value in (("experiments", row["experiment"]), ("pairs", row["pair"]),
                           ("instances", row["instance"]), ("reused_from", row["reused_from"])):
            if value is not None and value not in group[key]:
                group[key].append(value)
        if row["created"]:   # the first and the last
            made = group["made"]
            group["made"] = [min(made[:1] + [row["created"]]), max(made[-1:] + [row["created"]])]
    order = {stage: i for i, stage in enumerate(config["stages"])}
    return sorted(groups.values(), key=lambda g: order.get(g["stage"], len(order)))
