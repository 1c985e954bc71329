"""The catalog and `waypost find`, over a local root and a gs:// root on
fake-gcs-server; and a local run that reuses a teacher from the bucket."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import pytest
import yaml
from conftest import SMALL_CONFIG, planned, read_manifest, snakemake, waypost, write_config

from waypost.model import diffs, parallel
from waypost.ops import catalog
from waypost.stores import gcs, walk


def manifests_under(root: Path) -> set[str]:
    return {str(p.parent) for p in root.rglob("_manifest.json") if ".attempts" not in p.parts}


@pytest.fixture(params=["in process", "in worker processes", "workers unavailable"])
def loading(request, monkeypatch):
    """How a refresh lists and reads: a small tree stays in process; with the
    thresholds at their lowest every listing and read goes through worker
    processes (one pair, one manifest per chunk); and where no worker process
    can start, the refresh does the work itself."""
    started = []
    if request.param != "in process":
        for module, names in ((catalog, ("PARALLEL_FROM", "CHUNK")), (walk, ("PARALLEL_FROM", "PAIRS_PER_CHUNK"))):
            for name in names:
                monkeypatch.setattr(module, name, 1)
        real = parallel.ProcessPoolExecutor

        def pool(*args, **kwargs):
            if request.param == "workers unavailable":
                raise OSError("Resource temporarily unavailable")
            started.append(args)
            return real(*args, **kwargs)
        monkeypatch.setattr(parallel, "ProcessPoolExecutor", pool)
    yield started
    if request.param == "in worker processes" and len(os.sched_getaffinity(0)) > 1:
        assert started, "no worker processes were used"


def test_refresh_is_incremental_and_survives_corrupt_manifests(run_copy, tmp_path, loading):
    root = run_copy / "results"
    cat = catalog.Catalog(str(tmp_path / "cat.sqlite"))
    first = cat.refresh(str(root))
    assert first.listed == first.read == len(manifests_under(root)) == cat.count()
    assert {r["location"] for r in cat.find()} == manifests_under(root)

    again = cat.refresh(str(root))
    assert (again.read, again.removed) == (0, 0)

    # two changed, one corrupt, one gone, one archived (no longer current)
    student = root / "en-xa" / "exp1" / "train_student"
    data = read_manifest(student)
    data["state"] = "FAILED"
    (student / "_manifest.json").write_text(json.dumps(data))
    vocab = root / "en-xb" / "exp1" / "train_vocab"
    (vocab / "_manifest.json").write_text("{ truncated")
    (root / "en-xb" / "exp1" / "export" / "_manifest.json").unlink()
    teacher = root / "en-xa" / "exp1" / "train_teacher" / "1"
    (teacher / ".attempts" / "1").mkdir(parents=True)
    os.rename(teacher / "_manifest.json", teacher / ".attempts" / "1" / "_manifest.json")
    step = cat.refresh(str(root))
    assert (step.read, step.removed) == (3, 2)   # the archive is read as one more (archived) manifest
    assert len(step.problems) == 1 and str(vocab) in step.problems[0]
    assert cat.find(stage="train_student", pair="en-xa")[0]["state"] == "FAILED"
    assert not cat.find(stage="export", pair="en-xb")
    teachers = {r["location"]: r["archive"] for r in cat.find(stage="train_teacher", pair="en-xa")}
    assert teachers == {str(teacher.parent / "0"): None, str(teacher / ".attempts" / "1"): ".attempts/1"}
    assert [p["location"] for p in cat.problems()] == [str(vocab)]
    # the root's record counts its rows, not just those this refresh read
    assert cat.db.execute("SELECT manifests FROM roots").fetchone()[0] == cat.count()


def test_find_filters_and_orders_newest_first(run_copy, tmp_path):
    cat = catalog.Catalog(str(tmp_path / "cat.sqlite"))
    cat.refresh(str(run_copy / "results"))
    rows = cat.find(stage="train_*", pair="en-x?")
    assert {r["stage"] for r in rows} == {"train_vocab", "train_backward", "train_teacher", "train_student"}
    assert [r["created"] for r in rows] == sorted((r["created"] for r in rows), reverse=True)
    assert len(cat.find(stage="train_teacher", pair="en-xa", state="SUCCESS")) == 2
    assert cat.find(since="2999-01-01") == []
    newest = rows[0]
    assert cat.find(config_hash=newest["config_hash"], stage=newest["stage"])[0]["location"] is not None
    assert diffs.settings_diff({"epochs": 2, "seed": 1}, {"epochs": 3, "lr": 0.1}) == [
        "epochs: 2 → 3", "lr: ∅ → 0.1", "seed: 1 → ∅"]


def upload(local: Path, url: str) -> None:
    fs, path = gcs.filesystem(url)
    fs.put(str(local), path, recursive=True)


def test_find_across_a_local_and_a_gs_root(run_copy, bucket, monkeypatch):
    remote = f"{bucket}/shared"
    upload(run_copy / "results", remote)
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["catalog"] = [remote]
    write_config(run_copy, config)

    out = json.loads(waypost(run_copy, "find", "--stage", "train_teacher", "--pair", "en-xa", "--json").stdout)
    where = sorted(r["location"] for r in out)
    assert where == sorted([str(run_copy / "results/en-xa/exp1/train_teacher" / i) for i in "01"]
                           + [f"{remote}/en-xa/exp1/train_teacher/{i}" for i in "01"])
    assert all(r["differs"] == [] for r in out)
    text = waypost(run_copy, "find", "--stage", "train_teacher", "--pair", "en-xa", "--width", "250").stdout
    assert "4 stage(s) found in 2 root(s)" in text and f"{remote}/en-xa/exp1/train_teacher/0" in text

    # The refresh reads only the manifests that changed (counted at the client).
    cat = catalog.Catalog(str(run_copy / ".waypost" / "catalog.sqlite"))
    fs, _ = gcs.filesystem(remote)
    reads = []
    original = fs.cat
    monkeypatch.setattr(fs, "cat", lambda paths, **kw: reads.extend(paths) or original(paths, **kw))
    assert cat.refresh(remote).read == 0 and reads == []
    changed = f"{remote}/en-xb/exp1/train_student/_manifest.json"
    data = json.loads(fs.cat_file(changed[len("gs://"):]))
    data["created"] = "2030-01-01T00:00:00.000+00:00"
    fs.pipe_file(changed[len("gs://"):], json.dumps(data).encode())
    fs.rm(f"{remote}/en-xa/exp1/export/_manifest.json"[len("gs://"):])
    step = cat.refresh(remote)
    assert (step.read, step.removed) == (1, 1) and reads == [changed[len("gs://"):]]
    assert cat.find(root=remote)[0]["location"] == f"{remote}/en-xb/exp1/train_student"


def test_local_run_reuses_a_teacher_from_a_bucket(finished_run, bucket, tmp_path):
    remote = f"{bucket}/team/results"
    upload(finished_run / "results", remote)
    config = copy.deepcopy(SMALL_CONFIG)
    config["experiments"] = {"mine": {"pairs": ["en-xa"], "teachers": 2,
                                      "reuse": {"train_teacher": {"en-xa": f"{remote}/en-xa/exp1/train_teacher"}}}}
    write_config(tmp_path, config)
    jobs = planned(tmp_path, "--until", "train_teacher")
    assert jobs == {"train_teacher": 2}  # nothing upstream of the reused teachers is needed
    snakemake(tmp_path, "--until", "train_teacher")
    for i in "01":
        record = read_manifest(tmp_path / "results/en-xa/mine/train_teacher" / i)
        source = read_manifest(finished_run / "results/en-xa/exp1/train_teacher" / i)
        assert record["reused_from"] == f"{remote}/en-xa/exp1/train_teacher/{i}"
        assert record["attempts"][0]["how"] == "copied"
        assert record["outputs"] == [{k: o[k] for k in ("path", "size", "sha256", "crc32c") if k in o}
                                     for o in source["outputs"]]
    # the rest of the pipeline runs on the reused teachers
    snakemake(tmp_path)
    assert read_manifest(tmp_path / "results/_all/mine/report")["state"] == "SUCCESS"


def test_missing_bucket_is_one_clear_line(run_copy, gcs_emulator):
    config = yaml.safe_load((run_copy / "config.yaml").read_text())
    config["catalog"] = ["gs://no-such-bucket-here/x"]
    write_config(run_copy, config)
    proc = waypost(run_copy, "find", "--stage", "train_vocab", "--json", check=False)
    assert proc.returncode == 1  # a problem found (one root can't be read), not fatal:
    assert "gs://no-such-bucket-here/x" in proc.stderr and "Traceback" not in proc.stderr
    assert len(json.loads(proc.stdout)) == 2  # the local root still answers


@pytest.mark.parametrize("count", [300])
def test_refresh_scales_with_changes_not_with_size(tmp_path, count):
    """Many stage dirs, few changes: the second refresh reads only those."""
    root = tmp_path / "root"
    template = {"schema": 1, "experiment": "e", "stage": "s", "state": "SUCCESS", "attempts": [{}],
                "created": "2026-01-01T00:00:00+00:00", "outputs": [], "settings": {"k": 1}}
    for i in range(count):
        d = root / f"p{i % 30}" / f"e{i // 30}" / "s"
        d.mkdir(parents=True)
        (d / "_manifest.json").write_text(json.dumps({**template, "pair": f"p{i % 30}", "experiment": f"e{i // 30}"}))
    cat = catalog.Catalog(str(tmp_path / "c.sqlite"))
    assert cat.refresh(str(root)).read == count
    time.sleep(0.01)
    for i in range(3):
        path = root / f"p{i}" / "e0" / "s" / "_manifest.json"
        path.write_text(path.read_text().replace('"k": 1', '"k": 2'))
    step = cat.refresh(str(root))
    assert (step.listed, step.read) == (count, 3)
    assert len(cat.find(experiment="e0")) == 30
