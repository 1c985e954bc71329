"""The `waypost` command answers one way everywhere: unknown names, exit
codes, rerun in several experiments and across reuse, the attempt history,
an unreachable bucket, and profiles whose `config:` lists compose. End to end,
with the real CLI over one shared finished run of two experiments (exp2 takes
every stage upstream of train_student from exp1)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import LOCAL_PROFILE, REPO, SMALL_CONFIG, read_manifest, snakemake, waypost, write_config

UPSTREAM_OF_STUDENT = ["fetch_corpus", "clean_corpus", "train_vocab", "train_backward", "translate_mono",
                       "train_teacher", "translate_corpus"]
STAGES = ("fetch_corpus, clean_corpus, train_vocab, train_backward, translate_mono, train_teacher, "
          "translate_corpus, train_student, evaluate, export, report")


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """exp1 computed, then exp2 reusing its stages upstream of train_student
    (linked) and computing the rest. Tests only read it (or copy it)."""
    workdir = tmp_path_factory.mktemp("contract")
    config = copy.deepcopy(SMALL_CONFIG)
    write_config(workdir, config)
    snakemake(workdir)
    config["experiments"]["exp2"] = {"pairs": ["en-xa", "en-xb"], "teachers": 2,
                                     "reuse": {s: "exp1" for s in UPSTREAM_OF_STUDENT}}
    write_config(workdir, config)
    snakemake(workdir)
    return workdir


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


EXPERIMENTS = "(expected one of: exp1, exp2)"
UNKNOWN = {
    # command line → the one line it must answer (exit 2, nothing started or changed)
    ("status", "--experiment", "smaple"): f"unknown experiment 'smaple' {EXPERIMENTS}",
    ("status", "--pair", "en-zz"): "unknown pair 'en-zz': not a pair of any experiment",
    ("status", "--experiment", "exp1", "--pair", "en-zz"): "unknown pair 'en-zz': not a pair of experiment exp1",
    ("status", "--attempts", "train_techer"): f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("run", "--profile", str(LOCAL_PROFILE), "--experiment", "smaple"): f"unknown experiment 'smaple' {EXPERIMENTS}",
    ("run", "--profile", str(LOCAL_PROFILE), "--pair", "en-xc"): "unknown pair 'en-xc': not a pair of any experiment",
    ("run", "--profile", str(LOCAL_PROFILE), "--experiment", "exp2", "--pair", "en-xc"):
        "unknown pair 'en-xc': not a pair of experiment exp2",
    ("run", "--profile", str(LOCAL_PROFILE), "--until", "train_techer"):
        f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("plan", "--profile", str(LOCAL_PROFILE), "--experiment", "smaple"): f"unknown experiment 'smaple' {EXPERIMENTS}",
    ("plan", "--profile", str(LOCAL_PROFILE), "--", "--until", "train_techer"):
        f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("cron", "--profile", str(LOCAL_PROFILE), "--", "--until", "train_techer"):
        f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("rerun", "train_techer", "--all"): f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("rerun", "train_student", "--pair", "en-xc"): "unknown pair 'en-xc': not a pair of any experiment",
    ("rerun", "train_student", "--experiment", "smaple"): f"unknown experiment 'smaple' {EXPERIMENTS}",
    ("rerun", "--drifted", "--profile", str(LOCAL_PROFILE), "--experiment", "smaple"):
        f"unknown experiment 'smaple' {EXPERIMENTS}",
    ("rerun", "train_techer", "--drifted", "--profile", str(LOCAL_PROFILE)):
        f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("rerun", "--all"): "rerun: name the STAGE to rerun, or give --drifted (what `waypost plan` finds drifted)",
    ("adopt", "train_techer", "--experiment", "exp1", "--pair", "en-xa"):
        f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("adopt", "train_vocab", "--experiment", "smaple", "--pair", "en-xa"): f"unknown experiment 'smaple' {EXPERIMENTS}",
    ("adopt", "train_vocab", "--experiment", "exp1", "--pair", "en-xc"):
        "unknown pair 'en-xc': not a pair of experiment exp1",
    ("reuse", "--into", "smaple", "--from", "exp1", "--upstream-of", "train_student"):
        f"unknown experiment 'smaple' {EXPERIMENTS}",
    ("reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_techer"):
        f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_student", "--pairs", "en-xc"):
        "unknown pair 'en-xc': not a pair of experiment exp2",
    ("find", "--stage", "train_techer"): f"unknown stage 'train_techer' (expected one of: {STAGES})",
    ("find", "--experiment", "smaple"): f"unknown experiment 'smaple' {EXPERIMENTS}",
    ("find", "--pair", "en-xc"): "unknown pair 'en-xc': not a pair of any experiment",
}


def test_unknown_names_get_one_answer_from_every_command(shared):
    before = sorted(str(p.relative_to(shared)) for p in (shared / "results").rglob("*"))
    wrong = {}
    for args, message in UNKNOWN.items():
        proc = waypost(shared, *args, check=False)
        if proc.returncode != 2 or proc.stderr.strip() != f"waypost: {message}":
            wrong[" ".join(args)] = (proc.returncode, proc.stderr[-600:])
    assert not wrong, json.dumps(wrong, indent=1)
    assert sorted(str(p.relative_to(shared)) for p in (shared / "results").rglob("*")) == before
    # find takes shell patterns: those are never "unknown"; a name found in the catalog isn't either
    assert waypost(shared, "find", "--stage", "train_*", "--json").returncode == 0
    assert waypost(shared, "find", "--stage", "train_tech?r", "--json").stdout.strip() == "[]"


def test_exit_codes_are_in_the_help():
    text = waypost(REPO, "--help").stdout
    assert "exit codes" in text and "0  fine" in text and "1  problems found" in text
    assert "2  usage or config error" in text


def test_verify_exits_1_when_it_finds_an_untrusted_stage(shared, tmp_path):
    assert "every manifest checks out" in waypost(shared, "verify").stdout
    work = tmp_path / "run"
    shutil.copytree(shared, work, symlinks=True)
    (work / "results/en-xa/exp1/train_vocab/vocab.json").unlink()
    proc = waypost(work, "verify", check=False)
    assert proc.returncode == 1 and "vocab.json is missing" in proc.stdout
    proc = waypost(work, "verify", "--repair", check=False)
    assert proc.returncode == 1 and "1 stage(s) not to be trusted" in proc.stdout
    assert waypost(work, "verify").returncode == 0


def test_a_plan_reads_the_workflow_once_and_leaves_its_facts_to_the_next(shared, monkeypatch):
    """`waypost plan --config F --profile P`: its dry run records the
    workflow's facts as read with those options, so the next plan (or cron)
    so given finds them current and reads the workflow once, in its dry run,
    rather than first in a reading of its own (a Snakemake start more)."""
    waypost(shared, "plan", "--profile", str(LOCAL_PROFILE), "--json")
    facts = json.loads((shared / ".waypost" / "stages.json").read_text())
    wanted = {"configfile": str(shared / "config.yaml"), "profile": str(LOCAL_PROFILE), "workflow_profile": None}
    assert facts["invocation"] == wanted
    from waypost.model import graph
    monkeypatch.chdir(shared)
    assert graph._current(graph.snakefile_in(str(REPO / "workflow")), wanted, []) is not None


def test_plan_check_exits_1_on_drift(shared):
    plan = waypost(shared, "plan", "--profile", str(LOCAL_PROFILE), "--check", "--json", check=False)
    assert plan.returncode == (1 if json.loads(plan.stdout)["drift"] else 0), plan.stderr
    config = yaml.safe_load((shared / "config.yaml").read_text())
    config["stages"]["train_student"]["epochs"] = 5
    write_config(shared, config, "drifted.yaml")
    args = ("plan", "--profile", str(LOCAL_PROFILE), "--json")
    assert waypost(shared, *args, config="drifted.yaml").returncode == 0   # drift alone is no failure
    proc = waypost(shared, *args, "--check", config="drifted.yaml", check=False)
    assert proc.returncode == 1
    assert any(r["stage"] == "train_student" for r in json.loads(proc.stdout)["drift"])
    drift = json.loads(waypost(shared, *args, "--experiment", "exp2", config="drifted.yaml").stdout)["drift"]
    assert drift and {r["experiment"] for r in drift} == {"exp2"}   # (plan's own hint names experiments)


def test_rerun_in_several_experiments_needs_all_or_a_filter(shared):
    proc = waypost(shared, "rerun", "train_student", check=False)
    assert proc.returncode == 2 and "--all" in one_line(proc) and "2 experiments (exp1, exp2)" in proc.stderr
    out = waypost(shared, "rerun", "train_student", "--all", "-n").stdout
    assert "4 stage(s) would be redone" in out
    assert "results/en-xb/exp1/train_student" in out and "results/en-xb/exp2/train_student" in out
    assert "2 stage(s) would be redone" in waypost(shared, "rerun", "train_student", "--pair", "en-xa", "-n").stdout


def test_rerun_of_a_reused_stage_says_it_is_taken_again_and_downstream_crosses_reuse(shared):
    out = waypost(shared, "rerun", "train_teacher", "--experiment", "exp2", "--pair", "en-xa", "-n").stdout
    assert ("results/en-xa/exp2/train_teacher/0: would be archived (reused: the next run copies it again "
            "from results/en-xa/exp1/train_teacher/0, it does not recompute it)") in out
    assert "2 stage(s) would be redone, 2 of them taken again from their reuse source" in out

    # The consumers of a reused stage are found (their manifests name its files as inputs; exp2's
    # translate_corpus is reused too, so it is no consumer of exp2's teachers) ...
    out = waypost(shared, "rerun", "train_teacher", "--experiment", "exp2", "--pair", "en-xa", "--downstream",
                  "-n").stdout
    shown = {line.split(":")[0] for line in out.splitlines() if "would be archived" in line}
    assert shown == {"results/en-xa/exp2/train_teacher/0", "results/en-xa/exp2/train_teacher/1",
                     "results/en-xa/exp2/evaluate/teacher-0", "results/en-xa/exp2/evaluate/teacher-1",
                     "results/_all/exp2/report"}
    # ... and rerunning the source with --downstream crosses into the experiment reusing it.
    out = waypost(shared, "rerun", "train_teacher", "--experiment", "exp1", "--pair", "en-xa", "--downstream",
                  "-n").stdout
    shown = {line.split(":")[0] for line in out.splitlines() if "would be archived" in line}
    assert {"results/en-xa/exp1/translate_corpus", "results/en-xa/exp2/train_teacher/0",
            "results/en-xa/exp2/train_teacher/1", "results/en-xa/exp2/translate_corpus",
            "results/en-xa/exp2/train_student", "results/_all/exp2/report"} <= shown
    assert "results/en-xb/exp2/train_teacher/0" not in shown


def test_status_attempts_shows_the_decision_reason_and_runtime_limit(shared, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    attempt = read_manifest(shared / "results/en-xa/exp1/train_student")["attempts"][-1]
    reason, limit = attempt["decision"]["reason"], attempt["runtime_limit_s"]
    assert reason
    out = waypost(shared, "status", "--attempts", "train_student", "--experiment", "exp1", "--pair", "en-xa").stdout
    header = next(line for line in out.splitlines() if "next" in line)
    assert "limit" in header
    assert f"→ {attempt['decision']['action']}: {reason}" in out   # each decision's reason, under the table
    assert ("–" if limit is None else f"{limit:g}") in out


def test_an_unreachable_bucket_answers_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")   # nothing listens on the discard port
    write_config(tmp_path, {**SMALL_CONFIG, "root": "gs://nobucket/results"})
    for args in (("status",), ("find", "--json"), ("verify",)):
        started = time.monotonic()
        proc = waypost(tmp_path, *args, check=False)
        took = time.monotonic() - started
        assert proc.returncode == 1 and took < 15, (args, took, proc.stderr[-2000:])
        assert "gs://nobucket/results: can't reach the storage endpoint http://127.0.0.1:9" in one_line(proc)
        assert "Traceback" not in proc.stderr


def test_a_root_whose_scheme_no_client_serves_answers_in_one_line(tmp_path):
    """A URL root of a scheme waypost has no client for (an s3:// bucket)
    is one line naming the root and the schemes served, from the first
    command that reaches it."""
    write_config(tmp_path, {**SMALL_CONFIG, "root": "s3://bucket/results"})
    for args in (("status",), ("find", "--json"), ("verify",)):
        proc = waypost(tmp_path, *args, check=False)
        assert proc.returncode == 1, (args, proc.stderr[-2000:])
        assert one_line(proc).endswith("s3://bucket/results: waypost serves no s3:// locations (a path, or gs://)")
        assert "Traceback" not in proc.stderr


def profile(tmp_path: Path, name: str, entries: list[str]) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    settings = yaml.safe_load((LOCAL_PROFILE / "config.yaml").read_text())
    settings["config"] = entries
    (directory / "config.yaml").write_text(yaml.safe_dump(settings))
    return directory


def test_profile_config_lists_compose(shared, tmp_path):
    config_args = ("--config", str(shared / "config.yaml"), "--workflow", str(REPO / "workflow"))
    only_root = profile(tmp_path, "only-root", ["root=results"])
    proc = waypost(REPO, "workers", *config_args, "--profile", str(only_root), "--json")
    assert json.loads(proc.stdout)["pool"] == "local"
    assert "sets config: ['root'] but no pool=" in proc.stderr
    both = profile(tmp_path, "both", ["pool=cloud", "root=results"])
    proc = waypost(REPO, "workers", *config_args, "--profile", str(both), "--json")
    assert json.loads(proc.stdout)["pool"] == "cloud" and not proc.stderr
    # `run --experiment` adds a --config (select=...): it carries the profile's entries, which it would replace
    proc = waypost(shared, "run", "--profile", str(both), "--experiment", "exp1", "--", "-n", check=False)
    command = proc.stderr.splitlines()[0]
    assert command.startswith("waypost: snakemake ") and "--config pool=cloud root=results 'select=" in command


def test_cron_and_plan_carry_the_profiles_config_with_their_own(tmp_path):
    """`-- --config K=V` after cron (or plan) joins the profile's `config:`
    entries instead of replacing them (which would move the run to another pool)."""
    both = profile(tmp_path, "both", ["pool=cloud"])
    write_config(tmp_path, SMALL_CONFIG)
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", "cron", "--config", str(tmp_path / "config.yaml"),
                           "--workflow", str(REPO / "workflow"), "--profile", str(both), "--", "-n",
                           "--config", "rerun_policy=presence"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / ".waypost" / "cron.log").read_text().splitlines()[-1])
    command = record["command"]
    at = command.index("--config")
    assert command[at + 1:at + 3] == ["pool=cloud", "rerun_policy=presence"], command


# The reference pipeline's instances, each stage's own (not one list of them all).
ALL_INSTANCES = "train_teacher's instances: 0, 1; evaluate's instances: backward, student, teacher-0, teacher-1"
UNKNOWN_INSTANCES = {
    ("status", "--instance", "0", "--instance", "teacher-9"):
        f"unknown instance 'teacher-9': not an instance of experiments exp1, exp2 ({ALL_INSTANCES}; "
        "or a shell pattern, quoted)",
    ("status", "--experiment", "exp1", "--instance", "teacher-9"):
        f"unknown instance 'teacher-9': not an instance of experiment exp1 ({ALL_INSTANCES}; "
        "or a shell pattern, quoted)",
    ("find", "--instance", "teacher-*", "--instance", "teacher-9"):
        f"unknown instance 'teacher-9': not an instance of experiments exp1, exp2 ({ALL_INSTANCES}; "
        "or a shell pattern, quoted)",
    ("plan", "--profile", str(LOCAL_PROFILE), "--instance", "teacher-9"):
        f"unknown instance 'teacher-9': not an instance of experiments exp1, exp2 ({ALL_INSTANCES}; "
        "or a shell pattern, quoted)",
    ("rerun", "train_teacher", "--all", "--instance", "0", "--instance", "2", "-n"):
        "unknown instance '2': not an instance of experiments exp1, exp2 (train_teacher's instances: 0, 1; or a "
        "shell pattern, "
        "quoted)",
    ("retry", "train_teacher", "--experiment", "exp1", "--instance", "2", "-n"):
        "unknown instance '2': not an instance of experiment exp1 (train_teacher's instances: 0, 1; or a shell "
        "pattern, quoted)",
    ("rerun", "train_teacher", "--all", "--instance", "../0", "-n"):
        "instance '../0' is neither a valid name (letters, digits, '.', '_' or '-', starting with a letter or digit) "
        "nor a shell pattern",
}


def test_instance_filters_repeat_take_patterns_and_name_unknown_ones(shared):
    """`--instance` on status, find, plan, rerun and retry: repeatable, shell
    patterns, and an unknown name is the one answer (exit 2, nothing changed)."""
    before = sorted(str(p.relative_to(shared)) for p in (shared / "results").rglob("*"))
    wrong = {}
    for args, message in UNKNOWN_INSTANCES.items():
        proc = waypost(shared, *args, check=False)
        if proc.returncode != 2 or proc.stderr.strip() != f"waypost: {message}":
            wrong[" ".join(args)] = (proc.returncode, proc.stderr[-600:])
    assert not wrong, json.dumps(wrong, indent=1)

    # both instances, not the last one alone: 2 experiments × 2 pairs × 2 teachers
    out = waypost(shared, "rerun", "train_teacher", "--all", "--instance", "0", "--instance", "1", "-n").stdout
    assert "8 stage(s) would be redone" in out
    out = waypost(shared, "rerun", "evaluate", "--experiment", "exp1", "--instance", "teacher-?",
                  "--instance", "student", "-n").stdout
    assert "6 stage(s) would be redone" in out and "backward" not in out
    grid = json.loads(waypost(shared, "status", "--json", "--experiment", "exp1", "--instance", "teacher-*").stdout)
    cells = grid["experiments"]["exp1"]["en-xa"]
    assert list(cells) == ["evaluate"] and sorted(cells["evaluate"]["instances"]) == ["teacher-0", "teacher-1"]
    rows = json.loads(waypost(shared, "find", "--json", "--no-archived", "--stage", "evaluate", "--instance", "student",
                              "--instance", "backward").stdout)
    assert sorted({r["instance"] for r in rows}) == ["backward", "student"] and len(rows) == 8
    plan = json.loads(waypost(shared, "plan", "--profile", str(LOCAL_PROFILE), "--json", "--instance", "student").stdout)
    assert plan["next_run"] == [] and plan["drift"] == []
    proc = waypost(shared, "retry", "train_teacher", "--instance", "0", "-n", check=False)
    assert proc.returncode == 1 and "nothing to retry: no stage train_teacher/0 that ended without success" in proc.stderr
    assert sorted(str(p.relative_to(shared)) for p in (shared / "results").rglob("*")) == before
