"""`waypost find --html`: the page builder alone, then the page over a local
root and a fake-gcs-server root together, as headless Chromium renders it
(driven by the URL hash; read back with --dump-dom)."""

from __future__ import annotations

import json
import re
import shlex
from html.parser import HTMLParser
from pathlib import Path

import yaml
from conftest import read_manifest, waypost, write_config

from waypost.cli import findpage

TITLE = "waypost find"
# Each would change the page if it ever ran or became markup.
HOSTILE = {
    "script": "<script>document.title='pwned-1'</script>",
    "attribute": "\"><img src=x onerror=\"document.title='pwned-2';document.body.setAttribute('data-pwned','2')\">",
    "close": "</script><script>document.title='pwned-3';document.body.append(document.createElement('blink'))</script>",
}


class Node:
    def __init__(self, tag: str, attrs: dict, parent: Node | None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str | None = None, cls: str | None = None, **attrs) -> list[Node]:
        found = []
        for c in self.children:
            if isinstance(c, Node):
                if ((tag is None or c.tag == tag) and (cls is None or cls in c.attrs.get("class", "").split())
                        and all(c.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())):
                    found.append(c)
                found += c.all(tag, cls, **attrs)
        return found

    def one(self, *args, **kwargs) -> Node:
        (node,) = self.all(*args, **kwargs)
        return node


VOID = {"meta", "link", "br", "img", "input", "hr", "col", "source", "wbr"}


class Dom(HTMLParser):
    """The dumped DOM as a tree of elements (attributes, text)."""

    def __init__(self, page: str):
        super().__init__()
        self.root = self.at = Node("#document", {}, None)
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs}, self.at)
        self.at.children.append(node)
        if tag not in VOID:
            self.at = node

    def handle_startendtag(self, tag, attrs):
        self.at.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.at))

    def handle_endtag(self, tag):
        node = self.at
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.at = node.parent

    def handle_data(self, data):
        self.at.children.append(data)


# --- the builder, without a browser ------------------------------------------

def row(location: str, stage: str, created: str, **kw) -> dict:
    base = {"location": location, "root": "/r/results", "experiment": "e", "pair": "p", "stage": stage,
            "instance": None, "state": "SUCCESS", "created": created, "attempts": 1, "config_hash": "c" * 16,
            "code_version": "v1", "reused_from": None, "adopted": False, "provisional": False, "settings": {},
            "differs": [], "compared_with": "e"}
    return {**base, **kw}


def test_builder_links_inputs_orders_groups_and_escapes():
    parents = {"fetch": set(), "train": {"fetch"}}
    rows = [
        row("/r/results/p/e/train", "train", "2026-01-03T00:00:00+00:00",
            inputs=[{"path": "results/p/e/fetch/a.tsv", "manifest": "results/p/e/fetch/_manifest.json",
                     "state": "SUCCESS"},
                    {"path": "/gone/x.tsv", "manifest": "/gone/_manifest.json", "state": "SUCCESS"},
                    {"path": "/by/hand.tsv", "manifest": None, "state": "ADOPTED"}]),
        row("/r/results/p/e/fetch", "fetch", "2026-01-05T00:00:00+00:00"),     # redone after train read it
        row("/r/results/p/e/fetch/.attempts/1", "fetch", "2026-01-01T00:00:00+00:00", archived=True,
            archive=".attempts/1"),
        row("/r/results/p/e2/train", "train", "2026-01-04T00:00:00+00:00", experiment="e2",
            reused_from="/r/results/p/e/train", source_created="2026-01-03T00:00:00+00:00",
            code_version=HOSTILE["close"], differs=[f"epochs: 2 → {HOSTILE['script']}"]),
    ]
    data = findpage.build(rows, root="/r/results", experiments={"e": ["p"], "e2": ["p"]}, parents=parents,
                          roots=["/r/results"], filters={"stage": None})
    at = {c: n for n, c in enumerate(data["columns"])}
    packed = data["rows"]
    # grouped by stage in workflow order, then pair; newest first in each group
    assert [(r[at["stage"]], r[at["created"]][:10]) for r in packed] == [
        ("fetch", "2026-01-05"), ("fetch", "2026-01-01"), ("train", "2026-01-04"), ("train", "2026-01-03")]
    index = {r[at["location"]]: n for n, r in enumerate(packed)}
    train = packed[index["/r/results/p/e/train"]]
    # the relative manifest resolves under the root's working directory, to the archived run that was
    # current when train was made (its stage was redone later); the others stay unresolved
    assert train[at["inputs"]] == [[index["/r/results/p/e/fetch/.attempts/1"], "a.tsv", "SUCCESS"],
                                   ["/gone/_manifest.json", "/gone/x.tsv", "SUCCESS"],
                                   [None, "/by/hand.tsv", "ADOPTED"]]
    copy = packed[index["/r/results/p/e2/train"]]
    assert copy[at["source"]] == index["/r/results/p/e/train"]
    assert data["parents"] == {"fetch": [], "train": ["fetch"]} and data["filters"] == {}

    page = findpage.render(data)
    assert page.count("<script") == 2 and page.count("</script>") == 2   # the data and the page's own
    payload = re.search(r'<script type="application/json" id="catalog-data">(.*?)</script>', page, re.S).group(1)
    assert not set("<>&") & set(payload)
    assert json.loads(payload) == json.loads(json.dumps(data))            # \u003c etc. read back as they were
    assert "onerror" not in page.replace(payload, "")
    # without the graph, the stages' parents come from the inputs found
    learned = findpage.build(rows, root="/r/results", experiments={}, parents=None)
    assert learned["parents"] == {"train": ["fetch"]}


