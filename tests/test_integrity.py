"""Content integrity on a gs:// root without downloading outputs (issue 21,
items 4 and 5): manifests record each output's crc32c as GCS lists it,
`waypost verify` compares the listing's crc32c with them, reuse between
buckets refuses a source object replaced since its manifest, and the
report's failure chase follows the chain through the bucket's manifests.
Against fake-gcs-server, with its request log."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import google_crc32c
from conftest import gcs_config as config_for
from conftest import gcs_flags as flags
from conftest import gcs_fs as fs
from conftest import gcs_key as key
from conftest import gcs_manifest as manifest
from conftest import gcs_manifests as manifests
from conftest import gcs_objects as objects
from conftest import media_downloads as downloads
from conftest import snakemake, step_input, waypost, write_config


def crc32c(data: bytes) -> str:
    """As GCS lists it: base64 of the 4-byte big-endian CRC32C."""
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def same_size_other_bytes(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0x01])


def output_downloads(requests: list[str]) -> list[str]:
    """Downloads of anything but a manifest (verify reads those, in one batch)."""
    return [r for r in downloads(requests) if not r.split("?")[0].endswith("/_manifest.json")]


def test_a_local_step_records_crc32c_beside_sha256(tmp_path):
    # As a job of a local stage starts the runner: `python -S launch.py`, no site-packages on its path.
    from waypost.runner import main as runner
    stage = tmp_path / "p/e/s"
    out = stage / "out.bin"
    payload = bytes(range(256)) * 5000   # more than one read chunk: the crc32c goes on over chunks
    src = tmp_path / "payload.bin"
    src.write_bytes(payload)
    proc = subprocess.run(runner.command(sys.executable), input=step_input(stage, f"cp {src} {out}", [out]),
                          capture_output=True)
    proc.stderr = proc.stderr.decode()
    assert proc.returncode == 0, proc.stderr
    (described,) = json.loads((stage / "_manifest.json").read_text())["outputs"]
    assert described["crc32c"] == crc32c(payload) and described["size"] == len(payload)
    assert "crc32c can't be imported" not in proc.stderr


def test_bucket_manifests_record_the_crc32c_gcs_lists(gcs_finished):
    root = gcs_finished.root
    listing = fs().find(key(root), detail=True)
    checked = 0
    for where, data in manifests(root).items():
        for out in data["outputs"]:
            assert out["crc32c"] == listing[f"{key(root)}/{where}/{out['path']}"]["crc32c"], (where, out)
            checked += 1
    assert checked > 20


def test_verify_on_a_bucket_compares_crc32c_without_downloading(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    student, vocab = "en-xa/exp1/train_student", "en-xb/exp1/train_vocab"
    # The student's model replaced by as many other bytes: only its contents tell.
    model = fs().cat_file(f"{key(root)}/{student}/model.json")
    fs().pipe_file(f"{key(root)}/{student}/model.json", same_size_other_bytes(model))
    # A manifest from before waypost recorded crc32c: that stage is checked by size.
    old = manifest(root, vocab)
    for out in old["outputs"]:
        del out["crc32c"]
    fs().pipe_file(f"{key(root)}/{vocab}/_manifest.json", json.dumps(old).encode())
    names = objects(root)

    mark = gcs_log.mark()
    proc = waypost(work, "verify", check=False)
    requests = gcs_log.requests(mark)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{root}/{student}: model.json does not match its checksum (crc32c" in proc.stdout
    assert "1 stage(s) not to be trusted" in proc.stdout
    assert "bucket: 1 stage(s) checked by size only" in proc.stdout
    assert output_downloads(requests) == [], output_downloads(requests)
    assert objects(root) == names

    mark = gcs_log.mark()
    proc = waypost(work, "verify", "--repair", check=False)
    requests = gcs_log.requests(mark)
    assert proc.returncode == 1 and f"{root}/{student}: " in proc.stdout and "archived in" in proc.stdout
    assert output_downloads(requests) == [], output_downloads(requests)
    names = objects(root)
    assert f"{student}/.attempts/1/model.json" in names and f"{student}/model.json" not in names
    assert f"{student}/.attempts/1/_manifest.json" in names
    assert f"{vocab}/vocab.json" in names   # size only: nothing wrong there

    out = waypost(work, "verify").stdout
    assert "every manifest checks out" in out and "1 stage(s) checked by size only" in out


def test_reuse_from_a_bucket_refuses_a_source_replaced_since_its_manifest(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    config = config_for(root)
    config["experiments"]["exp2"] = {"pairs": ["en-xa"], "teachers": 2, "reuse": {"train_teacher": "exp1"}}
    write_config(work, config)
    source = "en-xa/exp1/train_teacher/0"
    model = fs().cat_file(f"{key(root)}/{source}/model.json")
    fs().pipe_file(f"{key(root)}/{source}/model.json", same_size_other_bytes(model))

    mark = gcs_log.mark()
    proc = snakemake(work, *flags(root), "--until", "train_teacher", check=False)
    requests = gcs_log.requests(mark)
    assert proc.returncode != 0
    assert f"{root}/{source}/model.json: differs from its manifest (crc32c" in proc.stderr, proc.stderr[-3000:]
    names = objects(root)
    assert not [n for n in names if n.startswith("en-xa/exp2/train_teacher/0/")], names
    assert not [r for r in requests if "rewriteTo" in r and "exp2/train_teacher/0/" in r]
    # The untouched teacher is reused as before.
    assert manifest(root, "en-xa/exp2/train_teacher/1")["reused_from"] == f"{root}/en-xa/exp1/train_teacher/1"


def test_report_names_the_first_failure_upstream_on_a_bucket(bucket, tmp_path):
    root = f"{bucket}/results"
    config = config_for(root, experiments={"exp1": {"pairs": ["en-xb"], "teachers": 1}})
    config["policy"] = {"max_attempts": 1}
    config["stages"]["report"] = {"policy": {"depends": "all_done"}}
    # en-xb's backward model ends FAILED: everything downstream of it is SKIPPED.
    config["experiments"]["exp1"]["per_pair"] = {"en-xb": {"train_backward": {
        "policy": {"cues": [{"action": "fail", "when": "cmd.SUCCESS"}]}}}}
    write_config(tmp_path, config)
    proc = snakemake(tmp_path, *flags(root), check=False)
    assert proc.returncode != 0   # export needs the student and no funnel takes its place

    found = manifests(root)
    assert found["en-xb/exp1/train_backward"]["state"] == "FAILED"
    assert found["en-xb/exp1/train_student"]["state"] == "SKIPPED"
    assert found["en-xb/exp1/evaluate/student"]["state"] == "SKIPPED"
    report = fs().cat_file(f"{key(root)}/_all/exp1/report/report.md").decode()
    rows = {model: line for line in report.splitlines() for model in ("backward", "teacher-0", "student")
            if f"| en-xb | {model} |" in line}
    assert set(rows) == {"backward", "teacher-0", "student"}, report
    for model, row in rows.items():
        # Not the direct input (evaluate SKIPPED): the chain followed up to the first failure.
        assert "failed: train_backward FAILED (1 attempt)" in row, (model, report)


def test_adopt_on_a_bucket_takes_crc32c_from_the_listing(gcs_copy, gcs_log):
    root, work = gcs_copy.root, gcs_copy.workdir
    config = config_for(root)
    config["experiments"]["exp2"] = {"pairs": ["en-xa"], "teachers": 2}
    write_config(work, config)
    target = "en-xa/exp2/train_vocab"
    vocab = b'{"placed": "by hand"}\n'
    fs().pipe_file(f"{key(root)}/{target}/vocab.json", vocab)
    waypost(work, "adopt", "train_vocab", "--experiment", "exp2", "--pair", "en-xa")
    (out,) = manifest(root, target)["outputs"]
    assert out["crc32c"] == crc32c(vocab) == fs().info(f"{key(root)}/{target}/vocab.json")["crc32c"]

    # So verify sees an adopted object replaced by other bytes of the same size.
    fs().pipe_file(f"{key(root)}/{target}/vocab.json", same_size_other_bytes(vocab))
    mark = gcs_log.mark()
    proc = waypost(work, "verify", check=False)
    assert proc.returncode == 1 and f"{root}/{target}: vocab.json does not match its checksum" in proc.stdout
    assert output_downloads(gcs_log.requests(mark)) == []
