"""The state of every stage, read from the stage directories alone.

A stage directory is, as the lifecycle reader (``lifecycle.Life.state``)
says, in order of precedence:
  running / interrupted  an attempt is in progress (``_running.json``, and
                         no manifest written after it); interrupted when
                         its process or Slurm job is gone
  corrupt                ``_manifest.json`` exists but can't be read
  SUCCESS (done)         its manifest says SUCCESS and its outputs are there
                         (adopted if the manifest itself says ``adopted``)
  missing                its manifest says SUCCESS but an output was deleted
  FAILED, TIMEOUT, …     its manifest records a failed last attempt
  adopted                files are there without a manifest of this stage
                         (placed by hand or copied from elsewhere): done
  missing                nothing there
A stage with instances (``stage/<instance>/``) has its worst instance's state;
its label counts the instances in each state.
"""

from __future__ import annotations

import gc

from waypost import stores
from waypost.model import layout, manifest, records
from waypost.model.config import check_names, derived
from waypost.model.states import State
from waypost.state import lifecycle

DONE = (State.SUCCESS, State.ADOPTED)
#: states.FAILURES, in the legend's order (tests/test_states.py checks it is the same set)
FAILURES = (State.FAILED, State.TIMEOUT, State.OOM, State.HWFAILURE, State.PREEMPTED, State.CANCELLED)
# Worst first: the order in which an aggregate cell picks its state (every end and lifecycle state).
SEVERITY = [State.CORRUPT, State.FAILED, State.OOM, State.TIMEOUT, State.HWFAILURE, State.PREEMPTED, State.CANCELLED,
            State.SKIPPED, State.INTERRUPTED, State.RUNNING, State.MISSING, State.ADOPTED, State.SUCCESS]

# How a state shows: label, rich style (terminal), CSS colour (HTML page).
# The failure states, and any state not listed, show as FAILURE_LOOK.
LOOKS = {
    State.SUCCESS: ("done", "green", "#2e7d32"),
    State.ADOPTED: ("adopted", "cyan", "#00838f"),
    State.MISSING: ("missing", "bright_black", "#757575"),
    State.RUNNING: ("running", "yellow", "#b7950b"),
    State.INTERRUPTED: ("interrupted", "magenta", "#ad1fa3"),
    State.CORRUPT: ("corrupt", "bold red", "#c62828"),
    State.SKIPPED: ("skipped", "yellow", "#b7950b"),
}
FAILURE_LOOK = ("bold red", "#c62828")
LEGEND_MARKS = ("timeout 9 · done 191: instances by state, worst first  ×N: attempts\n"
                "*: provisional, redone with a parent\n"
                "given up: max_series spent; no run starts it again until `waypost retry`")


def look(state: str) -> tuple[str, str, str]:
    return LOOKS.get(state, (state.lower(), *FAILURE_LOOK))


def label_parts(cell: dict) -> list[dict]:
    """A cell's label in parts: ``text``, and the ``state`` whose look it
    takes (none: a separator). A stage's state (``*`` if provisional); of a
    stage with instances, how many (``count``) are in each state, worst
    first (``timeout 9 · done 191``); then ``given up`` (``given_up``: how
    many instances, or True) when its series are spent."""
    instances = cell.get("instances", {}).values()
    if not instances:
        parts = [{"text": look(cell["state"])[0] + ("*" if cell.get("provisional") else ""), "state": cell["state"]}]
        if cell.get("given_up"):
            parts += [{"text": ", "}, {"text": "given up", "state": cell["state"], "given_up": True}]
        return parts
    by_state: dict[str, list[dict]] = {}
    for sub in instances:
        by_state.setdefault(sub["state"], []).append(sub)
    parts = []
    for state, subs in sorted(by_state.items(), key=lambda item: severity(item[0])):
        provisional = "*" if any(c.get("provisional") for c in subs) else ""
        parts += [{"text": " · "}] * bool(parts) + [
            {"text": f"{look(state)[0]} {len(subs)}{provisional}", "state": state, "count": len(subs)}]
    given_up = [sub["state"] for sub in instances if sub.get("given_up")]
    if given_up:
        parts += [{"text": ", "}, {"text": f"given up {len(given_up)}", "state": worst(given_up),
                                   "given_up": len(given_up)}]
    return parts


