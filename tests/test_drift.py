"""``waypost plan``'s drift: each stage's code version is its own step's
(its rule's command and the scripts it runs), so editing the config or one
script flags only the stages it changes, and identical lines collapse."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import LOCAL_PROFILE, REPO, SMALL_CONFIG, snakemake, write_config

PARTS = ("workflow", "rules", "scripts", "config")
TEACHERS = 2 * 2        # pairs × teachers
EVALUATIONS = 2 * 4     # pairs × models evaluated
STAGES = 2 * (8 + 2 + 4) + 1


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                    *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def drift_run(tmp_path_factory) -> Path:
    """A git checkout of the workflow (a copy of this repo's, committed) whose
    config/config.yaml is the small one, and a finished run in it: what a
    user has, and one a test may edit (its scripts too) in its own copy."""
    repo = tmp_path_factory.mktemp("drift") / "repo"
    for part in PARTS:
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__", "reuse"))
    write_config(repo / "config", SMALL_CONFIG)
    git(repo, "init", "-q")
    git(repo, "add", *PARTS)
    git(repo, "commit", "-qm", "the workflow")
    snakemake(repo, configfile="config/config.yaml", snakefile=repo / "workflow" / "Snakefile")
    return repo


@pytest.fixture
def checkout(drift_run, tmp_path) -> Path:
    """A private copy of it (elsewhere: code versions don't name the place)."""
    target = tmp_path / "checkout"
    shutil.copytree(drift_run, target, symlinks=True, copy_function=shutil.copy2)
    return target


def plan(repo: Path, *args: str) -> str:
    """``waypost plan`` as a user runs it in the checkout (its default config and workflow)."""
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", "plan", "--profile", str(LOCAL_PROFILE), *args],
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def plan_json(repo: Path) -> dict:
    return json.loads(plan(repo, "--json"))


def drift_rows(text: str) -> list[str]:
    """The rows of the drift table of ``waypost plan``'s text."""
    assert "done, but made with" in text, text
    table = text.split("done, but made with", 1)[1]
    return [line for line in table.splitlines() if line.startswith("│") and line.strip("│ ")]


def set_config(repo: Path, stage: str, key: str, value) -> None:
    path = repo / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config["stages"].setdefault(stage, {})[key] = value
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def edit_script(repo: Path, name: str) -> None:
    with open(repo / "scripts" / name, "a") as f:
        f.write("\n# a change to the step's code\n")


def test_a_config_edit_shows_only_that_stages_settings(checkout):
    set_config(checkout, "train_teacher", "epochs", 3)   # the checkout is dirty now
    text = plan(checkout, "--width", "200")
    # one row for the 4 teacher cells, and no code rows (no step's code changed)
    rows = drift_rows(text)
    assert len(rows) == 1, text
    assert f"train_teacher [0, 1] ×{TEACHERS}" in rows[0] and "settings: epochs: 2 → 3" in rows[0], text
    assert "en-xa, en-xb" in rows[0] and "code:" not in text and "code version" not in text, text
    data = plan_json(checkout)
    assert {(r["stage"], tuple(r["what"])) for r in data["drift"]} == {("train_teacher", ("settings: epochs: 2 → 3",))}
    assert len(data["drift"]) == TEACHERS and data["code_unknown"] == 0


def test_b_a_script_edit_shows_only_its_stages_code_collapsed(checkout):
    edit_script(checkout, "evaluate.py")   # only `evaluate` runs it
    text = plan(checkout, "--width", "200")
    rows = drift_rows(text)
    assert len(rows) == 1, text
    assert f"evaluate [backward, student, teacher-0, teacher-1] ×{EVALUATIONS}" in rows[0], text
    assert "code: " in rows[0] and "settings" not in rows[0], text
    data = plan_json(checkout)
    assert {r["stage"] for r in data["drift"]} == {"evaluate"} and len(data["drift"]) == EVALUATIONS
    (what,) = {tuple(r["what"]) for r in data["drift"]}
    assert len(what) == 1 and what[0].startswith("code: ")
    before, after = what[0].removeprefix("code: ").split(" → ")
    codes = json.loads((checkout / ".waypost" / "stages.json").read_text())["code"]
    assert codes["evaluate"] == "sha256:" + after != "sha256:" + before
    manifest = json.loads((checkout / "results/en-xa/exp1/evaluate/student/_manifest.json").read_text())
    assert manifest["code_version"] == "sha256:" + before


def test_c_plan_json_carries_the_collapsed_drift(checkout):
    set_config(checkout, "train_teacher", "epochs", 3)
    edit_script(checkout, "evaluate.py")
    data = plan_json(checkout)
    groups = [(g["stage"], g["count"], g["what"][0].split(":")[0], g["pairs"], sorted(g["instances"]))
              for g in data["drift_groups"]]
    assert groups == [("train_teacher", TEACHERS, "settings", ["en-xa", "en-xb"], ["0", "1"]),
                      ("evaluate", EVALUATIONS, "code", ["en-xa", "en-xb"],
                       ["backward", "student", "teacher-0", "teacher-1"])]
    assert sum(g["count"] for g in data["drift_groups"]) == len(data["drift"]) == TEACHERS + EVALUATIONS
    assert all(len(g["cells"]) == g["count"] and g["experiments"] == ["exp1"] for g in data["drift_groups"])
    # the text says the same, row for row
    rows = drift_rows(plan(checkout, "--width", "200"))
    assert [row.split("│")[3].strip().split(" [")[0] for row in rows] == ["train_teacher", "evaluate"]


def test_d_older_manifests_code_version_is_unknown_not_drift(checkout):
    # manifests of waypost before per-stage code versions: the repository's `git describe`
    for path in (checkout / "results").rglob("_manifest.json"):
        data = json.loads(path.read_text())
        data["code_version"] = "53cd080423db-dirty"
        path.write_text(json.dumps(data))
    set_config(checkout, "train_student", "epochs", 4)
    text = plan(checkout, "--width", "200")
    rows = drift_rows(text)
    # the settings change is drift (its 2 cells in one row); the old code versions are not
    assert len(rows) == 1 and "train_student ×2" in rows[0] and "settings: epochs: 2 → 4" in rows[0], text
    assert "code:" not in text, text
    assert text.count("code version unknown (recorded before per-stage code versions)") == 1
    data = plan_json(checkout)
    assert data["code_unknown"] == STAGES and not any(w.startswith("code") for r in data["drift"] for w in r["what"])
