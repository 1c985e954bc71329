"""The catalog: every stage manifest under any number of roots, in a local
SQLite cache, so "what already exists" is one indexed query.

Roots are local paths or ``gs://bucket/prefix`` URIs (read through fsspec).
A refresh lists each root's current manifests with a cheap stamp (mtime,
size and inode locally; the object generation on GCS) and reads only those
whose stamp changed since the last refresh; manifests that disappeared are
dropped. A manifest that can't be read or parsed is recorded as a problem
and skipped, never fatal. Large local trees are listed and read by worker
processes (a cold build of 100,000 manifests is otherwise one core's JSON
parsing); the rows go into SQLite in one transaction, in key order.

Every manifest counts: a stage's current one (``{root}/{pair}/{experiment}/
{stage}[/{instance}]/_manifest.json``) and the archived ones of earlier
workspaces (``.../{stage}[/{instance}]/.attempts/<n>/_manifest.json``, found
in the same walk or listing), whose rows say ``archived`` (and which
``archive``); their location is the archive directory, reusable like any
other. A row keeps the manifest's inputs (where each came from), so
``lineage`` walks a stage back to the first one, across roots and reuse.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field

from waypost import stores
from waypost.model import layout, manifest
from waypost.model.job import wildcards_named
from waypost.model.layout import CATALOG_DB
from waypost.model.parallel import chunks, in_workers
from waypost.model.records import Manifest

SCHEMA = """
CREATE TABLE IF NOT EXISTS manifests (
    location     TEXT PRIMARY KEY,   -- the stage (or instance) directory
    root         TEXT NOT NULL,
    stamp        TEXT NOT NULL,      -- changes whenever the manifest does
    experiment   TEXT, pair TEXT, stage TEXT, instance TEXT,
    state        TEXT, created TEXT, attempts INTEGER,
    config_hash  TEXT, code_version TEXT, reused_from TEXT, adopted INTEGER,
    provisional  INTEGER,
    settings     TEXT,               -- JSON
    archive      TEXT,               -- ".attempts/<n>" for an archived manifest, else NULL
    source_created TEXT,             -- a reused copy: when its source was made
    inputs       TEXT,               -- JSON: [{path, manifest, state}]
    wildcards    TEXT                -- JSON: a job of a rule in its own layout's wildcards (its name), else NULL
);
CREATE TABLE IF NOT EXISTS problems (
    location TEXT PRIMARY KEY, root TEXT NOT NULL, stamp TEXT NOT NULL, error TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS roots (
    root TEXT PRIMARY KEY, refreshed REAL, manifests INTEGER
);
"""
INDEXES = {"manifests_stage": "stage, pair, created", "manifests_experiment": "experiment, pair, stage",
           "manifests_root": "root", "manifests_created": "created", "manifests_config": "config_hash"}
COLUMNS = ("location", "root", "stamp", "experiment", "pair", "stage", "instance", "state", "created",
           "attempts", "config_hash", "code_version", "reused_from", "adopted", "provisional", "settings",
           "archive", "source_created", "inputs", "wildcards")
# The cache file's layout (SQLite's user_version): a file of another version
# is dropped and rebuilt at the next refresh, never misread.
VERSION = 3


@dataclass
class Refresh:
    """What one refresh of one root did."""
    root: str
    listed: int = 0      # manifests found
    read: int = 0        # manifests read (new or changed)
    removed: int = 0     # manifests gone since the last refresh
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def archive_of(location: str) -> str | None:
    """``.attempts/<n>`` when a location is an archived workspace, else None."""
    parts = location.rstrip("/").rsplit("/", 2)
    return f"{layout.ATTEMPTS}/{parts[2]}" if len(parts) == 3 and parts[1] == layout.ATTEMPTS else None


def _workdir(root: str, paths: list[str]) -> str | None:
    """Where the run that wrote a manifest ran, from the relative manifest
    paths of its inputs (``results/en-xa/exp1/clean_corpus/_manifest.json``
    when the config's root was ``results``): the directory whose
    ``{config root}`` is this root."""
    for path in paths:
        parts = path.split("/")
        for tail in (4, 5):   # pair/experiment/stage[/instance]/_manifest.json
            if len(parts) < tail:
                continue
            written = os.path.normpath("/".join(parts[:len(parts) - tail]) or ".")
            if written == ".":
                return root
            if root.endswith(os.sep + written):
                return root[:-len(written) - 1] or os.sep
    return None


def _inputs(root: str, data: Manifest) -> list[dict]:
    """A manifest's inputs as {path, manifest, state}, a path relative to
    the run's working directory made absolute when that can be told (the
    catalog's locations are)."""
    inputs = [i for i in data.get("inputs") or [] if isinstance(i, dict)]
    relative = [i["manifest"] for i in inputs if isinstance(i.get("manifest"), str)
                and not stores.is_absolute(i["manifest"])]
    # (no run works in a root reached only through an API: relative paths there came from elsewhere)
    workdir = _workdir(root, relative) if relative and not stores.needs_mirror(root) else None

    def where(path):
        return stores.resolve(workdir, path) if workdir and isinstance(path, str) else path
    return [{"path": where(i.get("path")), "manifest": where(i.get("manifest")), "state": i.get("state")}
            for i in inputs]


_sorted_json = json.JSONEncoder(sort_keys=True).encode   # json.dumps(sort_keys=True), without a new encoder each call


def _row(location: str, root: str, stamp: str, data: Manifest) -> tuple:
    reused = data.get("reused_manifest")
    inputs = _inputs(root, data)
    source = reused if isinstance(reused, dict) else {}
    return (location, root, stamp, data.get("experiment"), data.get("pair"), data.get("stage"),
            data.get("instance"), data.get("state"), data.get("created"), len(data.get("attempts") or []),
            data.get("config_hash"), data.get("code_version"), data.get("reused_from"),
            int(bool(data.get("adopted"))), int(bool(data.get("provisional"))),
            _sorted_json(data.get("settings") or {}), archive_of(location),
            (data.get("source_created") or source.get("created")) if data.get("reused_from") else None,
            json.dumps(inputs) if inputs else "[]", _wildcards(data))


def _wildcards(data: Manifest) -> str | None:
    """A job of a rule in its own layout: the wildcards it is named by, as JSON; else None."""
    wildcards = wildcards_named(data)
    return None if wildcards is None else json.dumps(wildcards)


def _entries(root: str, read) -> tuple[list[tuple], list[tuple]]:
    """(rows, problems) from (location, stamp, bytes or the exception) triples."""
    rows, problems = [], []
    for location, stamp, text in read:
        path = layout.join(location, layout.MANIFEST)
        try:
            if isinstance(text, manifest.ManifestError):
                raise text
            if isinstance(text, Exception):
                raise manifest.ManifestError(f"{path}: unreadable manifest ({text})")
            rows.append(_row(location, root, stamp, manifest.parse(text, path, bulk=True)))
        except manifest.ManifestError as exc:
            problems.append((location, root, stamp, str(exc)))
    return rows, problems


def _load(store, directories: list[str]) -> tuple[list[tuple], list[tuple]]:
    """A worker's share: read and parse these manifests of ``store``."""
    return _entries(store.root, store.read_manifests(directories))


def _list_and_load(store, group: list[str]) -> tuple[list[tuple], list[tuple]]:
    """A worker's share of a cold build: list one part of the root, then read
    and parse its manifests (in one go: no listing of the whole root to wait
    for, nor to send back and forth)."""
    return _load(store, store.listed_in(group))


def _changes(root_key: str, known: dict[str, str]):
    """What a refresh of a root must write, from its rows' stamps ``known``:
    (cold, listed {location: stamp}, changed locations, (rows, problems)
    parts, loaded as they are taken). A cold build of a root read by worker
    processes lists and reads each part of it in one go, each manifest
    stamped as it is read: its ``listed`` stays empty."""
    refused: dict[str, tuple[str, str]] = {}
    try:
        store = stores.store_for(root_key, quiet=True)
        cold = not known and store.parallel_reads
        listed = {} if cold else store.listed_manifests(refused)
        groups, parallel = store.manifest_groups() if cold else ([], False)
    except Exception as exc:  # a root that can't be listed is reported, the others still refresh
        raise stores.explain(exc, root_key) from None
    if cold:
        return True, listed, [], in_workers(_list_and_load, store, groups, parallel)
    # In key order: SQLite inserts rows fastest that way (3× for 100,000).
    changed = sorted(loc for loc, stamp in listed.items() if known.get(loc) != stamp)
    if store.parallel_reads:
        loaded = in_workers(_load, store, chunks(changed, CHUNK), len(changed) >= PARALLEL_FROM)
    else:
        loaded = [_entries(root_key, store.read_manifests(changed, listed))]
    if refused:   # never read: problems of their own, as if read
        unread = sorted(loc for loc, (stamp, _) in refused.items() if known.get(loc) != stamp)
        loaded = [*loaded, ([], [(loc, root_key, refused[loc][0], refused[loc][1]) for loc in unread])]
        listed = {**listed, **{loc: stamp for loc, (stamp, _) in refused.items()}}
        changed += unread
    return False, listed, changed, loaded


# Many local manifests are read and parsed by worker processes, in chunks
# the main process takes in order as they come (and inserts while the
# workers go on); below PARALLEL_FROM, starting workers costs more than it
# saves.
CHUNK = 2000
PARALLEL_FROM = 5000


class Catalog:
    def __init__(self, path: str = CATALOG_DB):
        self.path = path
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.db = sqlite3.connect(path)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        if self.db.execute("PRAGMA user_version").fetchone()[0] != VERSION:
            with self.db:   # an older (or newer) layout: rebuilt from the roots, not misread
                for table in ("manifests", "problems", "roots"):
                    self.db.execute(f"DROP TABLE IF EXISTS {table}")
                self.db.execute(f"PRAGMA user_version = {VERSION}")
        self.db.executescript(SCHEMA)
        self._index()

    def _index(self) -> None:
        for name, columns in INDEXES.items():
            self.db.execute(f"CREATE INDEX IF NOT EXISTS {name} ON manifests ({columns})")

    def close(self) -> None:
        self.db.close()

    # --- refresh ---------------------------------------------------------
    def refresh(self, root: str) -> Refresh:
        """Bring one root's rows up to date, reading only what changed."""
        started = time.perf_counter()
        root_key = stores.absolute(root)
        result = Refresh(root_key)
        known = dict(self.db.execute("SELECT location, stamp FROM manifests WHERE root = ?", (root_key,)))
        known.update(self.db.execute("SELECT location, stamp FROM problems WHERE root = ?", (root_key,)))
        cold, listed, changed, loaded = _changes(root_key, known)
        gone = [loc for loc in known if loc not in listed]
        stale = [(loc,) for loc in changed + gone if loc in known]
        with self.db:
            for table in ("manifests", "problems"):
                self.db.executemany(f"DELETE FROM {table} WHERE location = ?", stale)
            self._insert(loaded, result, fresh=not known and self.count() == 0)
            count = self.db.execute("SELECT COUNT(*) FROM manifests WHERE root = ?", (root_key,)).fetchone()[0]
            self.db.execute("INSERT OR REPLACE INTO roots VALUES (?, ?, ?)", (root_key, time.time(), count))
        result.listed = result.read if cold else len(listed)
        result.removed = len(gone)
        result.seconds = time.perf_counter() - started
        return result

    def _insert(self, loaded, result: Refresh, fresh: bool) -> None:
        """The (rows, problems) parts ``loaded``, into the open transaction. A
        new cache (``fresh``) fills ~25% faster without its indexes, made once
        the rows are in (were it cut short, the next Catalog() makes them)."""
        for name in INDEXES if fresh else ():
            self.db.execute(f"DROP INDEX IF EXISTS {name}")
        for chunk_rows, chunk_problems in loaded:
            self.db.executemany(f"INSERT INTO manifests VALUES ({','.join('?' * len(COLUMNS))})", chunk_rows)
            self.db.executemany("INSERT INTO problems VALUES (?, ?, ?, ?)", chunk_problems)
            result.read += len(chunk_rows) + len(chunk_problems)
            result.problems += [p[3] for p in chunk_problems]
        if fresh:
            self._index()

    def forget_others(self, roots: list[str]) -> None:
        """Drop the rows of roots no longer configured."""
        keys = [stores.absolute(r) for r in roots]
        marks = ",".join("?" * len(keys))
        with self.db:
            for table in ("manifests", "problems", "roots"):
                self.db.execute(f"DELETE FROM {table} WHERE root NOT IN ({marks})", keys)

    # --- queries ---------------------------------------------------------
    def find(self, *, stage: str | None = None, pair: str | None = None, experiment: str | None = None,
             state: str | None = None, since: str | None = None, until: str | None = None,
             config_hash: str | None = None, root: str | None = None, limit: int | None = None,
             archived: bool = True, instance: list[str] | None = None) -> list[dict]:
        """Manifests matching every given filter, newest first. ``pair``,
        ``stage`` and ``experiment`` take shell-style patterns (``en-*``),
        ``instance`` a list of names or patterns (any of them);
        ``since``/``until`` are ISO dates or times (UTC); without
        ``archived``, only current manifests (no ``.attempts/<n>``)."""
        where, args = [], []
        for column, value in (("stage", stage), ("pair", pair), ("experiment", experiment)):
            if value is not None:
                where.append(f"{column} GLOB ?" if any(c in value for c in "*?[") else f"{column} = ?")
                args.append(value)
        if instance:
            where.append("(" + " OR ".join("instance GLOB ?" if any(c in v for c in "*?[") else "instance = ?"
                                           for v in instance) + ")")
            args += [v.replace("[!", "[^") for v in instance]   # (SQLite's GLOB negates with ^)
        for column, value in (("state", state), ("config_hash", config_hash), ("root", root)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since:
            where.append("created >= ?")
            args.append(since)
        if until:
            where.append("created < ?")
            args.append(until)
        if not archived:
            where.append("archive IS NULL")
        sql = "SELECT * FROM manifests" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY created DESC, location"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [_item(row) for row in self.db.execute(sql, args)]

    def instances(self) -> dict[str, set[str]]:
        """Every instance name the catalog holds, stage by stage."""
        found: dict[str, set[str]] = {}
        for stage, instance in self.db.execute(
                "SELECT DISTINCT stage, instance FROM manifests WHERE instance IS NOT NULL"):
            found.setdefault(stage, set()).add(instance)
        return found

    def get(self, location: str) -> dict | None:
        """The row of one location (a stage, instance or archive directory)."""
        row = self.db.execute("SELECT * FROM manifests WHERE location = ?", (location,)).fetchone()
        return _item(row) if row else None

    def _produced(self, stage_dir: str, before: str | None) -> dict | None:
        """The manifest of ``stage_dir`` that made an input used at
        ``before`` (a consumer's created time): its current one, unless that
        was made later (the stage was redone since), then the newest of its
        archives made by then."""
        current = self.get(stage_dir)
        if current and (not before or (current["created"] or "") <= before):
            return current
        prefix = stage_dir.rstrip("/") + "/" + layout.ATTEMPTS + "/"
        archives = [_item(r) for r in self.db.execute(
            "SELECT * FROM manifests WHERE location > ? AND location < ? ORDER BY created DESC",
            (prefix, prefix + "\U0010ffff"))]
        made = [a for a in archives if not before or (a["created"] or "") <= before]
        if made:
            return made[0]
        return current or (archives[0] if archives else None)   # clocks apart: the nearest there is

    def lineage(self, location: str) -> dict:
        """The chain of manifests a stage was made from, as a tree: each node
        {location, experiment, pair, stage, instance, state, created,
        code_version, config_hash, archived, archive, reused_from,
        source_created, wildcards (a job of a rule in its own layout; else
        None), inputs: [nodes]}, down to stages without inputs. An
        input's node is the manifest that made it (its stage's current one,
        or an archived one when the stage was redone after it was used); a
        reused copy's only node below is its source (``via: "reuse"``). A
        manifest not in the catalog is {location, missing: true}."""
        fields = ("location", "experiment", "pair", "stage", "instance", "state", "created", "code_version",
                  "config_hash", "archived", "archive", "reused_from", "source_created", "root", "wildcards")

        made: dict[str, dict] = {}   # location → its node: a stage many others read is walked once

        def node(row: dict | None, where: str, seen: tuple) -> dict:
            if row is None:
                return {"location": where, "missing": True, "inputs": []}
            here = {k: row.get(k) for k in fields}
            if row["location"] in seen:   # can't happen (a manifest is written after its inputs'): guard anyway
                return {**here, "cycle": True, "inputs": []}
            if row["location"] in made:
                return made[row["location"]]
            made[row["location"]] = here
            seen = seen + (row["location"],)
            children = []
            for item in row["inputs"]:
                if not item.get("manifest"):   # placed by hand: no manifest to follow
                    children.append({"location": item.get("path"), "adopted": True, "via": "input",
                                     "path": item.get("path"), "state": item.get("state"), "inputs": []})
                    continue
                stage_dir = stores.parent(item["manifest"])
                child = node(self._produced(stage_dir, row["created"]), stage_dir, seen)
                children.append({**child, "via": "input", "path": item.get("path")})
            if row.get("reused_from"):
                source = row["reused_from"].rstrip("/")
                children.append({**node(self.get(source), source, seen), "via": "reuse"})
            here["inputs"] = children
            return here

        key = _location(location)
        return node(self.get(key), key, ())

    def problems(self) -> list[dict]:
        return [dict(r) for r in self.db.execute("SELECT * FROM problems ORDER BY location")]

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM manifests").fetchone()[0]


def _item(row: sqlite3.Row) -> dict:
    item = dict(row)
    item["settings"] = json.loads(item["settings"] or "{}")
    item["adopted"] = bool(item["adopted"])
    item["provisional"] = bool(item["provisional"])
    item["archived"] = item["archive"] is not None
    item["inputs"] = json.loads(item["inputs"] or "[]")
    item["wildcards"] = json.loads(item["wildcards"]) if item.get("wildcards") else None
    return item


def _location(path: str) -> str:
    """A stage, instance or archive directory (or its ``_manifest.json``) as
    the catalog keys it: a gs:// URL, or an absolute local path."""
    path = path.rstrip("/") or "/"
    if path.endswith("/" + layout.MANIFEST):
        path = stores.parent(path)
    return stores.absolute(path)


def roots_of(config: dict) -> list[str]:
    """The pipeline's own root, then the config's ``catalog`` roots."""
    return list(dict.fromkeys([config["root"], *config.get("catalog", [])]))
