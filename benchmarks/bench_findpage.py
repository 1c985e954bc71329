"""`waypost find --html`: the catalog page (src/waypost/findpage.py) at
BENCH_FINDPAGE_ROWS (default 100,000) manifests, in headless Chromium.

The rows are what ``waypost find`` hands the page builder: the reference
layout (``{pair}/{experiment}/{stage}[/{instance}]``, 20 stage directories
per experiment × pair, 2 experiments, as in the catalog benchmark), each
stage with the inputs the workflow gives it (resolved by the builder to the
rows that made them), ``differs`` on one row in ten, one stage in fifty
archived and one in fifty a reused copy. Measured:

- building the page (``findpage.build`` + ``render``, in process; the
  catalog query and the settings comparison before it are ``waypost
  find``'s, measured in the catalog benchmark) and its size;
- the page's load in headless Chromium: the page records with
  ``performance.now()`` into ``<body data-*>`` how long parsing the
  embedded JSON took and how long until the first page of candidates was
  on screen (parse, index, filter, render); read back with ``--dump-dom``.
  Target: ≤ 3 s at 100,000 rows. Also with a filtered view and an open
  lineage in the hash (a shared link);
- filtering: with ``#bench`` the page runs a fixed set of filters (none,
  one stage, one stage and pair, a text search, a state, a date range)
  after loading, each a pass over the whole in-memory array plus the
  rendering of its first page. Target: ≤ 200 ms each (feels immediate).

Run alone: ``.venv/bin/python benchmarks/bench_findpage.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Row, Section, log, median, reference_config, show, stage_outputs

ROWS = int(os.environ.get("BENCH_FINDPAGE_ROWS", "100000"))
CHROMIUM = os.environ.get("BENCH_CHROMIUM", "/usr/bin/chromium")
REPETITIONS = 3
LOAD_TARGET_MS = 3000
FILTER_TARGET_MS = 200
STAGES_PER_PAIR = 20

# What each stage of the reference workflow reads (stage → [(stage, file)]); teachers and models expand.
READS = {
    "clean_corpus": [("fetch_corpus", "train.tsv")],
    "train_vocab": [("clean_corpus", "clean.tsv"), ("fetch_corpus", "mono.txt")],
    "train_backward": [("clean_corpus", "clean.tsv"), ("train_vocab", "vocab.json")],
    "translate_mono": [("train_backward", "model.json"), ("fetch_corpus", "mono.txt")],
    "train_teacher": [("clean_corpus", "clean.tsv"), ("translate_mono", "backtranslated.tsv"),
                      ("train_vocab", "vocab.json")],
    "translate_corpus": [("train_teacher", "model.json"), ("clean_corpus", "clean.tsv")],
    "train_student": [("translate_corpus", "distilled.tsv"), ("translate_mono", "backtranslated.tsv"),
                      ("train_vocab", "vocab.json")],
    "evaluate": [("train_student", "model.json"), ("fetch_corpus", "test.tsv")],
    "export": [("train_student", "model.json"), ("train_vocab", "vocab.json")],
}
PARENTS = {"fetch_corpus": set(), **{stage: {s for s, _ in reads} for stage, reads in READS.items()},
           "report": {"evaluate"}}


def pairs_for(rows: int) -> int:
    return max(1, round(rows / (2 * STAGES_PER_PAIR)))


def catalog_rows(root: str, count: int) -> list[dict]:
    """Rows as ``waypost find`` gives them (``Catalog.find`` + differs)."""
    config = reference_config(pairs_for(count))
    rows = []
    for n, (experiment, pair, stage, instance, _files) in enumerate(stage_outputs(config)):
        stage_dir = "/".join([root, pair, experiment, stage])
        inputs = []
        for source, name in READS.get(stage, []):
            dirs = ([f"{root}/{pair}/{experiment}/{source}/{i}" for i in range(config['experiments'][experiment]
                                                                                   ['teachers'])]
                    if source == "train_teacher" else [f"{root}/{pair}/{experiment}/{source}"])
            inputs += [{"path": f"{d}/{name}", "manifest": f"{d}/_manifest.json", "state": "SUCCESS"} for d in dirs]
        location = f"{stage_dir}/{instance}" if instance else stage_dir
        archived = n % 50 == 7
        reused = n % 50 == 13 and not archived
        rows.append({
            "location": location + ("/.attempts/1" if archived else ""), "root": root, "stamp": "1",
            "experiment": experiment, "pair": pair, "stage": stage, "instance": instance,
            "state": "FAILED" if n % 97 == 5 else "SUCCESS",
            "created": f"2026-{1 + n % 12:02d}-{1 + n % 28:02d}T{n % 24:02d}:{n % 60:02d}:00.000+00:00",
            "attempts": 1 + n % 3, "config_hash": f"{n % 7:016x}", "code_version": f"sha256:{n % 5:012x}",
            "reused_from": f"{root}/{pair}/exp0/{stage}" if reused else None, "adopted": False,
            "provisional": False, "settings": {"epochs": 3, "seed": 1}, "archive": ".attempts/1" if archived else None,
            "archived": archived, "source_created": "2026-01-01T00:00:00.000+00:00" if reused else None,
            "inputs": inputs, "differs": ["epochs: 3 → 4"] if n % 10 == 3 else [], "compared_with": experiment})
    rows.sort(key=lambda r: (r["created"], r["location"]), reverse=True)   # as find returns them: newest first
    return rows


class Body(HTMLParser):
    def __init__(self, page: str):
        super().__init__()
        self.attrs: dict = {}
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "body":
            self.attrs = dict(attrs)


def chromium(url: str, profile: Path) -> tuple[float, dict]:
    """(seconds the whole browser run took, the <body> attributes after load)."""
    started = time.perf_counter()
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    body = Body(proc.stdout).attrs
    if body.get("data-ready") != "true":
        raise RuntimeError(f"the page did not finish loading: {body}")
    return seconds, body


def run(ctx: dict) -> Section:
    section = Section("`waypost find --html`")
    if not os.path.exists(CHROMIUM):
        section.skipped = f"{CHROMIUM} is not installed (apt-get install chromium)"
        return section
    from waypost.cli import findpage

    tmp = Path(tempfile.mkdtemp(prefix="bench-findpage-", dir=ctx.get("tmp")))
    root = "/data/results"
    rows = catalog_rows(root, ROWS)
    count = len(rows)
    started = time.perf_counter()
    data = findpage.build(rows, root=root, experiments={"exp0": [], "exp1": []}, parents=PARENTS, roots=[root])
    page = findpage.render(data)
    build_s = time.perf_counter() - started
    path = tmp / "find.html"
    path.write_text(page, encoding="utf-8")
    size_mb = path.stat().st_size / 1e6
    unresolved = sum(1 for r in data["rows"] for i in r[data["columns"].index("inputs")] if not isinstance(i[0], int))
    assert unresolved == 0, f"{unresolved} inputs not linked"
    log(f"findpage: {count:,} rows, built in {build_s:.2f} s, {size_mb:.1f} MB")
    label = f"{count:,} manifests"
    section.rows.append(Row(measure=f"find page: build and render the HTML, {label}", value=build_s, unit="s",
                            target="(informational)", samples={"findpage.build + render": [build_s]},
                            note=f"{size_mb:.1f} MB page, every input linked to its row; in process"))

    url = path.as_uri()
    student = next(r for r in rows if r["stage"] == "train_student" and not r["archived"])
    shared = (f"{url}#stage=train_student&pair={student['pair']}&open={student['location']}")
    loads, parses, walls, views, benches = [], [], [], [], []
    for rep in range(REPETITIONS):
        for which in ((url + "#bench", shared) if rep % 2 == 0 else (shared, url + "#bench")):
            wall, body = chromium(which, tmp / "profile")
            assert int(body["data-total"]) == count, body
            if which == shared:
                assert body["data-matches"] == "2", body   # the pair's student in both experiments
                views.append(float(body["data-load-ms"]) / 1000)
            else:
                loads.append(float(body["data-load-ms"]) / 1000)
                parses.append(float(body["data-parse-ms"]) / 1000)
                walls.append(wall)
                benches.append(json.loads(body["data-bench"]))
    load = median(loads)
    log(f"findpage: load {1000 * load:.0f} ms (JSON.parse {1000 * median(parses):.0f} ms), "
        f"shared view {1000 * median(views):.0f} ms, browser run {median(walls):.1f} s")
    section.rows.append(Row(measure=f"find page: load in headless Chromium (parse, index, first page), {label}",
                            value=1000 * load, unit="ms", target=f"≤ {LOAD_TARGET_MS} ms",
                            met=1000 * load <= LOAD_TARGET_MS,
                            samples={"page load (performance.now)": loads, "of it JSON.parse": parses,
                                     "whole browser run (--dump-dom)": walls},
                            note=f"JSON.parse {1000 * median(parses):.0f} ms of it; the whole headless browser run "
                                 f"(start, read {size_mb:.0f} MB, load, dump) {median(walls):.1f} s"))
    section.rows.append(Row(measure=f"find page: load of a shared link (one stage and pair, lineage open), {label}",
                            value=1000 * median(views), unit="ms", target=f"≤ {LOAD_TARGET_MS} ms",
                            met=1000 * median(views) <= LOAD_TARGET_MS, samples={"page load": views},
                            note="`#stage=train_student&pair=…&open=…`"))
    for n, case in enumerate(benches[0]):
        values = [b[n]["ms"] / 1000 for b in benches]
        passes = [b[n]["filterMs"] / 1000 for b in benches]
        ms = 1000 * median(values)
        name = case["filter"] or "none (everything)"
        if n and case["filter"].startswith("q=") and not benches[0][n - 1]["filter"].startswith("q="):
            name += ", the first search: builds the text index"
        section.rows.append(Row(measure=f"find page: filter `{name}` ({case['matches']:,} match), {label}",
                                value=ms, unit="ms", target=f"≤ {FILTER_TARGET_MS} ms", met=ms <= FILTER_TARGET_MS,
                                samples={"filter + first page": values, "of it the pass over the array": passes},
                                note=f"the pass over the array {1000 * median(passes):.1f} ms, the rest renders "
                                     f"the first {findpage.PAGE} candidates"))
    section.notes.append(
        f"{count:,} rows ({pairs_for(ROWS):,} pairs × 2 experiments × {STAGES_PER_PAIR} stage directories, plus the "
        f"reports), each with its workflow inputs; a {size_mb:.1f} MB page. {REPETITIONS} loads of each view in a "
        "fresh headless Chromium (`--dump-dom`); the page's own `performance.now()` timings, read back from "
        "`<body data-*>`. The page renders only the first "
        f"{findpage.PAGE} candidates of a filtered list (\"show more\" adds more); a filter is one pass over the "
        "in-memory array.")
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return section


if __name__ == "__main__":
    show(run({}))
