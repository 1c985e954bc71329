"""Status at the scale of a study (issue 31): a cell counts a stage's
instances per state, `status --failed` names the points not done and why,
`status --attempts` gives a line per point (every attempt when asked), and
`waypost plan` groups a stage's jobs by reason. One real study with every
kind of end: points that succeed, time out (after a restart), fail, are
given up, and extracts skipped over a failed point."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_series import tiny_pipeline

from waypost.ops import plan
from waypost.state import status

VISCOSITY_STUDY = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


rule solve:
    output: field=wp.out("field.txt", instances=wp.grid)
    shell:
        "case {wildcards.instance} in"
        " visc0.2-n10|visc0.2-n11) sleep 20;;"
        " visc0.1-n11) exit 5;;"
        " visc0.2-n9) exit 6;;"
        " *) echo {wildcards.instance} > {output.field};; esac"


rule probe:
    input: field=wp.stage("solve", "field.txt")
    output: probe=wp.out("probe.txt", instances=wp.grid)
    shell: "cat {input.field} > {output.probe}"


rule report:
    input: probes=wp.each("probe", "probe.txt")
    output: report=wp.out("report.txt", funnel=True)
    shell: "cat {input.probes} > {output.report}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''

CONFIG = {
    "root": "results",
    "experiments": {"visc": {"grid": {"visc": [0.1, 0.2], "n": {"from": 8, "to": 11, "count": 4}},
                             "per_instance": {"visc0.2-n9": {"solve": {"policy": {"max_series": 1}}}}}},
    "stages": {
        "solve": {"policy": {"max_attempts": 2, "runtime": 0.02, "runtime_growth": 1.0,
                             "cues": [{"action": "restart", "when": "cmd.TIMEOUT"}]}},
        "probe": {"policy": {"depends": "any(parent.SUCCESS, parent.TIMEOUT)"}},
        "report": {"policy": {"depends": "all_done"}},
    },
}
DONE = ["visc0.1-n8", "visc0.1-n9", "visc0.1-n10", "visc0.2-n8"]
TIMED_OUT = ["visc0.2-n10", "visc0.2-n11"]
FAILED = "visc0.1-n11"
GIVEN_UP = "visc0.2-n9"


def cli(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", *args], cwd=work, capture_output=True, text=True,
                          timeout=180)
    if check and proc.returncode != 0:
        raise AssertionError(f"waypost {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """The viscosity study, run once: every end a point can have."""
    work = tmp_path_factory.mktemp("viscosity")
    run = tiny_pipeline(work, VISCOSITY_STUDY, CONFIG)
    proc = run()
    states = {p.name: json.loads((p / "_manifest.json").read_text())["state"]
              for p in (work / "results/_all/visc/solve").iterdir()}
    assert states == {**dict.fromkeys(DONE, "SUCCESS"), **dict.fromkeys(TIMED_OUT, "TIMEOUT"),
                      FAILED: "FAILED", GIVEN_UP: "FAILED"}, proc.stderr[-3000:]
    return work


def test_a_cell_counts_the_points_in_each_state_worst_first(study):
    grid = cli(study, "status").stdout
    assert "│ solve  │ failed 2 · timeout 2 · done 4, given up 1 ×2 │" in grid, grid
    assert "│ probe  │ skipped 2 · done 6*" in grid            # * : over timed-out points, provisional
    # a point filter counts the points it keeps
    assert "timeout 2 ×2" in cli(study, "status", "--instance", "visc0.2-n1?").stdout
    # the parts, each in its state's look
    cell = json.loads(cli(study, "status", "--json").stdout)["experiments"]["visc"]["_all"]["solve"]
    parts = [(p["text"], p.get("state")) for p in status.label_parts(cell)]
    assert parts == [("failed 2", "FAILED"), (" · ", None), ("timeout 2", "TIMEOUT"), (" · ", None),
                     ("done 4", "SUCCESS"), (", ", None), ("given up 1", "FAILED")]


class Counts(HTMLParser):
    """Each grid cell's counts of instances (data-count-state, data-count)."""

    def __init__(self, page: str):
        super().__init__()
        self.cells: dict[str, dict] = {}
        self.stage = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-stage" in attrs:
            self.stage = attrs["data-stage"]
            self.cells[self.stage] = {}
        if "data-count-state" in attrs:
            self.cells[self.stage][attrs["data-count-state"]] = int(attrs["data-count"])
        if "data-given-up-count" in attrs:
            self.cells[self.stage]["given up"] = int(attrs["data-given-up-count"])


