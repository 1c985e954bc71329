"""A gs:// root end to end, against fake-gcs-server: the reference pipeline
and the parameter study with ``root: gs://bucket/results``, presence
semantics in the bucket, kills, restarts and reruns, reuse as a server-side
copy, and the errors a user can act on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import LOCAL_PROFILE, REPO, SNAKEFILE, planned, snakemake, waypost, write_config
from conftest import gcs_config as config_for
from conftest import gcs_flags as flags
from conftest import gcs_fs as fs
from conftest import gcs_key as key
from conftest import gcs_manifest as manifest
from conftest import gcs_manifests as manifests
from conftest import gcs_objects as objects
from conftest import media_downloads as downloads

EXAMPLE = REPO / "examples" / "param-study"


def status(workdir: Path) -> dict:
    return json.loads(waypost(workdir, "status", "--json").stdout)["experiments"]


def test_full_run_with_a_bucket_root(gcs_finished, gcs_log):
    root, work = gcs_finished.root, gcs_finished.workdir
    assert not (work / "results").exists()
    report = fs().cat_file(f"{key(root)}/_all/exp1/report/report.md").decode()
    for pair in ("en-xa", "en-xb"):
        for model in ("backward", "teacher-0", "teacher-1", "student"):
            assert any(pair in line and model in line and "| ok |" in line for line in report.splitlines())

    listing = fs().find(key(root), detail=True)
    found = manifests(root)
    assert len(found) == 2 * 14 + 1
    for where, data in found.items():
        assert data["state"] == "SUCCESS", where
        written = listing[f"{key(root)}/{where}/_manifest.json"]["mtime"]
        for out in data["outputs"]:
            blob = fs().cat_file(f"{key(root)}/{where}/{out['path']}")
            assert len(blob) == out["size"]
            # The manifest is the last object a stage writes.
            assert listing[f"{key(root)}/{where}/{out['path']}"]["mtime"] <= written, (where, out["path"])
        assert f"{where}/_logs/attempt-1.log" in {n[len(key(root)) + 1:] for n in listing}
        assert not any(n.startswith(f"{key(root)}/{where}/_running.json") for n in listing)
    inputs = {i["path"]: i for i in found["en-xa/exp1/train_student"]["inputs"]}
    corpus = f"{root}/en-xa/exp1/translate_corpus/distilled.tsv"
    assert inputs[corpus]["state"] == "SUCCESS"
    assert inputs[corpus]["manifest"] == f"{root}/en-xa/exp1/translate_corpus/_manifest.json"
    assert {c["state"] for row in status(work)["exp1"].values() for c in row.values()} == {"SUCCESS"}

    # A second run has nothing to do, planned from one listing of the root.
    mark = gcs_log.mark()
    assert planned(work, *flags(root)) == {}
    requests = gcs_log.requests(mark)
    bucket = key(root).split("/")[0]
    assert requests == [f"GET /storage/v1/b/{bucket}",  # it exists
                        f"GET /storage/v1/b/{bucket}/o?delimiter=&prefix=results/&maxResults=1000"], requests


def test_deleting_objects_reruns_exactly_those_stages(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    before = manifests(root)
    fs().rm_file(f"{key(root)}/en-xa/exp1/train_student/model.json")
    fs().rm([f"{key(root)}/{n}" for n in objects(root) if n.startswith("en-xb/exp1/clean_corpus/")])
    assert planned(work, *flags(root)) == {"train_student": 1, "clean_corpus": 1}

    mark = gcs_log.mark()
    snakemake(work, *flags(root))
    requests = gcs_log.requests(mark)
    after = manifests(root)
    changed = sorted(k for k in after if after[k]["created"] != before.get(k, {}).get("created"))
    assert changed == ["en-xa/exp1/train_student", "en-xb/exp1/clean_corpus"]
    student = after["en-xa/exp1/train_student"]
    assert [a["number"] for a in student["attempts"]] == [1, 2]
    assert student["attempts"][0]["workspace"] == ".attempts/1"
    # The earlier workspace was archived in the bucket, not deleted, and
    # not downloaded to be archived.
    names = objects(root)
    assert "en-xa/exp1/train_student/.attempts/1/_manifest.json" in names
    assert any(n.startswith("en-xa/exp1/train_student/.attempts/1/checkpoints/epoch-") for n in names)
    assert any("rewriteTo" in r and "train_student/.attempts/1/checkpoints/" in r for r in requests)
    assert not [r for r in downloads(requests) if "train_student/checkpoints" in r]
    assert [a["number"] for a in after["en-xb/exp1/clean_corpus"]["attempts"]] == [1]
    assert planned(work, *flags(root)) == {}


def test_objects_added_by_hand_count_as_done(gcs_copy):
    root, work = gcs_copy.root, gcs_copy.workdir
    config = config_for(root)
    config["experiments"]["exp2"] = {"pairs": ["en-xa"], "teachers": 2}
    write_config(work, config)
    for i in ("0", "1"):
        fs().copy(f"{key(root)}/en-xa/exp1/train_teacher/{i}/model.json",
                  f"{key(root)}/en-xa/exp2/train_teacher/{i}/model.json")
    jobs = planned(work, *flags(root))
    assert "train_teacher" not in jobs and jobs["train_student"] == 1 and jobs["fetch_corpus"] == 1

    snakemake(work, *flags(root), "--until", "translate_corpus")
    assert "en-xa/exp2/train_teacher/0/_manifest.json" not in objects(root)
    distilled = manifest(root, "en-xa/exp2/translate_corpus")
    teachers = [i for i in distilled["inputs"] if "train_teacher" in i["path"]]
    assert {i["state"] for i in teachers} == {"ADOPTED"} and all(i["path"].startswith(root) for i in teachers)
    grid = status(work)["exp2"]["en-xa"]
    assert grid["train_teacher"]["state"] == "adopted" and grid["translate_corpus"]["state"] == "SUCCESS"


def test_reuse_between_two_gs_experiments_is_a_server_side_copy(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    config = config_for(root)
    config["experiments"]["exp2"] = {"pairs": ["en-xa"], "teachers": 2, "reuse": {"train_teacher": "exp1"}}
    write_config(work, config)
    assert planned(work, *flags(root), "--until", "train_teacher") == {"train_teacher": 2}

    mark = gcs_log.mark()
    snakemake(work, *flags(root), "--until", "train_teacher")
    requests = gcs_log.requests(mark)
    listing = fs().find(key(root), detail=True)
    for i in ("0", "1"):
        data = manifest(root, f"en-xa/exp2/train_teacher/{i}")
        assert data["state"] == "SUCCESS" and data["reused_from"] == f"{root}/en-xa/exp1/train_teacher/{i}"
        assert data["attempts"][0]["how"] == "copied in the bucket"
        source, copied = (listing[f"{key(root)}/en-xa/{e}/train_teacher/{i}/model.json"] for e in ("exp1", "exp2"))
        assert copied["md5Hash"] == source["md5Hash"] and copied["size"] == source["size"]
        assert any("rewriteTo" in r and f"exp2/train_teacher/{i}/model.json" in r for r in requests)
    assert not [r for r in downloads(requests) if "model.json" in r], downloads(requests)
    assert status(work)["exp2"]["en-xa"]["train_teacher"]["state"] == "SUCCESS"


# One pair, a backward model that trains long enough to be killed.
LONG = {
    "experiments": {"exp1": {"pairs": ["en-xa"], "teachers": 1}},
    "stages": {"fetch_corpus": {"sentences": 3000, "mono": 100, "test": 50},
               "train_backward": {"epochs": 400}},
}


def start_run(workdir: Path, root: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), "--profile",
           str(LOCAL_PROFILE), "--configfile", str(workdir / "config.yaml"), *flags(root),
           "--until", "train_backward"]
    # The runner pushes the workspace (checkpoints) twice a second here.
    return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, env={**os.environ, "WAYPOST_SYNC_SECONDS": "0.5"})


def wait_for_checkpoint(root: str, stage: str, timeout: float = 120) -> dict:
    """Wait until a checkpoint of the step is in the bucket; return its _running.json."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        names = objects(root)
        if any(n.startswith(f"{stage}/checkpoints/epoch-") for n in names) and f"{stage}/_running.json" in names:
            return json.loads(fs().cat_file(f"{key(root)}/{stage}/_running.json"))
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of {stage} in the bucket after {timeout}s")


