"""``waypost find --html``: the catalog as one self-contained HTML page.

A pure function of the rows ``waypost find`` found (``Catalog.find`` plus
``differs``/``compared_with``), the config's root and experiments and the
stage graph: no file access, no external assets, nothing loaded from the
network, so the page works opened from a file or from a bucket.

The rows travel as JSON in a ``<script type="application/json">`` element
(``<``, ``>`` and ``&`` written as ``\\u003c`` etc., so no string can close
it) that the page's own script reads with ``JSON.parse``; every value from a
manifest reaches the page through ``textContent`` or an attribute, never as
markup or code. Manifests from a shared bucket are untrusted input.

Built for 100,000 manifests: the rows are a compact array of arrays, sorted
here by group (stage in workflow order, pair) and newest first, and each
input is already resolved to the row it was made from (an index). The page
filters the in-memory array in one pass and renders only the first
``PAGE`` candidates of the result ("show more" adds the next ones). Its
state (filters, the candidate whose lineage is open, the experiment a reuse
pointer is for) lives in the URL hash, so a view can be shared as a link.
"""

from __future__ import annotations

import html
import json
import posixpath

from waypost import stores
from waypost.cli import pages
from waypost.model import layout
from waypost.state import status

PAGE = 200

# The order of each row's fields in the embedded JSON (the page reads them by name).
COLUMNS = ("location", "root", "experiment", "pair", "stage", "instance", "state", "created", "attempts",
           "config_hash", "code_version", "reused_from", "source", "adopted", "provisional", "archived",
           "archive", "source_created", "differs", "compared_with", "inputs", "wildcards")


def _inputs_of(row: dict) -> list[dict]:
    inputs = row.get("inputs") or []
    if isinstance(inputs, str):   # a cache that keeps them as JSON text
        try:
            inputs = json.loads(inputs)
        except ValueError:
            return []
    return [i for i in inputs if isinstance(i, dict)]


def stage_dir_of(row: dict) -> str:
    """The stage (or instance) directory a row is of: its location, or for an
    archived attempt the directory above its ``.attempts/<n>``."""
    location = row["location"]
    if row.get("archived"):
        archive = row.get("archive") or ""
        if archive and location.endswith("/" + archive):
            return location[:-len(archive) - 1]
        marker = f"/{layout.ATTEMPTS}/"
        if marker in location:
            return location.rsplit(marker, 1)[0]
    return location


def _ancestors(path: str, levels: int = 4) -> list[str]:
    out = []
    for _ in range(levels):
        out.append(path)
        parent = posixpath.dirname(path)
        if parent == path or parent in ("", "gs:", "gs:/"):
            break
        path = parent
    return out


class _Links:
    """Finds the row an input's manifest names: the stage directory's current
    row, or, when that one is newer than the row made from it, the archived
    attempt that was current then. A relative manifest path (local runs
    record them relative to their working directory) is tried against the
    directories above the consuming row's root."""

    def __init__(self, rows: list[dict]):
        self.by_dir: dict[str, list[int]] = {}
        self.current: dict[str, int] = {}
        for i, row in enumerate(rows):
            if not row.get("archived"):
                self.current[row["location"]] = i
            self.by_dir.setdefault(stage_dir_of(row), []).append(i)
        self.rows = rows
        self._dirs: dict[tuple[str, str], str | None] = {}

    def _directory(self, manifest: str, root: str) -> str | None:
        key = (manifest, root)
        if key not in self._dirs:
            directory = manifest[:-len(layout.MANIFEST) - 1] if manifest.endswith("/" + layout.MANIFEST) else manifest
            if stores.is_absolute(directory):
                tries = [stores.normalised(directory)]
            else:
                tries = [stores.resolve(base, directory) for base in _ancestors(root)]
            self._dirs[key] = next((t for t in tries if t in self.by_dir), None)
        return self._dirs[key]

    def find(self, manifest: str, consumer: dict) -> int | None:
        directory = self._directory(manifest, consumer.get("root") or "")
        if directory is None:
            return None
        made = consumer.get("created") or ""
        options = self.by_dir[directory]
        before = [i for i in options if (self.rows[i].get("created") or "") <= made]
        pick = before or options
        return max(pick, key=lambda i: (self.rows[i].get("created") or "", not self.rows[i].get("archived")))


def _stage_order(rows: list[dict], parents: dict | None) -> list[str]:
    order = list(parents or {})
    seen = set(order)
    return order + sorted({r["stage"] for r in rows if r.get("stage") and r["stage"] not in seen})


def build(rows: list[dict], *, root: str, experiments: dict[str, list[str]], parents: dict | None = None,
          roots: list[str] | None = None, filters: dict | None = None, generated: str = "") -> dict:
    """The page's data: ``rows`` as ``waypost find`` found them (newest
    first), ``root`` the pipeline's own root (as the catalog names it),
    ``experiments`` the configured experiments and their pairs, ``parents``
    the stage graph (stage → the stages it takes inputs from)."""
    stages = _stage_order(rows, parents)
    rank = {s: n for n, s in enumerate(stages)}
    # Newest first within each group (stable sorts: location, then created descending, then the group).
    ordered = sorted(rows, key=lambda r: r.get("location") or "")
    ordered.sort(key=lambda r: r.get("created") or "", reverse=True)
    ordered.sort(key=lambda r: (rank.get(r.get("stage"), len(rank)), r.get("pair") or ""))
    links = _Links(ordered)
    learned: dict[str, set[str]] = {}   # without the graph: stage → the stages its rows were made from
    packed = [_packed(row, _packed_inputs(row, ordered, links, learned), links) for row in ordered]
    return {
        "columns": list(COLUMNS), "rows": packed, "root": root, "roots": list(roots or []),
        "experiments": experiments, "stages": stages,
        "parents": {s: sorted(p) for s, p in (parents if parents else learned).items() if s},
        "filters": {k: v for k, v in (filters or {}).items() if v}, "generated": generated, "page": PAGE,
        "initial": initial_view(filters or {}),
        "looks": {state: [look[0], look[2]] for state, look in status.LOOKS.items()},
        "failure_colour": status.FAILURE_LOOK[1], "all_pairs": layout.ALL_PAIRS,
    }


