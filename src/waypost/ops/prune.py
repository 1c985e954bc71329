"""Archived workspaces (``.attempts/<n>/``): how much disk they hold, and
removing those beyond the retention that nothing needs any more (slimming
those only an attempt history still reads).

Every way a stage directory is set aside moves its workspace into
``.attempts/<n>/`` and never deletes it: a new series of attempts (the step
runner), ``rerun: new``, ``waypost rerun``, ``verify --repair``. With
checkpoints of gigabytes, reruns and cron, the disk fills; ``waypost prune``
removes what the config's ``retention`` no longer keeps, on disk and in a
gs:// root and a mounted bucket alike (through ``stores``).

The rule, per stage dir (a stage's own, or each instance's; archives are
numbered, the highest the newest):

  An archive is *beyond the retention* when it is not among the newest
  ``keep_last`` of its stage dir AND, when ``keep_days`` is set, it was
  archived more than ``keep_days`` days ago (its newest modification time:
  on disk the archive directory's or its files', in a bucket its newest
  object's, which the server-side move writes). Each limit keeps: an
  archive goes only when neither keeps it. ``keep_last: null`` keeps every
  archive (nothing is pruned there); ``keep_days: null`` (the default) sets
  no age limit, so only the count decides.

An archive beyond the retention is still kept whole, and the listing says
why, when

  - an attempt is in flight in its stage dir (``_running.json`` of a live
    process or Slurm job): nothing in that dir is touched;
  - a live manifest anywhere under the root was reused from it
    (``reused_from``), or a ``reuse`` entry of the config points into it;
  - a live manifest has an input in it (``inputs[].path`` or ``.manifest``),
    or has an input from its stage dir whose sha256 the stage's current
    outputs don't have and the archive's own manifest does (the consumer was
    made from what is now archived; e.g. after ``waypost rerun`` without
    ``--downstream``).

An archive beyond the retention that none of these keeps but that the stage
dir's current ``_manifest.json`` (or the ``_running.json`` a runner that is
gone left) points into, through an attempt's ``workspace`` or ``log``, is
*slimmed*: the runner copies every earlier series into the current history,
so a stage failing run after run would otherwise keep every archive (and
its checkpoints) for good. All of it goes but what the history needs to stay
readable: its ``_logs/``, its own ``_manifest.json`` and ``_running.json``
(and a file a ``log`` points at elsewhere in it); one that would be left
empty (``rerun: new`` leaves the logs in the stage dir) goes whole. An
archive already slimmed frees nothing and is kept as it is. An archive
nothing refers to is removed whole.

"Live" manifests are the ``_manifest.json`` files outside archives. Paths a
manifest records relative to where a run started (a relative ``root``) are
taken relative to the current directory, as every ``waypost`` command does.

Sizes are the files' sizes: a file hard-linked elsewhere (a reused output)
frees nothing until its last link goes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from waypost import stores
from waypost.model import config as wconfig
from waypost.model import layout, manifest
from waypost.model.layout import ATTEMPTS, LOGS, MANIFEST, RUNNING
from waypost.state import lifecycle

DEFAULT_RETENTION = {"keep_last": 3, "keep_days": None}
DAY = 86400.0


def retention(config: dict, experiment: str, pair: str, stage: str) -> dict:
    """The retention of one stage of an experiment and pair: the defaults ←
    the top-level ``retention`` ← the stage's own (``stages``, the
    experiment's, the pair's: merged like ``policy``)."""
    own = wconfig.stage_settings(config, experiment, pair, stage).get("retention") or {}
    return {**DEFAULT_RETENTION, **(config.get("retention") or {}), **own}


@dataclass
class Archive:
    experiment: str
    pair: str
    stage: str
    instance: str | None
    directory: str          # the stage (or instance) dir it belongs to
    number: str             # its n in .attempts/<n>
    path: str
    bytes: int
    files: int
    newest: float | None    # epoch seconds
    remove: bool = False    # removed whole
    slim: bool = False      # all but what its history reads removed (``drop``)
    drop: list[str] = field(default_factory=list)   # the files slimming removes, relative to ``path``
    frees: int = 0          # their bytes
    keeps: int = 0          # the files slimming leaves (none: the archive directory goes too)
    why: str = ""


def human(size: float) -> str:
    """A byte count as people read it: 512 B, 1.5 KiB, 2.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def shown(path: str) -> str:
    """A path as the commands show it (local: relative to here)."""
    return stores.shown(path)