def test_the_page_counts_the_points_in_each_state(study, chromium):
    cli(study, "status", "--html", "study.html")
    dom = chromium("--dump-dom", (study / "study.html").as_uri())
    counts = Counts(dom).cells
    assert counts["solve"] == {"FAILED": 2, "TIMEOUT": 2, "SUCCESS": 4, "given up": 1}
    assert counts["probe"] == {"SKIPPED": 2, "SUCCESS": 6} and counts["report"] == {}
    summary = re.search(r'data-stage="solve".*?<summary>(.*?)</summary>', dom, re.S).group(1)
    assert re.sub(r"<[^>]+>", "", summary).split() == "failed 2 · timeout 2 · done 4, given up 1 ×2".split()


def test_failed_names_each_point_not_done_with_its_state_and_reason(study):
    lines = cli(study, "status", "--failed").stdout.splitlines()
    assert lines[0] == "visc/solve: 4 of 8 not done (failed 2 · timeout 2, given up 1)"
    rows = [line.split(None, 1) for line in lines[1:5]]
    assert [name for name, _ in rows] == [GIVEN_UP, FAILED, *TIMED_OUT]          # worst first, given up first
    assert re.fullmatch(r"failed, given up +×1 +FAILED and no cue matched; given up after 1 series "
                        r"\(max_series 1\)", rows[0][1]), rows[0]
    assert re.fullmatch(r"failed +×1 +FAILED and no cue matched", rows[1][1])
    assert re.fullmatch(r"timeout +×2 +cue 1 \(restart when cmd.TIMEOUT\), but max_attempts \(2\) reached",
                        rows[2][1]), rows[2]
    assert lines[5] == "visc/probe: 2 of 8 not done (skipped 2)"
    assert "parents not accepted by depends (any(parent.SUCCESS, parent.TIMEOUT))" in lines[6]
    assert lines[-1].startswith("6 of 17 stage directories not done")
    assert not any(point in "\n".join(lines) for point in DONE)

    data = json.loads(cli(study, "status", "--failed", "--json").stdout)["failed"]
    assert [(r["stage"], r["instance"], r["state"], r["given_up"]) for r in data] == [
        ("solve", GIVEN_UP, "FAILED", True), ("solve", FAILED, "FAILED", False),
        *(("solve", p, "TIMEOUT", False) for p in TIMED_OUT),
        ("probe", FAILED, "SKIPPED", False), ("probe", GIVEN_UP, "SKIPPED", False)]
    timed_out = data[2]
    assert timed_out["attempts"] == 2 and timed_out["decision"]["action"] == "fail"
    assert timed_out["log"].endswith("visc0.2-n10/_logs/attempt-2.log")

    # with the filters: stages, instances (names and patterns), experiment
    only = json.loads(cli(study, "status", "--failed", "solve", "--instance", "visc0.2-*", "--instance",
                          FAILED, "--experiment", "visc", "--json").stdout)["failed"]
    assert [(r["stage"], r["instance"]) for r in only] == [("solve", p) for p in (GIVEN_UP, FAILED, *TIMED_OUT)]
    assert cli(study, "status", "--failed", "report").stdout.startswith("nothing failed: each of the 1 ")
    for wrong, message in ((["--failed", "sovle"], "unknown stage 'sovle'"),
                           (["--failed", "--experiment", "vsic"], "unknown experiment 'vsic'"),
                           (["--failed", "--instance", "visc0.3-n8"], "unknown instance 'visc0.3-n8'")):
        proc = cli(study, "status", *wrong, check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_attempts_is_a_line_per_point_unless_every_attempt_is_asked_for(study):
    lines = cli(study, "status", "--attempts", "solve").stdout.splitlines()
    assert lines[0] == "visc/solve: failed 2 · timeout 2 · done 4, given up 1"
    assert lines[1].split() == ["instance", "state", "attempts", "series", "last", "next:", "why"]
    rows = {line.split()[0]: line for line in lines[2:10]}
    assert list(rows) == ["visc0.1-n8", "visc0.1-n9", "visc0.1-n10", FAILED, "visc0.2-n8", GIVEN_UP, *TIMED_OUT]
    assert re.search(r"timeout +2 +1 +restart TIMEOUT +fail: cue 1 \(restart when cmd.TIMEOUT\), but "
                     r"max_attempts \(2\) reached$", rows["visc0.2-n11"])
    assert re.search(r"failed, given up +1 +1 +cmd FAILED +fail: FAILED and no cue matched$", rows[GIVEN_UP])
    assert "--all-attempts" in lines[10] and len(lines) == 11

    every = cli(study, "status", "--attempts", "solve", "--all-attempts").stdout
    assert every.count("┃ # ┃") == 8 and "#1 → restart: cue 1 (restart when cmd.TIMEOUT)" in every
    one = cli(study, "status", "--attempts", "solve", "--instance", "visc0.2-n10").stdout   # one point: all
    assert one.count("┃ # ┃") == 1 and "#2 → fail: cue 1" in one and "visc0.2-n11" not in one
    proc = cli(study, "status", "--all-attempts", check=False)
    assert proc.returncode == 2 and "--all-attempts goes with --attempts" in proc.stderr


def test_plan_groups_a_stages_jobs_by_reason(study):
    data = json.loads(cli(study, "plan", "--json").stdout)["next_run"]
    solve = next(r for r in data if r["stage"] == "solve")
    assert [(g["why"], g["count"], sorted(g["instances"])) for g in solve["reasons"]] == [
        ("redo: it ended TIMEOUT and a funnel went on over it", 2, TIMED_OUT),
        ("redo: it ended FAILED and a funnel went on over it", 1, [FAILED])]
    assert GIVEN_UP not in solve["instances"]                    # given up: no run starts it
    text = cli(study, "plan", "--width", "200").stdout
    assert re.search(r"│ visc +│ solve +│ +2 │ visc0.2-n10, visc0.2-n11 +│ redo: it ended TIMEOUT", text), text
    assert text.startswith("next run: 7 job(s)")
    only = json.loads(cli(study, "plan", "--json", "--instance", "visc0.2-n11").stdout)["next_run"]
    assert [(r["stage"], [(g["count"], g["instances"]) for g in r["reasons"]]) for r in only] == [
        ("solve", [(1, ["visc0.2-n11"])]), ("probe", [(1, ["visc0.2-n11"])])]


def test_plan_of_many_points_is_a_row_per_stage_and_names_them_when_asked(tmp_path):
    config = {**CONFIG, "experiments": {"visc": {"grid": {"visc": {"from": 0.1, "to": 0.3, "count": 3},
                                                          "n": {"from": 1, "to": 40, "count": 40}}}}}
    tiny_pipeline(tmp_path, VISCOSITY_STUDY, config)
    text = cli(tmp_path, "plan", "--width", "120").stdout
    assert text.startswith("next run: 241 job(s)")
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    assert rows == [["visc", "solve", "120", "…", "outputs missing"], ["visc", "probe", "120", "…", "outputs missing"],
                    ["visc", "report", "1", "", "outputs missing"]]
    assert "plan --all-instances" in text and "visc0.2-n25" not in text
    every = cli(tmp_path, "plan", "--all-instances", "--width", "120").stdout
    assert "visc0.2-n25," in every and "visc0.3-n40" in every


def test_reasons_differing_in_a_detail_are_one_group(monkeypatch):
    jobs = [{"rule": "solve", "wildcards": {"experiment": "x", "instance": f"p{n}"}, "reason": ""} for n in range(40)]
    reasons = {f"p{n}": f"an attempt is still at work (node{n % 7} pid {n}): its job will not start a second"
               for n in range(39)} | {"p39": "outputs missing"}
    monkeypatch.setattr(plan, "why", lambda job, config: reasons[job["wildcards"]["instance"]])
    (row,) = plan.next_run(jobs, {"stages": {"solve": {}}})
    assert [(g["why"], g["count"]) for g in row["reasons"]] == [
        ("an attempt is still at work (…): its job will not start a second", 39), ("outputs missing", 1)]
    assert row["why"] == "an attempt is still at work (…): its job will not start a second; outputs missing"
    (alone,) = plan.next_run(jobs[:1], {"stages": {"solve": {}}})
    assert alone["reasons"][0]["why"] == reasons["p0"]     # one job: its reason as it is
