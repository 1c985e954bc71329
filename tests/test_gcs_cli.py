"""The `waypost` commands that steer the file state (rerun, adopt, plan,
verify, cron, reuse) on a gs:// root, against fake-gcs-server: each on a
copy, made in the bucket, of one finished run (conftest: gcs_finished)."""

from __future__ import annotations

import json
import socket
import subprocess

import yaml
from conftest import LOCAL_PROFILE, SNAKEFILE, planned, snakemake, waypost, write_config
from conftest import gcs_config as config_for
from conftest import gcs_flags as flags
from conftest import gcs_fs as fs
from conftest import gcs_key as key
from conftest import gcs_manifest as manifest
from conftest import gcs_manifests as manifests
from conftest import gcs_objects as objects
from conftest import media_downloads as downloads

PAIRS = ("en-xa", "en-xb")
UPSTREAM_OF_STUDENT = ["fetch_corpus", "clean_corpus", "train_vocab", "train_backward", "translate_mono",
                       "train_teacher", "translate_corpus"]


def listings(requests: list[str]) -> list[str]:
    return [r for r in requests if r.startswith("GET ") and "/o?" in r]


def only_manifests_came_down(requests: list[str]) -> bool:
    return all(r.split("?")[0].endswith("/_manifest.json") for r in downloads(requests))


def test_rerun_downstream_archives_in_the_bucket_and_the_next_run_redoes_exactly_those(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    student = "en-xa/exp1/train_student"
    before, names = manifests(root), objects(root)

    # Refused while an attempt runs (its marker is in the bucket; its process alive here).
    marker = f"{key(root)}/{student}/_running.json"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        fs().pipe_file(marker, json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}).encode())
        proc = waypost(work, "rerun", "train_student", "--downstream", check=False)
        assert proc.returncode == 1 and f"an attempt is running in {root}/{student} (pid {sleeper.pid}" in proc.stderr
        assert "nothing was changed" in proc.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
    fs().rm_file(marker)
    out = waypost(work, "rerun", "train_student", "--downstream", "-n").stdout
    assert "7 stage(s) would be redone" in out and objects(root) == names

    mark = gcs_log.mark()
    out = waypost(work, "rerun", "train_student", "--downstream").stdout
    requests = gcs_log.requests(mark)
    redone = sorted([f"{p}/exp1/{s}" for p in PAIRS for s in ("train_student", "evaluate/student", "export")]
                    + ["_all/exp1/report"])
    assert sorted(line.split(": ")[0] for line in out.splitlines() if "archived in" in line) == \
        [f"{root}/{d}" for d in redone]
    assert "7 stage(s) will be redone by the next run" in out
    # One listing of the root; only manifests came down (for --downstream);
    # the archive is a server-side move.
    assert len(listings(requests)) == 1, listings(requests)
    assert only_manifests_came_down(requests), downloads(requests)
    assert any("rewriteTo" in r and f"{student}/.attempts/1/model.json" in r for r in requests)
    names = objects(root)
    for kept in ("model.json", "_manifest.json", "_logs/attempt-1.log"):
        assert f"{student}/.attempts/1/{kept}" in names and f"{student}/{kept}" not in names
    assert "en-xa/exp1/evaluate/teacher-0/_manifest.json" in names  # not made from the student

    assert planned(work, *flags(root)) == {"train_student": 2, "evaluate": 2, "export": 2, "report": 1}
    snakemake(work, *flags(root))
    after = manifests(root)
    assert sorted(d for d in after if after[d]["created"] != before[d]["created"]) == redone
    assert [a["number"] for a in after[student]["attempts"]] == [1]  # a new stage, the old one archived
    assert planned(work, *flags(root)) == {}