def _in_archive(key: str) -> tuple[str, str] | None:
    """(stage dir, n) of a path (a tree's key) in an archive ``<dir>/.attempts/<n>[/...]``."""
    head, sep, tail = key.partition(f"/{ATTEMPTS}/")
    number = tail.split("/", 1)[0]
    return (head, number) if sep and number.isdigit() else None


def _names(value) -> list[str] | None:
    """A selection (one name, some names, or None: all) as a list or None."""
    return [value] if isinstance(value, str) else (list(value) if value else None)


def _stage_dirs(tree, config: dict, experiments, pairs, stages):
    """(experiment, pair, stage, instance, dir) of every stage dir selected
    that exists: a stage's own, and each of its instances."""
    root = config["root"]
    experiments, pairs, stages = _names(experiments), _names(pairs), _names(stages)
    for experiment in experiments or list(config["experiments"]):
        for pair in [*config["experiments"][experiment]["pairs"], layout.ALL_PAIRS]:
            if pairs and pair not in pairs:
                continue
            for stage in stages or list(config["stages"]):
                stage_dir = layout.stage_dir(root, pair, experiment, stage)
                if not tree.isdir(stage_dir):
                    continue
                yield experiment, pair, stage, None, stage_dir
                for instance, directory in tree.state_dirs(stage_dir):
                    if instance is not None:
                        yield experiment, pair, stage, instance, directory


def _refer(needed: dict, key: str, why: str) -> None:
    hit = _in_archive(key)
    if hit:
        needed.setdefault(hit, []).append(why)


def _history(history: dict, logs: dict, tree, directory: str, attempts: list, whose: str) -> None:
    """The archives an attempt history (of a manifest or marker in
    ``directory``) points into (``history``: (dir key, n) → why), and the
    files its ``log`` fields name in them (``logs``: (dir key, n) → paths
    relative to the archive)."""
    for attempt in attempts or []:
        if not isinstance(attempt, dict):
            continue
        hits: dict[tuple[str, str], list[str]] = {}
        for name in ("workspace", "log"):
            value = attempt.get(name)
            where = tree.key(layout.join(directory, value)) if isinstance(value, str) else None
            hit = _in_archive(where) if where else None
            if hit and value.startswith(ATTEMPTS + "/"):
                hits.setdefault(hit, []).append(name)
                head = f"{hit[0]}/{ATTEMPTS}/{hit[1]}/"
                if name == "log" and where.startswith(head):
                    logs.setdefault(hit, set()).add(where[len(head):].replace(os.sep, "/"))
        for hit, names in hits.items():
            history.setdefault(hit, []).append(
                f"attempt {attempt.get('number', '?')}'s {' and '.join(names)} in the current {whose}")


def _readable(rel: str, logs: set[str]) -> bool:
    """Is this file of an archive (relative to it) what its history reads?"""
    return rel in (MANIFEST, RUNNING) or rel == LOGS or rel.startswith(LOGS + "/") or rel in logs