def label(cell: dict) -> tuple[str, int]:
    """A cell's label (see label_parts: ``timeout 9 · done 191, given up 2``)
    and its attempts (of a stage with instances: the most of any)."""
    instances = cell.get("instances", {}).values()
    attempts = max(c.get("attempts", 0) for c in instances) if instances else cell.get("attempts", 0)
    return "".join(part["text"] for part in label_parts(cell)), attempts


def not_done(cell: dict) -> bool:
    """Is this stage (or instance) directory one ``status --failed`` names:
    not done, neither running nor never run (a directory with no attempt
    and no outputs gone)?"""
    state = cell["state"]
    if state in DONE or state == State.RUNNING:
        return False
    return state != State.MISSING or bool(cell.get("history") or cell.get("missing_outputs"))


def why(cell: dict) -> str:
    """Why a directory is not done, in a line: its last decision's reason
    (``TIMEOUT and no cue matched``), then the stage's own (given up, a
    parent not accepted, a retry), or what its state says (interrupted,
    corrupt, outputs gone)."""
    state, history = cell["state"], cell.get("history") or []
    decision = (history[-1].get("decision") if history else None) or {}
    parts = []
    if state == State.CORRUPT:
        parts.append(cell.get("error") or "its manifest can't be read")
    elif state == State.INTERRUPTED:
        parts.append("its runner is gone; the next run redoes it")
    elif cell.get("missing_outputs"):
        parts.append("outputs gone since it succeeded: " + ", ".join(cell["missing_outputs"]))
    elif decision.get("reason"):
        parts.append(decision["reason"])
    if cell.get("reason") and state != State.INTERRUPTED and not cell.get("missing_outputs"):
        parts.append(cell["reason"])
    if cell.get("next_series_after") and not cell.get("given_up"):
        parts.append(f"next series not before {cell['next_series_after'][:19].replace('T', ' ')} UTC")
    return "; ".join(parts)


def state_text(cell: dict) -> str:
    """One directory's state in words, as a label says it (``failed, given up``)."""
    return look(cell["state"])[0] + (", given up" if cell.get("given_up") else "")


def stage_state(stage_dir: str, expected: dict, tree=None) -> dict:
    """State of one stage (or instance) directory (in ``tree``, a
    store over its root; by default one over the directory), as the
    lifecycle reader says, with what status shows of its manifest.

    ``expected`` holds the experiment/pair/stage/instance this directory is
    for; a manifest that names another location was copied here by hand.
    """
    life = lifecycle.read(tree or stores.store_for(stage_dir), stage_dir)
    cell = {"state": life.state(expected), "attempts": 0, "path": stage_dir, "log": None, "last": None}
    if life.error:
        cell["error"] = life.error
    data = life.manifest
    if data is not None:
        attempts = data["attempts"]
        cell["attempts"] = len(attempts)
        cell["history"] = [{k: a.get(k) for k in ("number", "series", "action", "state", "exit_code", "signal",
                                                    "checks", "decision", "duration_s", "runtime_limit_s",
                                                    "workspace", "log", "host", "why")}
                           | records.job_fields(records.job_of(a))
                           | ({"resumes": a["resumes"]} if a.get("resumes") else {}) for a in attempts]
        cell["provisional"] = life.provisional
        if life.given_up:
            cell["given_up"] = True
        if data.get("next_series_after"):
            cell["next_series_after"] = data["next_series_after"]
        if data.get("reason"):
            cell["reason"] = data["reason"]
        if attempts:
            cell["log"] = layout.join(stage_dir, attempts[-1].get("log") or "")
            cell["last"] = attempts[-1].get("state")
        if cell["state"] == State.MISSING and data["state"] == State.SUCCESS:
            missing = life.missing_outputs()
            if missing:
                cell["missing_outputs"] = missing
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
            from waypost.model.parallel import chunks, cpus, in_workers
            shares = chunks(tasks, -(-len(tasks) // cpus()))
            rows = [row for share in in_workers(_rows, root, shares, parallel=True) for row in share]
    finally:
        if collecting:
            gc.enable()
    grid: dict[str, dict] = {name: {} for name in experiments}
    for (name, p, _), row in zip(tasks, rows):
        grid[name][p] = row
    return {"root": root, "stages": stages, "axis": derived(config).axis_words(), "experiments": grid}


def column_heading(pair: str, axis: dict | None) -> str:
    """A grid column's heading: an axis value, or the funnels' column (all
    of the experiment's values; "state" in a workflow without an axis)."""
    if pair != layout.ALL_PAIRS:
        return pair
    return f"all {axis['key']}" if axis else "state"