def test_adopt_objects_placed_by_hand_in_the_bucket(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    config = config_for(root)
    config["experiments"]["exp2"] = {"pairs": ["en-xa"], "teachers": 2}
    write_config(work, config)
    target = "en-xa/exp2/train_vocab"
    fs().copy(f"{key(root)}/en-xa/exp1/train_vocab/vocab.json", f"{key(root)}/{target}/vocab.json")

    mark = gcs_log.mark()
    out = waypost(work, "adopt", "train_vocab", "--experiment", "exp2", "--pair", "en-xa",
                  "--note", "copied by hand").stdout
    requests = gcs_log.requests(mark)
    assert "adopted 1 file(s)" in out
    record = manifest(root, target)
    original = manifest(root, "en-xa/exp1/train_vocab")["outputs"]
    assert record["adopted"] is True and record["state"] == "SUCCESS" and record["note"] == "copied by hand"
    assert record["outputs"] == original  # size from the listing, sha256 from the object's bytes
    assert [r.split("?")[0].rsplit("/o/", 1)[1] for r in downloads(requests)] == [f"results/{target}/vocab.json"]

    grid = json.loads(waypost(work, "status", "--json").stdout)["experiments"]
    assert grid["exp2"]["en-xa"]["train_vocab"]["state"] == "adopted"
    (row,) = json.loads(waypost(work, "find", "--experiment", "exp2", "--json").stdout)
    assert row["location"] == f"{root}/{target}" and row["adopted"] is True
    assert "train_vocab" not in planned(work, *flags(root), "--until", "train_vocab")
    proc = waypost(work, "adopt", "train_vocab", "--experiment", "exp1", "--pair", "en-xa", check=False)
    assert proc.returncode == 1 and "already a SUCCESS stage" in proc.stderr


def test_plan_reads_drift_from_the_bucket(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    config = config_for(root)
    config["stages"]["train_student"]["epochs"] = 4
    write_config(work, config)
    export = "en-xb/exp1/export"
    fs().rm([f"{key(root)}/{n}" for n in objects(root)
             if n.startswith(export + "/") and "/" not in n[len(export) + 1:] and not n.rsplit("/", 1)[1].startswith("_")])
    # translate_corpus was redone since en-xa's student read it: its manifest records other bytes
    corpus = manifest(root, "en-xa/exp1/translate_corpus")
    for out in corpus["outputs"]:
        out["sha256"] = "0" * 64
    fs().pipe_file(f"{key(root)}/en-xa/exp1/translate_corpus/_manifest.json", json.dumps(corpus).encode())

    mark = gcs_log.mark()
    # (waypost adds the storage options a gs:// root needs to the dry run)
    plan = json.loads(waypost(work, "plan", "--profile", str(LOCAL_PROFILE), "--json").stdout)
    assert only_manifests_came_down(gcs_log.requests(mark))
    assert [(r["pair"], r["stage"], r["why"]) for r in plan["next_run"]] == [("en-xb", "export", "outputs missing")]
    drifted = {(r["pair"], r["stage"]): [w for w in r["what"] if not w.startswith("code:")] for r in plan["drift"]}
    assert drifted[("en-xa", "train_student")] == ["settings: epochs: 2 → 4",
                                                   "inputs redone since: en-xa/exp1/translate_corpus/distilled.tsv"]
    assert drifted[("en-xb", "train_student")] == ["settings: epochs: 2 → 4"]
    assert not drifted.get(("en-xa", "train_teacher"))


def test_verify_repair_and_cron_in_the_bucket(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    vocab, clean, mono = "en-xa/exp1/train_vocab", "en-xb/exp1/clean_corpus", "en-xa/exp1/translate_mono"
    fs().rm_file(f"{key(root)}/{vocab}/vocab.json")
    data = fs().cat_file(f"{key(root)}/{clean}/clean.tsv")
    fs().pipe_file(f"{key(root)}/{clean}/clean.tsv", data[:-10])
    text = fs().cat_file(f"{key(root)}/{mono}/_manifest.json")
    fs().pipe_file(f"{key(root)}/{mono}/_manifest.json", text[:100])
    names = objects(root)

    proc = waypost(work, "verify", check=False)
    out = proc.stdout
    assert proc.returncode == 1   # problems found
    assert out.count("not done (use --repair to set it aside)") == 3 and objects(root) == names
    assert f"{root}/{vocab}: vocab.json is missing" in out
    assert f"{root}/{clean}: clean.tsv has {len(data) - 10} bytes, the manifest says {len(data)}" in out
    assert f"{root}/{mono}: {root}/{mono}/_manifest.json: unreadable manifest" in out
    assert "outputs checked by the crc32c GCS lists" in out

    mark = gcs_log.mark()
    proc = waypost(work, "verify", "--repair", check=False)
    out = proc.stdout
    requests = gcs_log.requests(mark)
    assert proc.returncode == 1
    assert out.count("archived in") == 3 and "3 stage(s) not to be trusted" in out
    assert len(listings(requests)) == 1 and only_manifests_came_down(requests), requests
    names = objects(root)
    assert f"{clean}/.attempts/1/clean.tsv" in names and f"{clean}/clean.tsv" not in names
    assert f"{mono}/.attempts/1/_manifest.json" in names and f"{vocab}/.attempts/1/_manifest.json" in names
    assert planned(work, *flags(root)) == {"train_vocab": 1, "clean_corpus": 1, "translate_mono": 1}

    out = waypost(work, "cron", "--profile", str(LOCAL_PROFILE), "--", "-s", str(SNAKEFILE)).stdout
    assert "3 stage(s) ran (3 SUCCESS)" in out and "snakemake exited 0" in out
    assert "every manifest checks out" in waypost(work, "verify").stdout


def test_reuse_pointers_from_a_bucket(gcs_finished, tmp_path):
    root = gcs_finished.root
    config = config_for(root)
    config["experiments"]["exp2"] = {"pairs": list(PAIRS), "teachers": 2}
    write_config(tmp_path, config)
    out = waypost(tmp_path, "reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_student").stdout
    assert "takes 7 stage(s) from exp1" in out
    pointers = yaml.safe_load((tmp_path / "reuse" / "exp2.yaml").read_text())["experiments"]["exp2"]["reuse"]
    assert pointers == {s: "exp1" for s in UPSTREAM_OF_STUDENT}
    proc = waypost(tmp_path, "reuse", "--into", "exp2", "--from", "exp3", "--upstream-of", "train_vocab", check=False)
    assert proc.returncode == 1 and f"{root}/en-xa/exp3/fetch_corpus: missing" in proc.stderr

    # A local root taking stages from an experiment in the bucket.
    local = tmp_path / "local"
    local.mkdir()
    config["root"] = "results"
    write_config(local, config)
    waypost(local, "reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_vocab", "--from-root", root)
    pointers = yaml.safe_load((local / "reuse" / "exp2.yaml").read_text())["experiments"]["exp2"]["reuse"]
    assert pointers == {s: {p: f"{root}/{p}/exp1/{s}" for p in PAIRS} for s in ("fetch_corpus", "clean_corpus")}
