"""A bucket mounted on the nodes as the root: the reference pipeline with
``root:`` on a real FUSE mount (rclone over fake-gcs-server, found in
/proc/mounts), reuse as a server-side copy, a deleted output redone alone,
rerun --downstream archiving, two crons, status and find through the mount
and through gs:// agreeing, a second mount of the bucket (another node, by
another host name) seeing a running stage as running, and a mount the mount
table can't name served through its bucket once the config declares it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import (
    LOCAL_PROFILE,
    REPO,
    SMALL_CONFIG,
    SNAKEFILE,
    gcs_fs,
    gcs_key,
    planned,
    snakemake,
    waypost,
    write_config,
)

PAIRS = ("en-xa", "en-xb")
UPSTREAM_OF_STUDENT = ["fetch_corpus", "clean_corpus", "train_vocab", "train_backward", "translate_mono",
                       "train_teacher", "translate_corpus"]


def grid(workdir: Path, config: str) -> dict:
    """experiment → pair → stage → state, as ``waypost status`` reads it."""
    found = json.loads(waypost(workdir, "status", "--json", config=config).stdout)["experiments"]
    return {e: {p: {s: c["state"] for s, c in row.items()} for p, row in rows.items()} for e, rows in found.items()}


def found(workdir: Path, config: str, root: str) -> list[tuple]:
    rows = json.loads(waypost(workdir, "find", "--stage", "train_*", "--json", "--db", f".waypost/{config}.db",
                              config=config).stdout)
    return sorted((r["location"][len(root):], r["state"], r.get("config_hash")) for r in rows)


def wait_until_listed(url: str, rel: str, timeout: float = 10) -> None:
    """Until the bucket has an object the mount writes."""
    deadline = time.time() + timeout
    while not gcs_fs().exists(f"{gcs_key(url)}/{rel}") and time.time() < deadline:
        time.sleep(0.1)


def test_the_reference_pipeline_on_a_mounted_bucket(mount_root, tmp_path):
    url, path = mount_root
    work = tmp_path
    config = {**copy.deepcopy(SMALL_CONFIG), "root": str(path / "results")}   # (never SMALL_CONFIG itself)
    write_config(work, config)
    write_config(work, {**config, "root": f"{url}/results"}, name="gs.yaml")
    snakemake(work)
    assert planned(work) == {}
    # Through the mount and through gs://: the same states, the same stages found.
    assert grid(work, "config.yaml") == grid(work, "gs.yaml")
    assert {s for rows in grid(work, "gs.yaml").values() for row in rows.values() for s in row.values()} == {"SUCCESS"}
    assert found(work, "config.yaml", str(path / "results")) == found(work, "gs.yaml", f"{url}/results")

    # A second experiment reuses everything upstream of the student: server-side copies.
    config["experiments"]["exp2"] = {"pairs": list(PAIRS), "teachers": 2}
    write_config(work, config)
    out = waypost(work, "reuse", "--into", "exp2", "--from", "exp1", "--upstream-of", "train_student").stdout
    assert "takes 7 stage(s) from exp1" in out
    snakemake(work)
    for pair in PAIRS:
        corpus = json.loads((path / "results" / pair / "exp2" / "translate_corpus" / "_manifest.json").read_text())
        assert corpus["reused_from"].endswith(f"/results/{pair}/exp1/translate_corpus")
        assert corpus["attempts"][0]["how"] == "copied in the bucket"
        student = json.loads((path / "results" / pair / "exp2" / "train_student" / "_manifest.json").read_text())
        assert student["attempts"][0]["action"] == "cmd"
    assert planned(work) == {}

    # A deleted output is redone alone.
    model = path / "results/en-xa/exp1/train_student/model.json"
    model.unlink()
    assert planned(work) == {"train_student": 1}
    snakemake(work)
    assert model.exists() and planned(work) == {}

    # rerun --downstream archives; the next run redoes the stages.
    out = waypost(work, "rerun", "export", "--experiment", "exp2", "--downstream").stdout
    assert "will be redone" in out
    assert (path / "results/en-xa/exp2/export/.attempts/1/_manifest.json").exists()
    assert planned(work) == {"export": 2}
    snakemake(work)
    assert planned(work) == {}

    # Two crons: the second has nothing to do.
    for _ in range(2):
        cron = subprocess.run([sys.executable, "-m", "waypost.cli", "cron", "--config", str(work / "config.yaml"),
                               "--workflow", str(REPO / "workflow"), "--profile", str(LOCAL_PROFILE), "--", "-s",
                               str(SNAKEFILE)], cwd=work, capture_output=True, text=True, timeout=600)
        assert cron.returncode == 0, cron.stderr
    log = [json.loads(line) for line in (work / ".waypost" / "cron.log").read_text().splitlines()]
    assert len(log) == 2 and log[-1]["jobs"] == 0


SLOW = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule slow:
    output: out=wp.out("x.txt", funnel=True)
    shell: "for i in $(seq 1200); do [ -e ${{RELEASE_FILE:?}} ] && break; sleep 0.1; done; echo done > {output.out}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def node2_status(workdir: Path) -> dict:
    """``waypost status`` on the second node: through the second mount, on a
    host of another name (its own UTS namespace), so that the running
    stage's runner can't be asked by its pid: only its lease tells."""
    cmd = [sys.executable, "-m", "waypost.cli", "status", "--config", "config/node2.yaml", "--workflow", "workflow",
           "--json"]
    proc = subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname node2-of-test && exec "$@"', "sh", *cmd],
                          cwd=workdir, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["experiments"]["e1"]["_all"]["slow"]


def test_a_second_node_sees_a_running_stage_as_running(mount_root, second_node, tmp_path):
    url, path = mount_root
    (tmp_path / "workflow").mkdir()
    (tmp_path / "workflow" / "Snakefile").write_text(SLOW)
    (tmp_path / "config").mkdir()
    config = {"root": str(path / "results"), "experiments": {"e1": {}}}
    write_config(tmp_path, config, name="config/config.yaml")
    other = second_node / path.name / "results"
    write_config(tmp_path, {**config, "root": str(other)}, name="config/node2.yaml")
    release = tmp_path / "release"   # the job runs until the test has looked (however slow the machine)
    run = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                            str(LOCAL_PROFILE)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env={**os.environ, "RELEASE_FILE": str(release)})
    try:
        wait_until_listed(url, "results/_all/e1/slow/_running.json")
        time.sleep(1.5)   # the second mount's directory cache
        cell = node2_status(tmp_path)
        assert cell["state"] == "running", cell   # not gone, not done: its lease is fresh
    finally:
        release.touch()
        out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out
    wait_until_listed(url, "results/_all/e1/slow/_manifest.json")
    time.sleep(1.5)
    cell = node2_status(tmp_path)
    assert cell["state"] == "SUCCESS", cell


def test_a_mount_the_table_cannot_name_is_served_through_its_bucket_once_the_config_declares_it(
        mounted_bucket, unnamed_mount, tmp_path):
    """A mount whose /proc/mounts line names no bucket: reuse copies
    through the mount and says so once; with ``mounts:`` in the config the
    planner and the jobs (from their step spec) know the bucket, and a reuse
    is a copy in the bucket."""
    url, _ = mounted_bucket
    name = "declared-" + tmp_path.name[-20:].replace("_", "-")
    root = unnamed_mount / name / "results"
    root.mkdir(parents=True)
    config = {**copy.deepcopy(SMALL_CONFIG), "root": str(root)}
    config["experiments"] = {"exp1": config["experiments"]["exp1"]}
    write_config(tmp_path, config)
    snakemake(tmp_path, "--until", "translate_corpus")

    def reuse_into(experiment: str) -> tuple[set[str], str]:
        config["experiments"][experiment] = copy.deepcopy(config["experiments"]["exp1"])
        write_config(tmp_path, config)
        waypost(tmp_path, "reuse", "--into", experiment, "--from", "exp1", "--upstream-of", "train_student")
        run = snakemake(tmp_path, "--until", "translate_corpus")
        hows = {json.loads((root / pair / experiment / "translate_corpus" / "_manifest.json").read_text())
                ["attempts"][0]["how"] for pair in config["experiments"]["exp1"]["pairs"]}
        return hows, run.stderr + run.stdout

    hows, said = reuse_into("exp2")
    assert hows == {"copied"}
    assert "whose bucket waypost doesn't know" in said

    config["mounts"] = {str(unnamed_mount): url}
    hows, said = reuse_into("exp3")
    assert hows == {"copied in the bucket"}
    assert "whose bucket waypost doesn't know" not in said
    assert grid(tmp_path, "config.yaml")["exp3"]["en-xa"]["translate_corpus"] == "SUCCESS"


def reference_with_checks(root: str) -> dict:
    """The reference config itself (config/config.yaml: its policies, their
    ``checks``), made small, on ``root``, with names of its own."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["root"] = root
    config["experiments"] = {"trial7": {"pairs": ["de-yq"], "teachers": 2}}
    for stage, small in SMALL_CONFIG["stages"].items():
        config["stages"][stage] = {**config["stages"].get(stage, {}), **small}
    return config