def test_a_killed_step_never_looks_done_in_the_bucket(bucket, tmp_path):
    root = f"{bucket}/results"
    write_config(tmp_path, config_for(root, LONG))
    stage = "en-xa/exp1/train_backward"

    # The step alone is killed: the runner records it; no output in the bucket.
    run = start_run(tmp_path, root)
    try:
        running = wait_for_checkpoint(root, stage)
        step = running["step_group"]["pgid"]   # the step's shell (the runner's other child is its watchdog)
        os.kill(step, signal.SIGKILL)
        assert run.wait(timeout=120) != 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert manifest(root, stage)["state"] == "HWFAILURE"
    assert f"{stage}/model.json" not in objects(root)
    assert status(tmp_path)["exp1"]["en-xa"]["train_backward"]["state"] == "HWFAILURE"

    # Snakemake, the runner and the step are killed at once: the HWFAILURE
    # series resumed in place (a step killed from outside), and its record
    # still says HWFAILURE, beside the running marker nobody ended.
    run = start_run(tmp_path, root)
    try:
        running = wait_for_checkpoint(root, stage)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while Path(f"/proc/{running['pid']}").exists() and time.time() < deadline:
        time.sleep(0.1)
    names = objects(root)
    assert manifest(root, stage)["state"] == "HWFAILURE" and f"{stage}/model.json" not in names
    assert f"{stage}/_running.json" in names
    assert status(tmp_path)["exp1"]["en-xa"]["train_backward"]["state"] == "interrupted"

    config = config_for(root, LONG)
    config["stages"]["train_backward"]["epochs"] = 2
    # The interrupted series ended as a cancel (the old way of a vanished
    # runner; by default it goes on in place: tests/test_driver_crash.py).
    config["stages"]["train_backward"].setdefault("policy", {})["runner_gone"] = "cancel"
    write_config(tmp_path, config)
    snakemake(tmp_path, *flags(root), "--unlock")
    assert planned(tmp_path, *flags(root), "--until", "train_backward") == {"train_backward": 1}
    snakemake(tmp_path, *flags(root), "--until", "train_backward")
    record = manifest(root, stage)
    assert record["state"] == "SUCCESS" and record["attempts"][0]["state"] == "HWFAILURE"
    # Each series went on in place from the checkpoints the last one left
    # (a step killed from outside, then a cancel): nothing archived.
    assert [(a["action"], a["state"]) for a in record["attempts"]] == [
        ("cmd", "HWFAILURE"), ("restart", "CANCELLED"), ("restart", "SUCCESS")], record["attempts"]
    names = objects(root)
    assert not any(n.startswith(f"{stage}/.attempts/") for n in names)
    assert any(n.startswith(f"{stage}/checkpoints/epoch-") for n in names)


