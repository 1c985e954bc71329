"""What users do to the file state by hand, done safely.

``rerun``: make stages be computed again by the next run. Their workspace
(outputs, manifest, logs) moves to ``.attempts/<n>/`` — archived, never
deleted — so in presence mode they are missing and only they are redone.
``--downstream`` adds every stage that consumed their outputs, found from
the ``inputs`` the manifests record (exact, instance by instance), and
every stage another experiment reused from them (their ``reused_from``), with
what consumed those in turn. A rerun of a stage its experiment reuses from
elsewhere is not a recomputation: the next run copies it again from its
source (``reuse_sources`` says from where), once that source is done.

``adopt`` (files put by hand recorded as a job's outputs) is ``ops.adopt``.
"""

from __future__ import annotations

import os

from waypost import stores
from waypost.model import layout, manifest
from waypost.model.config import check_instance_names, check_names, match_instances, stage_settings
from waypost.model.config import reuse_source as config_reuse_source
from waypost.model.config import source_of_instance as config_source_of_instance
from waypost.model.errors import WaypostError
from waypost.model.job import Job, outputs_elsewhere
from waypost.model.policy import Policy, begin_series, describe_start
from waypost.state import lifecycle


class SteerError(WaypostError, RuntimeError):
    """Nothing was changed; the message says why."""


def _consumers(tree, experiments: list[str]) -> dict[str, set[str]]:
    """stage dir → the stage dirs whose manifests list one of its files as
    input, or that were reused from it (another experiment's copy: reuse
    crosses experiments, so ``experiments`` should be all of the config's)."""
    consumers: dict[str, set[str]] = {}
    # An input whose producer was not known as the job ran is listed by path
    # alone (as Snakemake gave it, from its working directory: this
    # command's); its producer is the job whose record lists that file.
    made_by: dict[str, str] = {}
    inputs_of: dict[str, set[str]] = {}
    for directory in tree.manifest_dirs():
        parts = tree.relative(directory).split("/")
        if len(parts) < 3 or parts[1] not in experiments:
            continue
        try:
            data = tree.manifest(directory) or {}
        except manifest.ManifestError:
            continue
        for item in data.get("inputs", []):
            if item.get("manifest"):
                producer = tree.key(os.path.dirname(item["manifest"]))
                consumers.setdefault(producer, set()).add(tree.key(directory))
            elif item.get("path"):
                inputs_of.setdefault(os.path.abspath(item["path"]), set()).add(tree.key(directory))
        job = Job.of_record(directory, data)
        made_by.update({os.path.abspath(job.output_path(out["path"])): tree.key(directory)
                        for out in data.get("outputs", []) if not out.get("side")})
        if data.get("reused_from"):
            consumers.setdefault(tree.key(data["reused_from"]), set()).add(tree.key(directory))
    for path, readers in inputs_of.items():
        if path in made_by:
            consumers.setdefault(made_by[path], set()).update(readers)
    return consumers


def own_upstream(root: str, source: str, rule: str) -> tuple[list[str], list[str]]:
    """For ``waypost reuse --upstream-of RULE`` where RULE is a rule in its
    own layout: the rules whose jobs in experiment ``source`` (under
    ``root``) made what RULE's jobs there read, and what made their inputs
    in turn (from the records' inputs: ``_consumers``), in the order first
    met; and the problems that forbid taking them (such a job that is not a
    finished SUCCESS). A ConfigError when RULE has no job recorded there."""
    from waypost.model.config import ConfigError
    tree = stores.store_for(root)
    made_from: dict[str, set[str]] = {}
    for producer, readers in _consumers(tree, [source]).items():
        for reader in readers:
            made_from.setdefault(reader, set()).add(producer)
    own = tree.key(layout.stage_dir(root, layout.ALL_PAIRS, source, rule))
    jobs = [d for d in made_from if d == own or d.startswith(own + "/")]
    if not jobs and not tree.isdir(own):
        raise ConfigError(f"rule {rule} has no job recorded in experiment {source} (no {own}): run it there first")
    rules, problems = [], []
    for directory in _reachable(made_from, jobs):
        parts = tree.relative(directory).split("/")
        if len(parts) < 3 or parts[1] != source:
            continue
        if parts[2] not in rules:
            rules.append(parts[2])
        problem = _unfinished(tree, directory)
        if problem:
            problems.append(problem)
    return rules, problems


def _reachable(edges: dict[str, set[str]], start: list[str]) -> list[str]:
    """What ``edges`` lead to from the nodes of ``start`` (those apart), in
    the order first met."""
    found, seen, todo = [], set(start), list(start)
    while todo:
        for node in sorted(edges.get(todo.pop(0), ())):
            if node not in seen:
                seen.add(node)
                found.append(node)
                todo.append(node)
    return found


def _unfinished(tree, directory: str) -> str | None:
    """Why a job's record can't be taken (not a finished SUCCESS), or None."""
    try:
        data = tree.manifest(directory) or {}
    except manifest.ManifestError as exc:
        return str(exc)
    if data.get("state") != "SUCCESS" or data.get("provisional"):
        return f"{directory}: {data.get('state') or 'no manifest'}"
    return None