# --- the page in Chromium ------------------------------------------------------

def hostile_manifest(stage_dir: Path, template: dict, **names) -> None:
    """A manifest as a shared bucket might hold: every free field an attack
    (its names, and the paths it records, are checked when it is read:
    ``names`` makes them attacks too, and the manifest unusable)."""
    data = {**template, "experiment": stage_dir.parent.name, "stage": "train_vocab", "instance": None,
            "code_version": HOSTILE["attribute"], "config_hash": HOSTILE["close"],
            "settings": {HOSTILE["script"]: HOSTILE["close"]},
            "inputs": [{"path": f"/nowhere/{HOSTILE['attribute']}/x.txt",
                        "manifest": f"/nowhere/{HOSTILE['attribute']}/_manifest.json", "state": "SUCCESS"}],
            "attempts": [{**(template["attempts"] or [{}])[0], "host": HOSTILE["attribute"]}], **names}
    stage_dir.mkdir(parents=True)
    (stage_dir / "_manifest.json").write_text(json.dumps(data))


def dump(chromium, url: str) -> Dom:
    return Dom(chromium("--dump-dom", "--virtual-time-budget=5000", url))


def test_find_page_over_a_local_and_a_bucket_root(chromium, run_copy, gcs_copy):
    bucket_root = gcs_copy.root
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["catalog"] = [bucket_root]
    config["experiments"]["exp2"] = {"pairs": ["en-xa", "en-xb"], "teachers": 2}
    write_config(run_copy, config)
    local = run_copy / "results"
    template = read_manifest(local / "en-xa/exp1/train_vocab")
    hostile_manifest(local / "en-xa" / "evil" / "train_vocab", template)
    # An attack in its names or paths: refused by the one reader, so on no page.
    hostile_manifest(local / "en-xa" / "worse" / "train_vocab", template, experiment=HOSTILE["script"])
    hostile_manifest(local / "en-xa" / "worst" / "train_vocab", template, inputs=[
        {"path": HOSTILE["attribute"], "manifest": "/nowhere/" + HOSTILE["close"] + "/_manifest.json",
         "state": "SUCCESS"}])
    waypost(run_copy, "rerun", "clean_corpus", "--experiment", "exp1", "--pair", "en-xb")   # an archived run: .attempts/1

    out = waypost(run_copy, "find", "--html", "find.html").stdout
    rows = json.loads(waypost(run_copy, "find", "--json", "--no-refresh").stdout)
    assert out == f"wrote find.html: {len(rows)} stage(s) from 2 root(s)\n"
    url = (run_copy / "find.html").as_uri()

    # Everything: every row of both roots, the first page of them rendered.
    dom = dump(chromium, url)
    body = dom.root.one("body")
    assert dom.root.one("title").text() == TITLE
    assert int(body.attrs["data-total"]) == int(body.attrs["data-matches"]) == len(rows)
    assert {c.attrs["data-location"] for c in dom.root.all("article", "candidate")} == {r["location"] for r in rows}
    assert any(r["location"].startswith(bucket_root) for r in rows) and any(r["location"].startswith(str(local))
                                                                           for r in rows)
    archived = dom.root.one("article", "candidate", data_archived="true")
    assert archived.attrs["data-location"] == str(local / "en-xb/exp1/clean_corpus/.attempts/1")
    assert "archived .attempts/1" in archived.text()

    # The hostile manifest: its fields are text on the page, and nothing of it ran.
    evil = dom.root.one("article", "candidate", data_experiment="evil")
    text = evil.text()
    assert HOSTILE["attribute"] in text and HOSTILE["close"][:8] in text
    assert not dom.root.all("img") and not dom.root.all("blink") and "data-pwned" not in body.attrs
    assert len([s for s in dom.root.all("script") if s.attrs.get("type") != "application/json"]) == 1
    assert not [r for r in rows if "/worse/" in r["location"] or "/worst/" in r["location"]]
    assert not dom.root.all("article", "candidate", data_experiment=HOSTILE["script"])

    # Filtered to one stage and pair by the hash, one candidate's lineage open.
    student = f"{bucket_root}/en-xa/exp1/train_student"
    view = f"{url}#stage=train_student&pair=en-xa&open={student}"
    dom = dump(chromium, view)
    body = dom.root.one("body")
    assert dom.root.one("title").text() == TITLE
    groups = dom.root.all("section", "group")
    assert [(g.attrs["data-stage"], g.attrs["data-pair"]) for g in groups] == [("train_student", "en-xa")]
    shown = {c.attrs["data-location"] for c in dom.root.all("article", "candidate")}
    assert shown == {student, str(local / "en-xa/exp1/train_student")} and body.attrs["data-matches"] == "2"
    panel = dom.root.one("aside", id="lineage")
    assert panel.attrs["data-location"] == student
    assert dom.root.one("article", "candidate", data_location=student).attrs["class"].split() == ["candidate", "open"]
    nodes = panel.all("li", "node")
    assert nodes[0].attrs["data-location"] == student and nodes[0].attrs["data-depth"] == "0"
    assert not panel.all("li", "missing")
    upstream = {"fetch_corpus", "clean_corpus", "train_vocab", "train_backward", "translate_mono",
                "train_teacher", "translate_corpus"}
    assert {n.attrs["data-stage"] for n in nodes[1:]} == upstream
    assert all(n.attrs["data-location"].startswith(bucket_root + "/en-xa/exp1/") for n in nodes)  # the bucket's own
    teacher_nodes = {n.attrs["data-location"] for n in nodes if n.attrs["data-stage"] == "train_teacher"}
    assert teacher_nodes == {f"{bucket_root}/en-xa/exp1/train_teacher/{i}" for i in "01"}

    # The reuse pointer: the bucket is not the pipeline's root, so the source is the stage directory.
    reuse = panel.one("section", id="reuse")
    assert reuse.attrs["data-into"] == "exp2"
    pointer = yaml.safe_load(reuse.one("pre", id="reuse-yaml").text())
    assert pointer == {"experiments": {"exp2": {"reuse": {"train_student": {"en-xa": student}}}}}
    command = reuse.one("pre", id="reuse-command").text()
    words = shlex.split(command)
    assert words[:6] == ["waypost", "reuse", "--into", "exp2", "--from", "exp1"]
    assert words[-4:] == ["--pairs", "en-xa", "--from-root", bucket_root]
    # ... and the command it shows does write that pointer (with what is upstream).
    waypost(run_copy, *words[1:])
    written = yaml.safe_load((run_copy / "reuse" / "exp2.yaml").read_text())["experiments"]["exp2"]["reuse"]
    assert written["train_student"] == pointer["experiments"]["exp2"]["reuse"]["train_student"]
    assert upstream < set(written)

    # A local candidate (the pipeline's own root): the source is the experiment's name.
    vocab = str(local / "en-xb/exp1/train_vocab")
    dom = dump(chromium, f"{url}#stage=train_vocab&open={vocab}&into=exp2")
    reuse = dom.root.one("section", id="reuse")
    assert yaml.safe_load(reuse.one("pre", id="reuse-yaml").text()) == {
        "experiments": {"exp2": {"reuse": {"train_vocab": {"en-xb": "exp1"}}}}}
    assert shlex.split(reuse.one("pre", id="reuse-command").text())[-2:] == ["--pairs", "en-xb"]
    # its lineage reads the archived clean_corpus it was made from (the stage was archived since)
    nodes = dom.root.one("aside", id="lineage").all("li", "node")
    assert {n.attrs["data-location"] for n in nodes if n.attrs.get("data-stage") == "clean_corpus"} == {
        str(local / "en-xb/exp1/clean_corpus/.attempts/1")}

    # The hostile manifest's lineage: its input's manifest is not in the catalog.
    evil_location = str(local / "en-xa/evil/train_vocab")
    dom = dump(chromium, f"{url}#q=evil&open={evil_location}")
    assert dom.root.one("title").text() == TITLE and not dom.root.all("img")
    panel = dom.root.one("aside", id="lineage")
    (missing,) = panel.all("li", "missing")
    assert missing.attrs["data-manifest"] == f"/nowhere/{HOSTILE['attribute']}/_manifest.json"
    assert HOSTILE["attribute"] in missing.text()
    reuse = panel.one("section", id="reuse")
    pointer = yaml.safe_load(reuse.one("pre", id="reuse-yaml").text())
    assert pointer["experiments"][reuse.attrs["data-into"]]["reuse"]["train_vocab"] == {"en-xa": "evil"}
    assert shlex.split(reuse.one("pre", id="reuse-command").text())[5] == "evil"


def test_command_line_filters_are_the_pages_first_view():
    """`find --stage S --html F` embeds the whole catalog (lineage needs it)
    and opens on what the command line asked for; a shell pattern becomes a
    search."""
    from waypost.cli.findpage import initial_view
    assert initial_view({"stage": "train_student", "pair": "en-xa", "since": "2026-11-01",
                         "config_hash": "ab12"}) == {"stage": "train_student", "pair": "en-xa",
                                                     "from": "2026-11-01", "hash": "ab12"}
    assert initial_view({"stage": "train_*", "experiment": None}) == {"q": "train_"}