class References:
    """What the live manifests (and the config) need of the archives."""

    def __init__(self, tree, config: dict):
        self.tree = tree
        self.needed: dict[tuple[str, str], list[str]] = {}   # (dir key, n) → why it stays whole
        self.history: dict[tuple[str, str], list[str]] = {}  # (dir key, n) → which history points into it
        self.logs: dict[tuple[str, str], set[str]] = {}      # (dir key, n) → the logs it names there
        # (producer dir key, file relative to it) → [(sha256, consumer)]
        self.inputs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.live: dict[str, dict] = {}                       # dir key → its manifest
        for directory in tree.manifest_dirs():
            try:
                data = tree.manifest(directory)
            except manifest.ManifestError:
                continue
            if data is None:
                continue
            key, consumer = tree.key(directory), shown(directory)
            self.live[key] = data
            _history(self.history, self.logs, tree, directory, data.get("attempts"), "manifest")
            source = data.get("reused_from")
            if isinstance(source, str):
                _refer(self.needed, tree.key(source), f"{consumer} was reused from it")
            for item in data.get("inputs") or []:
                self._input(item, consumer)
        for experiment, settings in config["experiments"].items():
            for stage, where in (settings.get("reuse") or {}).items():
                for pair, source in (where.items() if isinstance(where, dict) else [(None, where)]):
                    if isinstance(source, str) and "/" in source:
                        scope = experiment + (f", {pair}" if pair else "")
                        _refer(self.needed, tree.key(source), f"the config's reuse of {stage} ({scope}) points into it")

    def _input(self, item: dict, consumer: str) -> None:
        if not isinstance(item, dict):
            return
        path, record = item.get("path"), item.get("manifest")
        hits = [_in_archive(self.tree.key(p)) for p in (path, record) if isinstance(p, str)]
        if any(hits):
            for hit in dict.fromkeys(h for h in hits if h):
                self.needed.setdefault(hit, []).append(f"an input of {consumer}")
            return
        if isinstance(path, str) and isinstance(record, str) and item.get("sha256"):
            producer, file_key = self.tree.key(os.path.dirname(record)), self.tree.key(path)
            if file_key.startswith(producer + "/"):
                self.inputs.setdefault((producer, file_key[len(producer) + 1:]), []).append((item["sha256"], consumer))

    def consumers(self, directory: str, archive: str) -> list[str]:
        """The live manifests made from outputs of ``directory`` that are now
        only in this archive of it (see the module's rule)."""
        key = self.tree.key(directory)
        wanted = {rel: uses for (producer, rel), uses in self.inputs.items() if producer == key}
        if not wanted:
            return []
        current = {(o.get("path"), o.get("sha256")) for o in (self.live.get(key) or {}).get("outputs", [])}
        wanted = {rel: [(sha, c) for sha, c in uses if (rel, sha) not in current] for rel, uses in wanted.items()}
        if not any(wanted.values()):
            return []
        try:
            data = self.tree.manifest(archive)
        except manifest.ManifestError:
            return []
        archived = {(o.get("path"), o.get("sha256")) for o in (data or {}).get("outputs", [])}
        return list(dict.fromkeys(c for rel, uses in wanted.items() for sha, c in uses if (rel, sha) in archived))


def plan(config: dict, experiments=None, pairs=None, stages=None, now: float | None = None,
         tree=None) -> list[Archive]:
    """Every archive of the selected stage dirs, each with whether it goes
    (``remove``) or is slimmed (``slim``: ``drop`` the files that go,
    ``frees`` their bytes), and why (``why``). Changes nothing. ConfigError
    for a name that isn't configured."""
    wconfig.check_names(config, experiments, pairs, stages, allow_all_pairs=True)
    tree = tree or stores.store_for(config["root"])
    verdict = _Verdict(tree, config, time.time() if now is None else now)
    found = []
    for experiment, pair, stage, instance, directory in _stage_dirs(tree, config, experiments, pairs, stages):
        numbers = tree.archives(directory)
        if numbers:
            found += verdict.stage_dir(experiment, pair, stage, instance, directory, numbers)
    found.sort(key=lambda a: (a.directory, int(a.number)))
    return found


