"""The state of every stage, read from the stage directories alone.

A stage directory is, in order of precedence:
  running / interrupted  an attempt is in progress (``_running.json``);
                         interrupted when its process is gone
  corrupt                ``_manifest.json`` exists but can't be read
  SUCCESS (done)         its manifest says SUCCESS and its outputs are there
                         (adopted if the manifest itself says ``adopted``)
  missing                its manifest says SUCCESS but an output was deleted
  FAILED, TIMEOUT, …     its manifest records a failed last attempt
  adopted                files are there without a manifest of this stage
                         (placed by hand or copied from elsewhere): done
  missing                nothing there
A stage with instances (``stage/<instance>/``) shows the worst instance.
"""

from __future__ import annotations

import gc

from . import layout, manifest, stores
from .config import check_names

DONE = ("SUCCESS", "adopted")
FAILURES = ("FAILED", "TIMEOUT", "OOM", "HWFAILURE", "PREEMPTED", "CANCELLED")   # states.FAILURES, in the legend's order
# Worst first: the order in which an aggregate cell picks its state.
SEVERITY = ["corrupt", "FAILED", "OOM", "TIMEOUT", "HWFAILURE", "PREEMPTED", "CANCELLED", "SKIPPED",
            "interrupted", "running", "missing", "adopted", "SUCCESS"]

# How a state shows: label, rich style (terminal), CSS colour (HTML page).
# The failure states, and any state not listed, show as FAILURE_LOOK.
LOOKS = {
    "SUCCESS": ("done", "green", "#2e7d32"),
    "adopted": ("adopted", "cyan", "#00838f"),
    "missing": ("missing", "bright_black", "#757575"),
    "running": ("running", "yellow", "#b7950b"),
    "interrupted": ("interrupted", "magenta", "#ad1fa3"),
    "corrupt": ("corrupt", "bold red", "#c62828"),
    "SKIPPED": ("skipped", "yellow", "#b7950b"),
}
FAILURE_LOOK = ("bold red", "#c62828")
LEGEND_MARKS = ("n/m: instances done  ×N: attempts  *: provisional, redone with a parent\n"
                "given up: max_series spent; no run starts it again until `waypost retry`")


def look(state: str) -> tuple[str, str, str]:
    return LOOKS.get(state, (state.lower(), *FAILURE_LOOK))


def label(cell: dict) -> tuple[str, int]:
    """A cell's label (state, instances done ``n/m``, ``*`` if provisional)
    and its attempts (of a stage with instances: the most of any)."""
    text = look(cell["state"])[0]
    attempts = cell.get("attempts", 0)
    instances = cell.get("instances", {}).values()
    if instances:
        text += f" {sum(1 for c in instances if c['state'] in DONE)}/{len(instances)}"
        attempts = max(c.get("attempts", 0) for c in instances)
    if cell.get("provisional") or any(c.get("provisional") for c in instances):
        text += "*"
    given_up = sum(1 for c in instances if c.get("given_up"))
    if cell.get("given_up") or given_up:
        text += ", given up" + (f" {given_up}" if instances else "")
    return text, attempts


def _running_state(tree, stage_dir: str) -> str | None:
    alive, where = tree.in_flight(stage_dir)
    if alive:
        return "running"
    return "interrupted" if where else None


def _has_files(tree, stage_dir: str) -> bool:
    """Does the directory hold anything but the engine's files?"""
    return any(not manifest.is_engine_file(e) for e in tree.entries(stage_dir))


def stage_state(stage_dir: str, expected: dict, tree=None) -> dict:
    """State of one stage (or instance) directory (in ``tree``, a
    store (``stores.store_for``) over its root; by default one over the directory).

    ``expected`` holds the experiment/pair/stage/instance this directory is
    for; a manifest that names another location was copied here by hand.
    """
    tree = tree or stores.store_for(stage_dir)
    cell = {"state": "missing", "attempts": 0, "path": stage_dir, "log": None, "last": None}
    running = _running_state(tree, stage_dir)
    try:
        data = tree.manifest(stage_dir)
    except manifest.ManifestError as exc:
        cell.update(state="corrupt", error=str(exc))
        return cell
    if data is not None:
        attempts = data["attempts"]
        cell["attempts"] = len(attempts)
        cell["history"] = [{k: a.get(k) for k in ("number", "series", "action", "state", "exit_code", "signal",
                                                    "checks", "decision", "duration_s", "runtime_limit_s",
                                                    "workspace", "log", "host", "slurm_job_id", "why")}
                           for a in attempts]
        cell["provisional"] = bool(data.get("provisional"))
        if data.get("given_up"):
            cell["given_up"] = True
        if data.get("next_series_after"):
            cell["next_series_after"] = data["next_series_after"]
        if data.get("reason"):
            cell["reason"] = data["reason"]
        if attempts:
            cell["log"] = layout.join(stage_dir, attempts[-1].get("log") or "")
            cell["last"] = attempts[-1].get("state")
        own = all(data.get(k) == v for k, v in expected.items())
        if running:
            cell["state"] = running
        elif not own:
            cell["state"] = "adopted" if _has_files(tree, stage_dir) else "missing"
        elif data["state"] == "SUCCESS":
            missing = [o["path"] for o in data.get("outputs", []) if not tree.exists(layout.join(stage_dir, o["path"]))]
            cell["state"] = "missing" if missing else "adopted" if data.get("adopted") else "SUCCESS"
            if missing:
                cell["missing_outputs"] = missing
        else:
            cell["state"] = data["state"]
    elif running:
        cell["state"] = running
    elif _has_files(tree, stage_dir):
        cell["state"] = "adopted"
    return cell