def study_config(root: str, cells: list[int], **policy) -> dict:
    config = yaml.safe_load((EXAMPLE / "config" / "config.yaml").read_text())
    config["root"] = root
    config["experiments"]["sweep"]["grid"] = {"alpha": [1.0], "cells": cells}
    config["experiments"]["sweep"]["per_instance"] = {"alpha1.0-cells40": {"simulate": {"bad_node_after": 3}},
                                                      "alpha1.0-cells150": {"simulate": {"bad_node_after": 1000}}}
    config["stages"]["simulate"]["policy"].update({"runtime": 0.01, "max_attempts": 10, **policy})
    return config


def test_param_study_restart_rerun_and_next_run_on_a_bucket(bucket, tmp_path):
    root = f"{bucket}/results"
    snakefile = EXAMPLE / "workflow" / "Snakefile"
    write_config(tmp_path, study_config(root, [40, 150]))
    snakemake(tmp_path, *flags(root), snakefile=snakefile)
    sim = "_all/sweep/simulate"

    # HWFAILURE after checkpoints → the check passes → restart in place from them.
    late = manifest(root, f"{sim}/alpha1.0-cells150")
    assert [(a["action"], a["state"]) for a in late["attempts"]] == [("cmd", "HWFAILURE"), ("restart", "SUCCESS")]
    assert late["attempts"][0]["checks"] == {"has_checkpoint": "SUCCESS"}
    log = fs().cat_file(f"{key(root)}/{sim}/alpha1.0-cells150/_logs/attempt-2.log").decode()
    assert "resuming from step 800" in log
    assert not [n for n in objects(root) if n.startswith(f"{sim}/alpha1.0-cells150/.attempts/")]
    # HWFAILURE before any checkpoint → the check fails → rerun in a new workspace.
    early = manifest(root, f"{sim}/alpha1.0-cells40")
    assert [(a["action"], a["state"]) for a in early["attempts"]] == [("cmd", "HWFAILURE"), ("rerun", "SUCCESS")]
    assert early["attempts"][0]["checks"] == {"has_checkpoint": "FAILED"}
    summary = fs().cat_file(f"{key(root)}/_all/sweep/summary_report/summary.md").decode()
    assert "2/2 instances complete" in summary

    # A point that never finishes: its extract runs over it; the summary, made
    # from 2 points before, is made again from the 3 (the set grew). The next
    # run redoes the point and its extract (the marker in the bucket is dated
    # after the placeholders), and the summary with them: it is provisional.
    write_config(tmp_path, study_config(root, [40, 150, 600], max_attempts=2, runtime=0.004, runtime_growth=1))
    grown = snakemake(tmp_path, *flags(root), snakefile=snakefile)
    assert "sweep/summary_report: made from 2 inputs, now 3 (1 new, 0 gone): redone" in grown.stderr
    assert manifest(root, f"{sim}/alpha1.0-cells600")["state"] == "TIMEOUT"
    assert manifest(root, "_all/sweep/data_extract/alpha1.0-cells600")["provisional"] is True
    assert len(manifest(root, "_all/sweep/summary_report")["inputs"]) == 3
    assert manifest(root, "_all/sweep/summary_report")["provisional"] is True
    assert planned(tmp_path, *flags(root), snakefile=snakefile) == {"simulate": 1, "data_extract": 1,
                                                                    "summary_report": 1}

    # The next run's series begins as the policy says (restart in place, from
    # the bucket's checkpoints); with max_series 2 it is then given up, and
    # the run after that has nothing to do.
    write_config(tmp_path, study_config(root, [40, 150, 600], max_attempts=2, runtime=0.004, runtime_growth=1,
                                        max_series=2))
    snakemake(tmp_path, *flags(root), snakefile=snakefile)
    big = manifest(root, f"{sim}/alpha1.0-cells600")
    second = [a for a in big["attempts"] if a["series"] == 2]
    assert second[0]["action"] == "restart" and "series 1's last attempt (TIMEOUT)" in second[0]["why"]
    assert "resuming from step" in fs().cat_file(f"{key(root)}/{sim}/alpha1.0-cells600/{second[0]['log']}").decode()
    assert big["given_up"] is True
    assert planned(tmp_path, *flags(root), snakefile=snakefile) == {}