def _kept_why(live, keep_last: int | None, keep_days: float | None, rank: int, age: float | None) -> str | None:
    """Why the retention keeps an archive (``rank``: 0 the newest of its
    stage dir; ``age`` in days, None unknown), or None when it is beyond it."""
    if live:
        return f"an attempt is running in its stage dir ({live.where})"
    if keep_last is None:
        return "keep_last: null keeps every archive"
    if rank < keep_last:
        return f"among the newest {keep_last}"
    if keep_days is not None and (age is None or age <= keep_days):
        return f"archived {age:.1f} day(s) ago, within keep_days {keep_days:g}" if age is not None \
            else f"its age is unknown (keep_days {keep_days:g})"
    return None


class _Verdict:
    """``plan``'s verdict on each archive of a stage dir: kept by the
    retention, or beyond it and then kept for what reads it, slimmed to
    what its history reads, or removed."""

    def __init__(self, tree, config: dict, now: float):
        self.tree, self.config, self.now = tree, config, now
        self._references: References | None = None

    @property
    def references(self) -> References:
        """Read when some archive is beyond the retention."""
        if self._references is None:
            self._references = References(self.tree, self.config)
        return self._references

    def stage_dir(self, experiment: str, pair: str, stage: str, instance: str | None, directory: str,
                  numbers: list[str]) -> list[Archive]:
        keep = retention(self.config, experiment, pair, stage)
        keep_last, keep_days = keep["keep_last"], keep["keep_days"]
        life = lifecycle.read(self.tree, directory, self.now)
        own: dict[tuple[str, str], list[str]] = {}
        own_logs: dict[tuple[str, str], set[str]] = {}
        if life.live is None:
            _history(own, own_logs, self.tree, directory, (life.marker or {}).get("attempts"), "_running.json")
        found = []
        for rank, number in enumerate(reversed(numbers)):
            path = layout.join(directory, ATTEMPTS, number)
            size, files, newest = self.tree.usage(path)
            archive = Archive(experiment, pair, stage, instance, directory, number, path, size, files, newest)
            found.append(archive)
            age = None if newest is None else (self.now - newest) / DAY
            why = _kept_why(life.live, keep_last, keep_days, rank, age)
            if why is not None:
                archive.why = why
            else:
                beyond = f"beyond the newest {keep_last}" + (
                    f" and {age:.0f} day(s) old (keep_days {keep_days:g})" if keep_days is not None else "")
                self._beyond(archive, beyond, own, own_logs)
        return found

    def _beyond(self, archive: Archive, beyond: str, own: dict, own_logs: dict) -> None:
        """An archive beyond the retention: kept while another stage's
        manifest reads its outputs, slimmed while a history reads its logs,
        else removed."""
        references = self.references
        key = (self.tree.key(archive.directory), archive.number)
        reasons = list(references.needed.get(key, []))
        reasons += [f"its outputs are inputs of {c} (made before the stage was redone)"
                    for c in references.consumers(archive.directory, archive.path)]
        history = own.get(key, []) + references.history.get(key, [])
        if reasons:
            archive.why = "; ".join(dict.fromkeys(reasons + history))
        elif history:
            logs = own_logs.get(key, set()) | references.logs.get(key, set())
            self._slim(archive, beyond, "; ".join(dict.fromkeys(history)), logs)
        else:
            archive.remove = True
            archive.why = beyond

    def _slim(self, archive: Archive, beyond: str, only: str, logs: set[str]) -> None:
        """Marks the files of an archive that no history reads to go (its
        logs and manifest stay); none left to drop: slimmed already."""
        every = self.tree.file_sizes(archive.path)
        drop = {rel: n for rel, n in every.items() if not _readable(rel, logs)}
        if drop:
            archive.slim, archive.drop, archive.frees = True, sorted(drop), sum(drop.values())
            archive.keeps = len(every) - len(drop)
            archive.why = f"{beyond}, but {only}: keeps its {LOGS}/ and {MANIFEST}"
        else:
            archive.why = f"slimmed already (only its {LOGS}/ and {MANIFEST} are left): {only}"


