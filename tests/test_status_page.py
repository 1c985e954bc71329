"""`waypost status`: the legend, and the `--html` page (its renderer alone,
then the page of a real run as headless Chromium renders it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import yaml
from conftest import REPO, RUNNER, step_input, waypost

from waypost.cli import statuspage
from waypost.model import graph, manifest, parallel, records
from waypost.state import status

ARTIFACTS = REPO / "test-artifacts"


class Elements(HTMLParser):
    """Every element with a ``data-state`` attribute, as its attributes; an
    instance's also name its cell (``cell``: pair, stage)."""

    def __init__(self, page: str):
        super().__init__()
        self.found: list[dict] = []
        self.cell = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-stage" in attrs:
            self.cell = (attrs["data-pair"], attrs["data-stage"])
        if "data-instance" in attrs:
            attrs["cell"] = self.cell
        if "data-state" in attrs:
            self.found.append({"tag": tag, **attrs})

    def where(self, cls: str) -> list[dict]:
        return [e for e in self.found if cls in e.get("class", "").split()]


def attempt(number: int, state: str, **kw) -> dict:
    return {"number": number, "action": "cmd", "state": state, "exit_code": 0 if state == "SUCCESS" else 1,
            "signal": None, "duration_s": 1.25, "host": "node1", "slurm_job_id": "42",
            "log": f"_logs/attempt-{number}.log", **kw}


def one_cell_grid(cell: dict, stage: str = "train") -> dict:
    return {"root": "results", "stages": [stage], "experiments": {"e": {"p": {stage: cell}}}}


def test_page_escapes_free_text():
    cell = {"state": "FAILED", "attempts": 1, "path": "results/p/e/train", "log": "results/<b>/x.log",
            "reason": 'parent "a" <script>alert(1)</script> & more',
            "history": [attempt(1, "FAILED", host="<img src=x>")]}
    page = statuspage.render(one_cell_grid(cell))
    assert "<script>alert" not in page and "<img" not in page and "<b>/" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page and "&lt;img src=x&gt;" in page
    (td,) = Elements(page).where("cell")
    assert td["data-state"] == "FAILED" and td["data-attempts"] == "1"
    assert "state-FAILED" in td["class"].split()


def test_page_shows_each_instance_with_its_history():
    instances = {"0": {"state": "SUCCESS", "attempts": 1, "path": "r/p/e/train/0", "history": [attempt(1, "SUCCESS")]},
                 "1": {"state": "TIMEOUT", "attempts": 3, "path": "r/p/e/train/1",
                       "history": [attempt(n, "TIMEOUT", signal=15, exit_code=None) for n in (1, 2, 3)]}}
    cell = {"state": "TIMEOUT", "attempts": 4, "path": "r/p/e/train", "instances": instances}
    page = statuspage.render(one_cell_grid(cell))
    elements = Elements(page)
    (td,) = elements.where("cell")
    assert [td[f"data-{k}"] for k in ("experiment", "pair", "stage", "state")] == ["e", "p", "train", "TIMEOUT"]
    assert td["data-attempts"] == "3"  # the most of any instance, as in the terminal
    instance_states = {e["data-instance"]: e["data-state"] for e in elements.where("instance")}
    assert instance_states == {"0": "SUCCESS", "1": "TIMEOUT"}
    assert 'data-count-state="TIMEOUT" data-count="1">timeout 1<' in page and ">done 1<" in page
    assert "sig 15" in page and "r/p/e/train/1" in page and "_logs/attempt-3.log" in page
    assert 'id="e/p/train"' in page


def test_manifest_marked_adopted_shows_adopted(tmp_path):
    stage_dir = tmp_path / "p/e/train"
    stage_dir.mkdir(parents=True)
    (stage_dir / "model.json").write_text("{}")
    outputs = manifest.describe_outputs(str(stage_dir), [str(stage_dir / "model.json")])
    data = records.manifest(created=manifest.now_iso(), experiment="e", pair="p", stage="train", instance=None, state="SUCCESS", attempts=[],
                          outputs=outputs, inputs=[], settings={}, config_hash="", code_version="", adopted=True)
    manifest.write_json_atomic(manifest.manifest_path(str(stage_dir)), data)
    expected = {"experiment": "e", "pair": "p", "stage": "train", "instance": None}
    assert status.stage_state(str(stage_dir), expected)["state"] == "adopted"


def fail_teacher(workdir: Path, pair: str, instance: str) -> None:
    """A real failed attempt: the step runner over a command that exits 3."""
    stage_dir = f"results/{pair}/exp1/train_teacher/{instance}"
    step = step_input(stage_dir, "exit 3", [f"{stage_dir}/model.json"], experiment="exp1", pair=pair,
                      stage="train_teacher", instance=instance)
    proc = subprocess.run(RUNNER, input=step, cwd=workdir, capture_output=True, timeout=60)
    assert proc.returncode == 3, proc.stderr