def test_missing_bucket_and_missing_settings_are_one_clear_line(gcs_emulator, tmp_path):
    root = f"gs://no-such-bucket-{os.getpid()}/results"
    write_config(tmp_path, config_for(root))
    proc = snakemake(tmp_path, "-n", *flags(root), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert f"{root}: bucket 'no-such-bucket-{os.getpid()}' does not exist" in out
    assert not fs().exists(f"no-such-bucket-{os.getpid()}")   # and nothing created it
    proc = waypost(tmp_path, "status", check=False)
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr

    proc = snakemake(tmp_path, "-n", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert f"--default-storage-provider waypost --default-storage-prefix {root}" in out


SYNTAX_SNAKEFILE = r'''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule lines:
    output: a=wp.out("a.txt"), extra=wp.out("extra.txt")
    shell: "printf 'one\ntwo\nthree\n'>{output.a};echo extra>{output.extra}"

rule word:
    output: b=wp.out("b.txt")
    shell: "echo four>{output.b}"

rule join:
    input: a=wp.stage("lines", "a.txt"), extra=wp.stage("lines", "extra.txt"), b=wp.stage("word", "b.txt")
    output: c=wp.out("c.txt"), n=wp.out("n.txt"), every=wp.out("every.txt"), q=wp.out("q.txt")
    params:
        target=lambda wc, output: output.q,
        flag=lambda wc, input: f"--from={input.b}",
        elsewhere=wp.setting("elsewhere"),
    shell:
        "(cat {input.a};cat {input.b})>{output.c};n=$(wc -l<{input.a});echo $n>{output.n};"
        "cat {input}|sort>{output.every};"
        "f='{params.flag}';cat \"${{f#--from=}}\">'{params.target}';"
        "echo note: {params.elsewhere} >> {output.n}"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def test_a_bucket_steps_paths_are_local_whatever_shell_syntax_stands_next_to_them(bucket, tmp_path):
    # The job's files are mapped whole (never found by scanning the command's
    # text): `;`, `(`, `)`, `<`, `>`, `|`, quotes and `$( )` right against
    # them, a whole list ({input}), a path built by a params function. A
    # gs:// URL the command names otherwise reaches the step as it is, and
    # the runner says so.
    root = f"{bucket}/results"
    (tmp_path / "workflow").mkdir()
    (tmp_path / "workflow" / "Snakefile").write_text(SYNTAX_SNAKEFILE)
    (tmp_path / "config").mkdir()
    write_config(tmp_path, {"root": root, "experiments": {"e1": {}},
                            "stages": {"join": {"elsewhere": f"{bucket}/not-an-input.txt"}}}, name="config/config.yaml")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                           str(LOCAL_PROFILE), *flags(root)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "No such file or directory" not in proc.stderr
    stage = f"{key(root)}/_all/e1/join"

    def read(name: str) -> str:
        return fs().cat_file(f"{stage}/{name}").decode()
    assert read("c.txt") == "one\ntwo\nthree\nfour\n"
    assert read("n.txt") == f"3\nnote: {bucket}/not-an-input.txt\n"
    assert read("every.txt") == "extra\nfour\none\nthree\ntwo\n"
    assert read("q.txt") == "four\n"
    data = manifest(root, "_all/e1/join")
    assert data["state"] == "SUCCESS" and {o["path"] for o in data["outputs"]} == {"c.txt", "n.txt", "every.txt",
                                                                                    "q.txt"}
    assert {i["path"] for i in data["inputs"]} == {f"{root}/_all/e1/lines/a.txt", f"{root}/_all/e1/lines/extra.txt",
                                                    f"{root}/_all/e1/word/b.txt"}
    log = read(data["attempts"][0]["log"])
    assert f"waypost: note: the command names {bucket}/not-an-input.txt" in log