def test_the_reference_pipeline_with_its_checks_on_a_cache_off_mount(mount_root, tmp_path):
    """The reference pipeline, its checks on, on rclone with ``--vfs-cache-mode
    off`` (gcsfuse's shape: a file is written once, never appended to or
    seeked in): every stage SUCCESS, the training stages' check run and
    logged, then nothing to do."""
    _, path = mount_root
    root = path / "results"
    config = reference_with_checks(str(root))
    assert config["stages"]["train_student"]["policy"]["checks"], "the reference config's checks are gone"
    write_config(tmp_path, config)
    snakemake(tmp_path)
    states = {s for rows in grid(tmp_path, "config.yaml").values() for row in rows.values() for s in row.values()}
    assert states == {"SUCCESS"}
    for stage in ("train_backward", "train_teacher/0", "train_teacher/1", "train_student"):
        stage_dir = root / "de-yq" / "trial7" / stage
        attempt = json.loads((stage_dir / "_manifest.json").read_text())["attempts"][-1]
        assert attempt["checks"] == {"has_checkpoint": "SUCCESS"}, (stage, attempt)
        log = (stage_dir / attempt["log"]).read_text()
        assert "epoch" in log   # the step's own output, then the check's lines after it
        assert log.index("waypost: check has_checkpoint: ls ") < log.index("waypost: check has_checkpoint: SUCCESS")
    again = snakemake(tmp_path)
    assert "Nothing to be done" in again.stdout + again.stderr