def reuse_sources(config: dict, directories: list[str]) -> dict[str, str]:
    """Of these stage dirs (pair/experiment/stage[/instance] under the root),
    those the config has their experiment take from elsewhere (its ``reuse``
    setting), with where from: the next run copies them from there
    instead of computing them."""
    root = config["root"]
    base = stores.absolute(root).rstrip("/") + "/"
    found = {}
    for directory in directories:
        if not directory.startswith(base):
            continue
        parts = directory[len(base):].split("/")
        if len(parts) < 3 or parts[1] not in config["experiments"] or parts[2] not in config["stages"]:
            continue
        pair, experiment, stage, instance = parts[0], parts[1], parts[2], (parts[3] if len(parts) > 3 else None)
        source = config_reuse_source(config, experiment, pair, stage)
        if source is None:
            continue
        if layout.is_valid_name(source):   # another experiment under the same root
            source = layout.stage_dir(root, pair, source, stage, instance)
        else:
            source = config_source_of_instance(source, instance)
        found[directory] = source
    return found


def _instances(instance) -> list[str]:
    return [] if instance is None else [instance] if isinstance(instance, str) else list(instance)


def _stage_dirs(tree, config: dict, stage: str, experiments: list[str], pairs: list[str] | None,
                instances: list[str]) -> list[str]:
    """The directories (instances apart) of a stage in these experiments and
    pairs (the per-experiment slot of funnels included) that exist; with
    ``instances`` (names or shell patterns), of the instances they match.
    A name that is neither an instance there nor a point of the grid is a
    ConfigError."""
    found, seen = [], {stage: set()}
    for experiment in experiments:
        for pair in [*config["experiments"][experiment]["pairs"], layout.ALL_PAIRS]:
            if pairs and pair not in pairs:
                continue
            stage_dir = layout.stage_dir(config["root"], pair, experiment, stage)
            if not tree.isdir(stage_dir):
                continue
            dirs = tree.state_dirs(stage_dir)
            if instances:
                named = {name: d for name, d in dirs if name is not None}
                seen[stage].update(named)
                found += [named[name] for name in match_instances(instances, named)]
            else:
                found += [d for _, d in dirs]
    if instances:
        check_instance_names(config, instances, experiments, seen)
    return found


def _what(stage: str, instances: list[str]) -> str:
    return stage + (f"/{instances[0]}" if len(instances) == 1 else f" ({', '.join(instances)})" if instances else "")


def rerun(config: dict, stage: str, experiments: list[str] | None = None, pairs: list[str] | None = None,
          instance=None, downstream: bool = False, dry_run: bool = False) -> list[tuple[str, str, bool]]:
    """Archive the workspaces of a stage (and, with ``downstream``, of what
    consumed it) so the next run recomputes them; ``instance``: only these
    instances (a name or a list of names and shell patterns). Returns (dir, archive, whether it is
    the record of a job of a rule in its own layout, whose outputs went into the archive too).
    On a gs:// root: one listing, the manifests read in one batch (only for
    ``downstream``), each archive a server-side move."""
    check_names(config, experiments, pairs, stage)
    experiments = experiments or list(config["experiments"])
    instances = _instances(instance)
    tree = stores.store_for(config["root"])
    selected = [tree.key(d) for d in _stage_dirs(tree, config, stage, experiments, pairs, instances)
                if tree.entries(d)]
    if not selected:
        raise SteerError(f"nothing to rerun: no stage {_what(stage, instances)} with files "
                         f"for experiment(s) {', '.join(experiments)}" + (f", pair(s) {', '.join(pairs)}" if pairs else ""))
    return _archive_for_rerun(config, tree, selected, downstream, dry_run)


def rerun_dirs(config: dict, directories: list[str], downstream: bool = False,
               dry_run: bool = False) -> list[tuple[str, str, bool]]:
    """``rerun`` of these stage directories (``waypost rerun --drifted``:
    those ``plan`` found drifted), as ``rerun`` returns them; the ones with
    no files left are passed over."""
    tree = stores.store_for(config["root"])
    selected = list(dict.fromkeys(tree.key(d) for d in directories if tree.entries(d)))
    return _archive_for_rerun(config, tree, selected, downstream, dry_run) if selected else []