def remove(config: dict, archives: list[Archive], tree=None) -> list[tuple[Archive, str]]:
    """Remove the archives ``plan`` marked, and slim those it marked so;
    returns (archive, problem) for those that could not be (an attempt
    started in the stage dir since the plan, on a local root; an error)."""
    tree = tree or stores.store_for(config["root"])
    problems = []
    for archive in archives:
        if not (archive.remove or archive.slim):
            continue
        if not tree.snapshot:   # a bucket store's markers are its snapshot's: the plan's answer stands
            live = lifecycle.at(archive.directory).live   # as it is now, not as planned
            if live:
                problems.append((archive, f"an attempt started in its stage dir ({live.where}); left"))
                continue
        try:
            if archive.remove or not archive.keeps:
                tree.remove_tree(archive.path)
            else:
                tree.remove_files(archive.path, archive.drop)
        except Exception as exc:
            problems.append((archive, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
    return problems


def prune(config: dict, experiments=None, pairs=None, stages=None, dry_run: bool = False,
          now: float | None = None) -> tuple[list[Archive], list[tuple[Archive, str]]]:
    """``plan`` and, unless ``dry_run``, ``remove``: (every archive, problems)."""
    tree = stores.store_for(config["root"])
    archives = plan(config, experiments, pairs, stages, now, tree)
    return archives, ([] if dry_run else remove(config, archives, tree))


def report(archives: list[Archive], problems: list[tuple[Archive, str]], dry_run: bool) -> tuple[list[str], str | None]:
    """What ``waypost prune`` prints: a line per archive (what was done to
    it, or would be, and why), then the totals; and the line for stderr when
    some could not be removed or slimmed (None when all could)."""
    failed = {id(a): why for a, why in problems}
    removed, slimmed = ("would remove", "would slim") if dry_run else ("removed", "slimmed")
    lines = [_archive_line(a, failed, removed, slimmed) for a in archives]
    gone = [a for a in archives if a.remove and id(a) not in failed]
    thin = [a for a in archives if a.slim and id(a) not in failed]
    kept = [a for a in archives if id(a) in failed or not (a.remove or a.slim)]
    lines.append(f"{removed} {len(gone)} archive(s), {human(sum(a.bytes for a in gone))}; "
                 f"{slimmed} {len(thin)}, {human(sum(a.frees for a in thin))}; "
                 f"kept {len(kept)}, {human(sum(a.bytes for a in kept))}")
    trouble = f"waypost: {len(problems)} archive(s) could not be removed or slimmed (above)" if problems else None
    return lines, trouble


def _archive_line(a: Archive, failed: dict[int, str], removed: str, slimmed: str) -> str:
    """``report``'s line for one archive (``failed``: id → the problem of
    those that could not be removed or slimmed)."""
    why = failed.get(id(a), a.why)
    if id(a) in failed:
        head = "not removed" if a.remove else "not slimmed"
    else:
        head = removed if a.remove else slimmed if a.slim else "keep"
    size = f"{human(a.bytes)}, {a.files} file(s)"
    if a.slim and id(a) not in failed:
        size = f"{human(a.frees)} of {human(a.bytes)}, {len(a.drop)} of {a.files} file(s)"
    return f"{head:<12}  {shown(a.path)}  {size}: {why}"


def sizes(config: dict, experiments=None, pairs=None) -> list[dict]:
    """Per stage dir with archives: how many and their bytes (for
    ``waypost status --sizes``; only then are archives walked)."""
    wconfig.check_names(config, experiments, pairs, allow_all_pairs=True)
    tree = stores.store_for(config["root"], snapshot=True)
    rows = []
    for experiment, pair, stage, instance, directory in _stage_dirs(tree, config, experiments, pairs, None):
        numbers = tree.archives(directory)
        if numbers:
            total = sum(tree.usage(layout.join(directory, ATTEMPTS, n))[0] for n in numbers)
            rows.append({"experiment": experiment, "pair": pair, "stage": stage, "instance": instance,
                         "path": layout.join(directory, ATTEMPTS), "archives": len(numbers), "bytes": total})
    return rows

