"""Reusing work across experiments, starting and stopping at a stage,
rerun/adopt and `waypost plan`, end to end with real snakemake runs."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import yaml
from conftest import LOCAL_PROFILE, SMALL_CONFIG, planned, read_manifest, snakemake, waypost, write_config

PAIRS = ("en-xa", "en-xb")
UPSTREAM_OF_STUDENT = ["fetch_corpus", "clean_corpus", "train_vocab", "train_backward", "translate_mono",
                       "train_teacher", "translate_corpus"]


def stage(workdir: Path, pair: str, name: str, experiment: str, instance: str | None = None) -> Path:
    path = workdir / "results" / pair / experiment / name
    return path / instance if instance else path


def with_experiment(workdir: Path, name: str, **settings) -> dict:
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["experiments"][name] = {"pairs": list(PAIRS), "teachers": 2, **settings}
    write_config(workdir, config)
    return config


def test_reuse_upstream_of_student_then_rerun_downstream(run_copy):
    with_experiment(run_copy, "exp2", stages={"train_student": {"epochs": 3}})
    out = waypost(run_copy, "reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_student").stdout
    assert "takes 7 stage(s) from exp1" in out
    pointers = yaml.safe_load((run_copy / "reuse" / "exp2.yaml").read_text())
    assert pointers["experiments"]["exp2"]["reuse"] == {s: "exp1" for s in UPSTREAM_OF_STUDENT}

    plan = json.loads(waypost(run_copy, "plan", "--profile", str(LOCAL_PROFILE), "--json").stdout)
    why = {(r["pair"], r["stage"]): r["why"] for r in plan["next_run"] if r["experiment"] == "exp2"}
    assert why[("en-xa", "train_teacher")] == "reuse from exp1"
    assert why[("en-xa", "train_student")] == "outputs missing"

    snakemake(run_copy)
    for pair in PAIRS:
        for name in UPSTREAM_OF_STUDENT:
            dirs = [stage(run_copy, pair, name, "exp2", i) for i in ("0", "1")] if name == "train_teacher" \
                else [stage(run_copy, pair, name, "exp2")]
            for directory in dirs:
                record = read_manifest(directory)
                source = Path(str(directory).replace("/exp2/", "/exp1/"))
                assert record["reused_from"] == str(source)
                assert [a["action"] for a in record["attempts"]] == ["reuse"]
                assert not (directory / "_logs").exists()  # nothing ran
                for out in record["outputs"]:  # copied, never linked: the source's files stay as they were
                    copy, original = directory / out["path"], source / out["path"]
                    assert not os.path.samefile(copy, original) and original.stat().st_nlink == 1
                    assert copy.read_bytes() == original.read_bytes()
        student = read_manifest(stage(run_copy, pair, "train_student", "exp2"))
        assert student["reused_from"] is None and student["attempts"][0]["action"] == "cmd"
        assert student["settings"]["epochs"] == 3
        assert read_manifest(stage(run_copy, pair, "evaluate", "exp2", "student"))["state"] == "SUCCESS"
    assert planned(run_copy) == {}

    # rerun --downstream: exactly train_student and what was made from it.
    out = waypost(run_copy, "rerun", "train_student", "--experiment", "exp2", "--downstream").stdout
    assert "7 stage(s) will be redone" in out
    archived = [line.split(":")[0] for line in out.splitlines() if "archived in" in line]
    assert sorted(archived) == sorted([f"results/{p}/exp2/{s}" for p in PAIRS
                                       for s in ("train_student", "evaluate/student", "export")]
                                      + ["results/_all/exp2/report"])
    assert planned(run_copy) == {"train_student": 2, "evaluate": 2, "export": 2, "report": 1}
    kept = stage(run_copy, "en-xa", "train_student", "exp2") / ".attempts" / "1"
    assert (kept / "model.json").exists() and (kept / "_manifest.json").exists()
    snakemake(run_copy)
    assert planned(run_copy) == {}
    # exp1 was not touched
    assert read_manifest(stage(run_copy, "en-xa", "train_student", "exp1"))["attempts"][0]["action"] == "cmd"


def test_reuse_source_problems_stop_the_run_before_any_job(run_copy):
    with_experiment(run_copy, "exp2", reuse={"train_vocab": "nosuch", "clean_corpus": "exp1"})
    manifest_path = stage(run_copy, "en-xb", "clean_corpus", "exp1") / "_manifest.json"
    record = json.loads(manifest_path.read_text())
    record["state"] = "FAILED"
    manifest_path.write_text(json.dumps(record))
    proc = snakemake(run_copy, check=False)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "reuse sources in" in err and "nothing was run" in err
    assert "exp2/en-xa/train_vocab" in err and "no manifest" in err
    assert "exp2/en-xb/clean_corpus" in err and "FAILED, not SUCCESS" in err
    assert not any((run_copy / "results" / p / "exp2").exists() for p in PAIRS)


def test_reuse_job_refuses_a_source_whose_files_changed(run_copy):
    with_experiment(run_copy, "exp2", reuse={"train_vocab": "exp1"})
    vocab = stage(run_copy, "en-xa", "train_vocab", "exp1") / "vocab.json"
    vocab.write_text(vocab.read_text().replace("{", "{ ", 1))  # same manifest, other bytes
    proc = snakemake(run_copy, "--until", "train_vocab", check=False)
    assert proc.returncode != 0
    assert "differs from its manifest" in proc.stdout + proc.stderr
    target = stage(run_copy, "en-xa", "train_vocab", "exp2")
    assert not (target / "vocab.json").exists() and not (target / "_manifest.json").exists()
    assert not target.exists() or not [p for p in target.iterdir() if p.name.startswith(".tmp")]


def test_reuse_validation_names_the_key(tmp_path):
    config = copy.deepcopy(SMALL_CONFIG)
    config["experiments"]["exp1"]["reuse"] = {"train_techer": "old", "train_vocab": {"en-zz": "old"}}
    write_config(tmp_path, config)
    proc = snakemake(tmp_path, "-n", check=False)
    err = proc.stdout + proc.stderr
    assert "experiments.exp1.reuse.train_techer: unknown stage 'train_techer'" in err
    assert "experiments.exp1.reuse.train_vocab.en-zz: unknown pair 'en-zz'" in err


def test_run_until_a_stage_for_chosen_pairs(tmp_path):
    write_config(tmp_path, SMALL_CONFIG)
    proc = waypost(tmp_path, "run", "--profile", str(LOCAL_PROFILE), "--until", "train_vocab", "--pair", "en-xa")
    assert "--until train_vocab" in proc.stderr
    made = sorted(str(p.parent.relative_to(tmp_path)) for p in (tmp_path / "results").rglob("_manifest.json"))
    assert made == [f"results/en-xa/exp1/{s}" for s in ("clean_corpus", "fetch_corpus", "train_vocab")]
    # the next plain run goes on from there
    assert planned(tmp_path)["train_vocab"] == 1


def test_adopt_files_placed_by_hand(run_copy):
    with_experiment(run_copy, "exp2")
    target = stage(run_copy, "en-xa", "train_vocab", "exp2")
    target.mkdir(parents=True)
    (target / "vocab.json").write_bytes((stage(run_copy, "en-xa", "train_vocab", "exp1") / "vocab.json").read_bytes())
    out = waypost(run_copy, "adopt", "train_vocab", "--experiment", "exp2", "--pair", "en-xa",
                  "--note", "from the shared drive").stdout
    assert "adopted 1 file(s)" in out
    record = read_manifest(target)
    assert record["adopted"] is True and record["state"] == "SUCCESS" and record["note"] == "from the shared drive"
    assert record["outputs"][0]["path"] == "vocab.json" and len(record["outputs"][0]["sha256"]) == 64
    grid = json.loads(waypost(run_copy, "status", "--json").stdout)
    assert grid["experiments"]["exp2"]["en-xa"]["train_vocab"]["state"] in ("adopted", "SUCCESS")
    # only en-xb's vocab (and what it needs) is left to make
    assert planned(run_copy, "--until", "train_vocab") == {"fetch_corpus": 1, "clean_corpus": 1, "train_vocab": 1}
    # refusing to overwrite a stage waypost made itself
    proc = waypost(run_copy, "adopt", "train_vocab", "--experiment", "exp1", "--pair", "en-xa", check=False)
    assert proc.returncode == 1 and "already a SUCCESS stage" in proc.stderr


def test_plan_shows_missing_work_and_drift(run_copy):
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["stages"]["train_student"]["epochs"] = 4
    write_config(run_copy, config)
    for path in stage(run_copy, "en-xb", "export", "exp1").iterdir():
        if path.is_file() and not path.name.startswith("_"):
            path.unlink()
    plan = json.loads(waypost(run_copy, "plan", "--profile", str(LOCAL_PROFILE), "--json").stdout)
    assert [(r["pair"], r["stage"], r["why"]) for r in plan["next_run"]] == [("en-xb", "export", "outputs missing")]
    drifted = {(r["pair"], r["stage"]): r["what"] for r in plan["drift"]}
    # (the code version may differ too when the checkout changes while the tests run)
    assert [w for w in drifted[("en-xa", "train_student")] if not w.startswith("code:")] == ["settings: epochs: 2 → 4"]
    assert not [w for w in drifted.get(("en-xa", "train_teacher"), []) if not w.startswith("code:")]
    text = waypost(run_copy, "plan", "--profile", str(LOCAL_PROFILE), "--width", "200").stdout
    assert "next run: 1 job(s)" in text and "epochs: 2 → 4" in text


def test_rerun_refuses_unknown_names_and_changes_nothing(run_copy):
    proc = waypost(run_copy, "rerun", "train_studnet", check=False)
    assert proc.returncode == 2 and "unknown stage 'train_studnet'" in proc.stderr
    proc = waypost(run_copy, "rerun", "train_student", "--experiment", "nope", check=False)
    assert proc.returncode == 2 and "unknown experiment 'nope'" in proc.stderr
    assert planned(run_copy) == {}


def test_rerun_refuses_while_an_attempt_runs(run_copy):
    import socket
    import subprocess
    target = stage(run_copy, "en-xa", "train_student", "exp1")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (target / "_running.json").write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        proc = waypost(run_copy, "rerun", "train_student", "--experiment", "exp1", check=False)
        assert proc.returncode == 1 and "an attempt is running" in proc.stderr and "nothing was changed" in proc.stderr
        assert (target / "model.json").exists() and not (target / ".attempts").exists()
    finally:
        sleeper.kill()


def test_a_reuse_whose_source_is_redone_waits_for_it_and_blocks_nothing(run_copy):
    """Issue 38: `rerun SOURCE --downstream` on a stage another experiment
    reuses made every later run refuse (`reuse sources … can't be used`).
    Now the reusing job waits for its source: one run redoes the source,
    then takes it; `plan` says so, and the rest of the run goes on."""
    with_experiment(run_copy, "distilled", reuse={s: "exp1" for s in ("fetch_corpus", "clean_corpus", "train_vocab",
                                                                        "train_backward")})
    snakemake(run_copy)
    out = waypost(run_copy, "rerun", "clean_corpus", "--experiment", "exp1", "--pair", "en-xb", "--downstream").stdout
    assert "results/en-xb/distilled/clean_corpus: archived in .attempts/1 (reused" in out
    assert not (stage(run_copy, "en-xb", "clean_corpus", "exp1") / "_manifest.json").exists()

    plan = json.loads(waypost(run_copy, "plan", "--profile", str(LOCAL_PROFILE), "--json").stdout)
    why = {(r["experiment"], r["pair"], r["stage"]): r["why"] for r in plan["next_run"]}
    assert why[("exp1", "en-xb", "clean_corpus")] == "outputs missing"
    assert why[("distilled", "en-xb", "clean_corpus")] == "reuse from exp1, once its clean_corpus there is made " \
                                                         "(in this run)"
    assert why[("distilled", "en-xb", "train_vocab")] == "reuse from exp1, once its train_vocab there is made " \
                                                       "(in this run)"
    assert ("distilled", "en-xa", "clean_corpus") not in why   # en-xa's reuse is done: untouched

    proc = snakemake(run_copy)
    err = proc.stdout + proc.stderr
    assert ("waypost: distilled/clean_corpus (en-xb) is reused from exp1, whose clean_corpus is to be made: "
            "this run makes it first, then takes it") in err
    source = read_manifest(stage(run_copy, "en-xb", "clean_corpus", "exp1"))
    taken = read_manifest(stage(run_copy, "en-xb", "clean_corpus", "distilled"))
    assert taken["reused_from"] == str(stage(run_copy, "en-xb", "clean_corpus", "exp1"))
    assert taken["outputs"] == source["outputs"] and taken["created"] > source["created"]
    for name in ("train_student", "export"):   # what was made from them, redone in the same run
        assert read_manifest(stage(run_copy, "en-xb", name, "distilled"))["state"] == "SUCCESS"
    assert planned(run_copy) == {}


def test_a_reuse_from_another_root_being_redone_there_holds_only_what_needs_it(run_copy, tmp_path):
    """A source elsewhere (another team's root) that a rerun archived there:
    this run can't make it, so the reused stage and what needs it wait,
    said in one line (and by `plan`); the rest of the run goes on."""
    theirs = run_copy / "results"
    config = copy.deepcopy(SMALL_CONFIG)
    config["experiments"] = {"mine": {"pairs": list(PAIRS), "teachers": 2, "reuse": {
        "clean_corpus": {p: str(theirs / p / "exp1" / "clean_corpus") for p in PAIRS}}}}
    write_config(tmp_path, config)
    waypost(run_copy, "rerun", "clean_corpus", "--experiment", "exp1", "--pair", "en-xb")   # not run again there

    plan = json.loads(waypost(tmp_path, "plan", "--profile", str(LOCAL_PROFILE), "--json", "--", "--until",
                              "train_vocab").stdout)
    waiting = f"mine/en-xb/clean_corpus waits for {theirs}/en-xb/exp1/clean_corpus, being redone there"
    assert plan["waiting"] == [waiting]
    # (en-xb's fetch_corpus: needed up to train_vocab only by what waits)
    assert {(r["pair"], r["stage"]) for r in plan["next_run"]} == {
        ("en-xa", "fetch_corpus"), ("en-xa", "clean_corpus"), ("en-xa", "train_vocab")}

    proc = snakemake(tmp_path, "--until", "train_vocab")
    held = next(line for line in proc.stderr.splitlines() if line.startswith("waypost: on hold"))
    assert held.startswith("waypost: on hold, not scheduled, nor what needs them (clean_corpus, ") \
        and held.endswith(f"): {waiting}"), held
    assert read_manifest(stage(tmp_path, "en-xa", "train_vocab", "mine"))["state"] == "SUCCESS"
    assert not stage(tmp_path, "en-xb", "clean_corpus", "mine").exists()
    assert not stage(tmp_path, "en-xb", "train_vocab", "mine").exists()
    # a source not there at all is a mistake, said before any job (as before)
    config["experiments"]["mine"]["reuse"]["clean_corpus"]["en-xb"] = str(theirs / "en-xb" / "exp9" / "clean_corpus")
    write_config(tmp_path, config)
    proc = snakemake(tmp_path, "--until", "train_vocab", check=False)
    assert proc.returncode != 0 and "can't be used (nothing was run)" in proc.stdout + proc.stderr