def _archive_for_rerun(config: dict, tree, selected: list[str], downstream: bool,
                       dry_run: bool) -> list[tuple[str, str, bool]]:
    """Archive ``selected`` (and, with ``downstream``, what consumed them),
    none while an attempt runs in any of them."""
    if downstream:
        consumers = _consumers(tree, list(config["experiments"]))
        todo = list(selected)
        while todo:
            for consumer in sorted(consumers.get(todo.pop(), ())):
                if consumer not in selected:
                    selected.append(consumer)
                    todo.append(consumer)
    busy = [f"{d} ({live.where})" for d in selected for live in [lifecycle.read(tree, d).live] if live]
    if busy:
        raise SteerError("an attempt is running in " + "; ".join(busy) + "; nothing was changed")
    done = []
    for directory in selected:
        try:
            data = tree.manifest(directory)
        except manifest.ManifestError:
            data = None
        own = outputs_elsewhere(data)
        try:   # (a rule in its own layout: its outputs, where its rule put them, go in too)
            archived = "(dry run)" if dry_run else tree.archive_job(directory, data)
        except manifest.ManifestError as exc:   # an .attempts that is a link out (never archived through)
            raise SteerError(f"{exc}" + (f"; archived before it: {', '.join(d for d, _, _ in done)}" if done
                                         else "; nothing was changed")) from None
        if archived:
            done.append((directory, archived, own))
            if not dry_run:
                _forget_hold(tree, directory)
    return done


def _forget_hold(tree, directory: str) -> None:
    """Take a stage off the root's registry of stages on hold (layout.HELD)."""
    rel = tree.relative(directory)
    tree.remove(layout.join(tree.root, layout.HELD, rel.replace("/", "~")))


def retry(config: dict, stage: str, experiments: list[str] | None = None, pairs: list[str] | None = None,
          instance=None, dry_run: bool = False) -> list[tuple[str, str, str]]:
    """Give stages that did not succeed a new count of series: those given
    up (``max_series`` reached, or a ``give_up`` cue) or waiting out a
    ``series_backoff`` may start again at the next run. Their history stays;
    the policy decides how the next series begins (``policy.begin_series``
    over the last one: a restart in place, a rerun, or a fresh start).
    ``instance``: only these instances (a name or a list of names and shell
    patterns). Returns (dir, what it was, what the next run will do)."""
    check_names(config, experiments, pairs, stage)
    instances = _instances(instance)
    tree = stores.store_for(config["root"])
    found = _unsucceeded(tree, config, stage, experiments or list(config["experiments"]), pairs, instances)
    if not found:
        raise SteerError(f"nothing to retry: no stage {_what(stage, instances)} that ended "
                         "without success" + (f" for pair(s) {', '.join(pairs)}" if pairs else ""))
    busy = [f"{d} ({live.where})" for d, _ in found for live in [lifecycle.read(tree, d).live] if live]
    if busy:
        raise SteerError("an attempt is running in " + "; ".join(busy) + "; nothing was changed")
    done = []
    for directory, data in found:
        last_no = max(a.get("series", 1) for a in data["attempts"])
        what = ("given up" if data.get("given_up") else
                f"waiting until {data['next_series_after']}" if data.get("next_series_after") else data["state"])
        then = _next_series(config, data, last_no)
        if not dry_run:
            _reset_series_count(tree, directory, data, last_no)
        done.append((tree.key(directory), what, then))
    return done


def _unsucceeded(tree, config: dict, stage: str, experiments: list[str], pairs: list[str] | None,
                 instances: list[str]) -> list[tuple[str, dict]]:
    """(dir, manifest) of each selected stage whose manifest says it ended
    without success, after at least one attempt."""
    found = []
    for directory in _stage_dirs(tree, config, stage, experiments, pairs, instances):
        try:
            data = tree.manifest(directory)
        except manifest.ManifestError:
            continue
        # (a manifest that does not say which stage it is for was not
        # written by a run of this one: nothing to give a new count)
        if data and data["state"] != "SUCCESS" and data.get("attempts") \
                and all(data.get(k) for k in ("experiment", "pair", "stage")):
            found.append((directory, data))
    return found


def _next_series(config: dict, data: dict, last_no: int) -> str:
    """How the next run begins the stage's next series (its policy over
    series ``last_no``, the last), and why."""
    policy = Policy.from_config(stage_settings(config, data["experiment"], data["pair"], data["stage"],
                                               data.get("instance"))["policy"])
    start = begin_series(policy, [a for a in data["attempts"] if a.get("series", 1) == last_no])
    return f"{describe_start(policy, start.action, start.rerun, in_place=outputs_elsewhere(data))}: {start.why}"


def _reset_series_count(tree, directory: str, data: dict, spent: int) -> None:
    """Rewrite the stage's manifest so the ``spent`` series so far don't
    count (no longer given up nor waiting), its hold forgotten."""
    record = {k: v for k, v in data.items() if k not in ("given_up", "next_series_after")}
    record["series_base"] = spent
    record["reason"] = f"{data.get('reason') or data['state']}; series count reset by waypost retry"
    tree.write_manifest(directory, record)
    _forget_hold(tree, directory)
    if any(tree.exists(layout.join(directory, o)) for o in _declared_outputs(tree, directory)):
        # placeholders a funnel went on over: the planner must force the job
        tree.write_marker(layout.join(directory, layout.UNFINISHED), f"{data['state']}\n")


def _declared_outputs(tree, directory: str) -> list[str]:
    """Files of the stage's workspace (not the engine's): placeholders, when
    the stage did not succeed."""
    return [e for e in tree.entries(directory) if not manifest.is_engine_file(e)]