def test_status_page_in_chromium(chromium, run_copy, tmp_path):
    (run_copy / "results/en-xa/exp1/train_student/model.json").unlink()
    fail_teacher(run_copy, "en-xb", "1")

    terminal = waypost(run_copy, "status").stdout
    for state in [*status.LOOKS, *status.FAILURES]:
        assert status.look(state)[0] in terminal
    assert "failed 1 · done 1 ×2" in terminal and "×N: attempts" in terminal

    assert waypost(run_copy, "status", "--html", "page.html").stdout == "wrote page.html\n"
    grid = json.loads(waypost(run_copy, "status", "--json").stdout)
    url = (run_copy / "page.html").as_uri()
    dom = Elements(chromium("--dump-dom", url))

    cells = dom.where("cell")
    funnels = [s for s in grid["stages"] if s in grid["experiments"]["exp1"]["_all"]]
    assert funnels == ["report"]
    assert len(cells) == 2 * (len(grid["stages"]) - 1) + 1 == 21
    states = {(c["data-pair"], c["data-stage"]): c["data-state"] for c in cells}
    assert states == {(pair, stage): cell["state"] for pair, column in grid["experiments"]["exp1"].items()
                      for stage, cell in column.items()}
    assert states.pop(("en-xa", "train_student")) == "missing"
    assert states.pop(("en-xb", "train_teacher")) == "FAILED"
    assert set(states.values()) == {"SUCCESS"}
    teacher = [e for e in dom.where("instance") if e["cell"] == ("en-xb", "train_teacher")]
    assert {e["data-instance"]: e["data-state"] for e in teacher} == {"0": "SUCCESS", "1": "FAILED"}
    assert {e["data-state"] for e in dom.where("swatch")} == {*status.LOOKS, *status.FAILURES}

    # The screenshot shows the failed cell opened (a link to a cell opens it).
    png = tmp_path / "status-page.png"
    chromium(f"--screenshot={png}", "--window-size=1400,1000", f"{url}#exp1/en-xb/train_teacher")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    for target in [ARTIFACTS, os.environ.get("WAYPOST_TEST_ARTIFACTS")]:
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copy(png, Path(target) / png.name)


def test_many_pairs_are_summarized_per_stage_and_one_pair_shown_alone(run_copy):
    """An experiment too wide for the terminal shows, per stage, how many
    pairs are in each state and which are not done; ``--pair`` shows one."""
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    added = [f"en-y{n:02d}" for n in range(28)]          # never run: every stage missing
    config["experiments"]["exp1"]["pairs"] += added
    (run_copy / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    fail_teacher(run_copy, "en-xb", "1")

    text = waypost(run_copy, "status").stdout
    assert "30 pairs, by state" in text and "en-y00" in text
    rows: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line.startswith("│"):                         # a row, or a wrapped row's next line
            stage, pairs = (part.strip() for part in line.split("│")[1:3])
            key = stage or key
            rows[key] = f"{rows.get(key, '')} {pairs}".strip()
    assert rows["fetch_corpus"] == "done 2  missing 28: " + " ".join(added[:6]) + " +22 more"
    assert rows["train_teacher"].startswith("done 1  failed 1: en-xb  missing 28: en-y00")
    assert rows["report"] in ("done", "done*")           # the funnel: its own label
    assert "waypost status --pair PAIR" in text

    one = waypost(run_copy, "status", "--pair", "en-xb").stdout
    assert "en-xb" in one and "failed 1 · done 1" in one and "en-xa" not in one and "all pairs" not in one
    grid = json.loads(waypost(run_copy, "status", "--pair", "en-y03", "--json").stdout)
    assert list(grid["experiments"]["exp1"]) == ["en-y03"]
    assert {cell["state"] for cell in grid["experiments"]["exp1"]["en-y03"].values()} == {"missing"}
    wrong = waypost(run_copy, "status", "--pair", "en-zz", check=False)
    assert wrong.returncode == 2 and "unknown pair 'en-zz'" in wrong.stderr


def test_worker_processes_read_the_same_grid(run_copy, monkeypatch):
    """Many cells are read in worker processes: the grid is the same."""
    (run_copy / "results/en-xa/exp1/train_student/model.json").unlink()
    fail_teacher(run_copy, "en-xb", "1")
    monkeypatch.chdir(run_copy)
    facts = graph.facts(str(run_copy / "config.yaml"), str(REPO / "workflow"))
    cfg = graph.load_config(str(REPO / "workflow"), facts)
    funnels = facts["funnels"]
    alone = status.collect(cfg, funnels)
    started = []
    real = parallel.ProcessPoolExecutor
    monkeypatch.setattr(parallel, "ProcessPoolExecutor", lambda *a, **kw: started.append(a) or real(*a, **kw))
    monkeypatch.setattr(status, "PARALLEL_FROM", 1)
    assert status.collect(cfg, funnels) == alone
    assert started or len(os.sched_getaffinity(0)) == 1
    assert alone["experiments"]["exp1"]["en-xa"]["train_student"]["state"] == "missing"
    assert alone["experiments"]["exp1"]["en-xb"]["train_teacher"]["state"] == "FAILED"
