"""``waypost plan``: what the next run would do and why, and which done
stages were made with other settings, code or inputs than the current ones.

The first part is Snakemake's own dry run (``snakemake -n``), its jobs and
reasons regrouped by experiment, pair and stage. The second (drift) reads
the manifests: presence mode never reruns a done stage because the config
or code changed, so after a mid-study fix this is where a user sees what
``waypost rerun`` could redo.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from . import config as wconfig
from . import layout, manifest, stagetree
from .catalog import settings_diff

JOB_HEADER = re.compile(r"^(?:local)?rule (\w+):$")
FIELD = re.compile(r"^\s+(\w+): (.*)$")


def dry_run(profile: str, config_path: str | None, workflow_dir: str, extra: list[str]) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "snakemake", "-s", os.path.join(workflow_dir, "Snakefile"),
           "--profile", profile, "-n", *(["--configfile", config_path] if config_path else []), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def parse_jobs(text: str) -> list[dict]:
    """The jobs of a dry run's output: rule, wildcards and reason."""
    jobs, job = [], None
    for line in text.splitlines():
        header = JOB_HEADER.match(line.strip()) if not line.startswith(" ") else None
        if header:
            job = {"rule": header.group(1), "wildcards": {}, "reason": ""}
            jobs.append(job)
            continue
        field = FIELD.match(line) if job else None
        if field and field.group(1) == "wildcards":
            job["wildcards"] = dict(item.split("=", 1) for item in field.group(2).split(", ") if "=" in item)
        elif field and field.group(1) == "reason":
            job["reason"] = field.group(2)
        elif job and not line.startswith(" "):
            job = None
    return [j for j in jobs if j["rule"] != "all"]


def why(job: dict, config: dict) -> str:
    """A job's reason in the user's words."""
    w = job["wildcards"]
    reason = job["reason"]
    if w.get("experiment") in config["experiments"]:
        source = wconfig.reuse_source(config, w["experiment"], w.get("pair", layout.ALL_PAIRS), job["rule"])
        if source:
            return f"reuse from {source}"
    if layout.UNFINISHED in reason:
        return "redo: left unfinished by a failure (or ran over failed parents)"
    if reason.startswith("Missing output files"):
        return "outputs missing"
    if reason.startswith("Input files updated by another job"):
        return "inputs are being redone"
    if reason.startswith("Updated input files"):
        return "inputs are newer (mtime mode)"
    return reason or "?"


def next_run(jobs: list[dict], config: dict) -> list[dict]:
    """One row per experiment × pair × stage, instances together."""
    rows: dict[tuple, dict] = {}
    for job in jobs:
        w = job["wildcards"]
        key = (w.get("experiment", ""), w.get("pair", layout.ALL_PAIRS), job["rule"])
        row = rows.setdefault(key, {"experiment": key[0], "pair": key[1], "stage": key[2],
                                    "instances": [], "why": set()})
        if "instance" in w:
            row["instances"].append(w["instance"])
        row["why"].add(why(job, config))
    order = {stage: i for i, stage in enumerate(config["stages"])}
    out = sorted(rows.values(), key=lambda r: (r["experiment"], r["pair"] == layout.ALL_PAIRS, r["pair"],
                                              order.get(r["stage"], 99)))
    for row in out:
        row["why"] = "; ".join(sorted(row["why"]))
    return out


def _output_digests(tree, stage_dir: str, cache: dict) -> dict:
    if stage_dir not in cache:
        try:
            data = tree.manifest(stage_dir) or {}
        except manifest.ManifestError:
            data = {}
        cache[stage_dir] = {o["path"]: o.get("sha256") for o in data.get("outputs", [])}
    return cache[stage_dir]


def drift(config: dict, code_version: str, funnels: list[str]) -> list[dict]:
    """Done stages made with other settings, code or inputs than now (on a
    gs:// root: from one listing and one batch read of the manifests)."""
    rows, digests = [], {}
    root = config["root"]
    tree = stagetree.open(root)
    for experiment, exp in config["experiments"].items():
        for pair in [*exp["pairs"], layout.ALL_PAIRS]:
            for stage in config["stages"]:
                if (stage in funnels) != (pair == layout.ALL_PAIRS):
                    continue
                current = wconfig.step_settings(config, experiment, pair, stage)
                for instance, directory in tree.state_dirs(layout.stage_dir(root, pair, experiment, stage)):
                    try:
                        data = tree.manifest(directory)
                    except manifest.ManifestError:
                        continue
                    if not data or data["state"] != "SUCCESS" or data.get("adopted"):
                        continue
                    what = []
                    differs = settings_diff(data.get("settings") or {}, current)
                    if differs:
                        what.append("settings: " + ", ".join(differs))
                    if data.get("code_version") and data["code_version"] != code_version:
                        what.append(f"code: {data['code_version']} → {code_version}")
                    changed = [tree.relative(i["path"]) for i in data.get("inputs", [])
                               if i.get("manifest") and i.get("sha256") and
                               _output_digests(tree, os.path.dirname(i["manifest"]), digests).get(
                                   os.path.basename(i["path"])) not in (None, i["sha256"])]
                    if changed:
                        what.append("inputs redone since: " + ", ".join(changed))
                    if what:
                        rows.append({"experiment": experiment, "pair": pair, "stage": stage, "instance": instance,
                                     "created": data.get("created"), "reused_from": data.get("reused_from"),
                                     "what": what})
    return rows