def _packed_inputs(row: dict, ordered: list[dict], links: _Links, learned: dict[str, set[str]]) -> list[list]:
    """A row's inputs as the page holds them: [the row that made it, its
    name in that row's directory, its state], or [its manifest, its path,
    its state] where no row made it; the stages it links to are ``learned``."""
    inputs = []
    for item in _inputs_of(row):
        manifest, path, state = item.get("manifest"), item.get("path") or "", item.get("state")
        link = links.find(manifest, row) if isinstance(manifest, str) and manifest else None
        if link is not None:
            learned.setdefault(row.get("stage"), set()).add(ordered[link].get("stage"))
            directory = stage_dir_of(ordered[link])
            name = path[len(directory) + 1:] if path.startswith(directory + "/") else None
            if name is None and not stores.is_absolute(path):
                name = posixpath.basename(path)
            inputs.append([link, name if name is not None else path, state])
        else:
            inputs.append([manifest if isinstance(manifest, str) else None, path, state])
    return inputs


def _packed(row: dict, inputs: list[list], links: _Links) -> list:
    """A row as the page holds it: its values in ``COLUMNS``' order."""
    source = row.get("reused_from")
    return [
        row.get("location"), row.get("root"), row.get("experiment"), row.get("pair"), row.get("stage"),
        row.get("instance"), row.get("state"), row.get("created"), row.get("attempts"),
        row.get("config_hash"), row.get("code_version"), source,
        links.current.get(source.rstrip("/")) if isinstance(source, str) else None,
        bool(row.get("adopted")), bool(row.get("provisional")), bool(row.get("archived")),
        row.get("archive"), row.get("source_created"), row.get("differs"), row.get("compared_with"), inputs,
        row.get("wildcards")]


def embed(data: dict) -> str:
    """JSON text safe inside a ``<script>`` element: no ``<``, ``>`` or ``&``
    (each is written as its ``\\uXXXX`` escape, which JSON.parse reads back)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


CSS = pages.text("find.css")

SCRIPT = pages.text("find.js")


#: find's options → the page's filter keys (its URL hash)
VIEW_KEYS = {"experiment": "experiment", "pair": "pair", "stage": "stage", "state": "state", "since": "from",
             "until": "to", "config_hash": "hash"}


def initial_view(filters: dict) -> dict:
    """The page's first view from find's command-line filters: exact names
    select in the page's filters; a shell pattern (train_*) goes to its
    search box without its pattern characters."""
    view = {}
    for option, key in VIEW_KEYS.items():
        value = filters.get(option)
        if not value:
            continue
        if key in ("experiment", "pair", "stage") and any(c in value for c in "*?["):
            view["q"] = (view.get("q", "") + " " + value.translate({ord(c): " " for c in "*?[]"})).strip()
        else:
            view[key] = value
    return view


def _filters_line(filters: dict) -> str:
    if not filters:
        return ""
    given = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in filters.items() if v)
    return f' · first shown as on the command line: <code>{html.escape(given)}</code>'


def render(data: dict) -> str:
    """The whole page over ``build``'s data."""
    roots = ", ".join(f"<code>{html.escape(r)}</code>" for r in data["roots"]) or "–"
    field = '<label>{label}<select id="f-{key}" name="{key}"></select></label>'
    selects = "".join(field.format(label=label, key=key) for key, label in
                      (("experiment", "experiment"), ("pair", "pair"), ("stage", "stage"), ("state", "state")))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>waypost find</title>\n'
        f'<style>{CSS}</style></head>\n<body>\n<h1>waypost find</h1>\n'
        f'<p class="meta">{len(data["rows"]):,} stage(s) in {len(data["roots"])} root(s): {roots}'
        f'{_filters_line(data.get("filters") or {})}'
        + (f' · made {html.escape(data["generated"])}' if data.get("generated") else "") +
        ' · click a stage for its lineage and a reuse pointer; the address keeps the view</p>\n'
        f'<form id="filters" autocomplete="off">{selects}'
        '<label>created from<input id="f-from" name="from" type="text" placeholder="2026-11-01" size="10"></label>'
        '<label>created to<input id="f-to" name="to" type="text" placeholder="2026-11-30" size="10"></label>'
        '<label>config hash<input id="f-hash" name="hash" type="text" size="10"></label>'
        '<label>search<input id="f-q" name="q" type="search" placeholder="path, setting, code…" size="18"></label>'
        '<button type="button" id="reset">reset</button></form>\n'
        '<p id="summary"></p>\n<main class="closed"><div id="results"></div><aside id="lineage"></aside></main>\n'
        '<noscript>This page needs JavaScript (it runs only its own script, inline).</noscript>\n'
        f'<script type="application/json" id="catalog-data">{embed(data)}</script>\n'
        f'<script>{SCRIPT}</script>\n</body></html>\n')