def archived_runs(tree, stage_dir: str) -> list[dict]:
    """The earlier runs of a stage (or instance) dir, oldest first: each
    archive (``.attempts/<n>``) with what its manifest says (state, when it
    was made, attempts, reused from); ``state`` None for a workspace
    archived without a manifest. Reads one manifest per archive: only for
    ``status --attempts``, never for the grid."""
    runs = []
    for name in tree.archives(stage_dir):
        archive = f"{layout.ATTEMPTS}/{name}"
        run = {"archive": archive, "path": layout.join(stage_dir, layout.ATTEMPTS, name), "state": None,
               "created": None, "attempts": 0, "reused_from": None}
        try:
            data = tree.manifest(run["path"])
        except manifest.ManifestError as exc:
            data, run["error"] = None, str(exc)
        if data:
            run.update(state=data["state"], created=data.get("created"), attempts=len(data["attempts"]),
                       reused_from=data.get("reused_from"))
        runs.append(run)
    return runs


def severity(state: str) -> int:
    """A state's rank, worst first (0); a state not in SEVERITY counts as worst."""
    return SEVERITY.index(state) if state in SEVERITY else 0


def worst(states: list[str]) -> str:
    return min(states, key=severity)


def stage_cell(root: str, experiment: str, pair: str, stage: str, tree=None) -> dict:
    """The cell of one stage of one experiment and pair (``tree``: a
    store (``stores.store_for``) over ``root``, made if not given)."""
    tree = tree or stores.store_for(root)
    stage_dir = layout.stage_dir(root, pair, experiment, stage)
    expected = {"experiment": experiment, "pair": pair, "stage": stage}
    dirs = tree.state_dirs(stage_dir)
    if dirs == [(None, stage_dir)]:
        return stage_state(stage_dir, {**expected, "instance": None}, tree)
    cells = {name: stage_state(directory, {**expected, "instance": name}, tree) for name, directory in dirs}
    return {
        "state": worst([c["state"] for c in cells.values()]),
        "attempts": sum(c["attempts"] for c in cells.values()),
        "path": stage_dir,
        "instances": cells,
    }


# A local root with this many stage cells or more is read by worker processes
# (see parallel.py); below it, starting them costs more than it saves.
PARALLEL_FROM = 2000


def _rows(root: str, tasks: list[tuple[str, str, list[str]]]) -> list[dict]:
    """{stage: cell} for each (experiment, pair, stages) task."""
    tree = stores.store_for(root, snapshot=True)
    return [{stage: stage_cell(root, experiment, pair, stage, tree) for stage in stages}
            for experiment, pair, stages in tasks]


def collect(config: dict, funnels: list[str], experiment: str | None = None, pair: str | None = None) -> dict:
    """experiments → pairs (and the per-experiment funnel slot) → stages → cell.

    ``funnels`` are the stages that run once per experiment (``_all`` slot).
    With ``experiment`` or ``pair``, only those (a pair's grid has no funnel
    slot; an experiment without that pair is left out); ConfigError names
    one that isn't in the config.
    On a gs:// root, from one listing of the bucket and one batch read of
    the manifests; on a local one, listing each directory once (in worker
    processes, one share of the pairs each, when there are many).
    """
    root = config["root"]
    stages = list(config["stages"])
    per_pair = [s for s in stages if s not in funnels]
    check_names(config, experiment, pair)
    experiments = {name: settings for name, settings in config["experiments"].items()
                   if experiment in (None, name) and pair in (None, *settings["pairs"])}
    tasks = []
    for name, settings in experiments.items():
        tasks += [(name, p, per_pair) for p in settings["pairs"] if pair in (None, p)]
        # Without an axis (no pairs), every stage lives in the experiment's one slot.
        slot = funnels if settings["pairs"] else stages
        if slot and pair is None:
            tasks.append((name, layout.ALL_PAIRS, slot))
    # The cells hold no reference cycles: the cycle collector would only walk
    # the growing heap again and again (in forked workers, copying the pages
    # they share with this process).
    collecting = gc.isenabled()
    gc.disable()
    try:
        if stores.listed_at_once(root) or sum(len(t[2]) for t in tasks) < PARALLEL_FROM:
            rows = _rows(root, tasks)
        else:
            from .parallel import chunks, cpus, in_workers
            shares = chunks(tasks, -(-len(tasks) // cpus()))
            rows = [row for share in in_workers(_rows, root, shares, parallel=True) for row in share]
    finally:
        if collecting:
            gc.enable()
    grid: dict[str, dict] = {name: {} for name in experiments}
    for (name, p, _), row in zip(tasks, rows):
        grid[name][p] = row
    return {"root": root, "stages": stages, "axis": config.get("_axis"), "experiments": grid}


def column_heading(pair: str, axis: dict | None) -> str:
    """A grid column's heading: an axis value, or the funnels' column (all
    of the experiment's values; "state" in a workflow without an axis)."""
    if pair != layout.ALL_PAIRS:
        return pair
    return f"all {axis['key']}" if axis else "state"
