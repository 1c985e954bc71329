"""Two nodes, one bucket, one of them with a stale view: node A's run
writes a stage through its mount while node B's mount still lists the
stage directory as it was (within its cache's time, as a gcsfuse node's
stat and type caches do for 60 s). B's run of the same stage must neither
start a second attempt beside A's nor record a SUCCESS that isn't A's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LOCAL_PROFILE, gcs_fs, gcs_key, write_config

SLOW = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule crawl:
    output: out=wp.out("page.txt")
    shell: "sleep 8; hostname > {output.out}"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


@pytest.fixture(scope="module")
def stale_node(gcs_emulator, mounted_bucket, tmp_path_factory):
    """The bucket mounted once more, its listings cached for 30 s: a
    node that sees what others write late."""
    import fake_gcs
    work = tmp_path_factory.mktemp("stale")
    with fake_gcs.mounted(gcs_emulator, gcs_key(mounted_bucket[0]), work / "mnt", work / "rclone",
                          dir_cache="30s") as point:
        yield point


def _listed(url: str, rel: str) -> bool:
    return gcs_fs().exists(f"{gcs_key(url)}/{rel}")


def _on_node(host: str, cmd: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    """``cmd`` on a host of its own name (a UTS namespace): its runner's
    pid means nothing to the other node, only its lease does."""
    return subprocess.Popen(["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *cmd],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def test_a_node_whose_mount_lists_an_old_stage_directory_starts_no_second_attempt(
        mount_root, stale_node, tmp_path):
    url, path = mount_root
    stage = Path("results") / "_all" / "e1" / "crawl"
    (path / stage).mkdir(parents=True)
    (path / stage / "notes.txt").write_text("from before\n")   # (a directory the bucket lists)
    deadline = time.time() + 10
    while not (stale_node / path.name / stage / "notes.txt").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert sorted(os.listdir(stale_node / path.name / stage)) == ["notes.txt"]   # B's listing, now cached

    runs = {}
    for node, root in (("node-a", path), ("node-b", stale_node / path.name)):
        work = tmp_path / node
        (work / "workflow").mkdir(parents=True)
        (work / "workflow" / "Snakefile").write_text(SLOW)
        write_config(work, {"root": str(root / "results"), "experiments": {"e1": {}}})
    cmd = [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile", str(LOCAL_PROFILE),
           "--configfile", "config.yaml"]
    runs["node-a"] = _on_node("node-a", cmd, tmp_path / "node-a")
    try:
        deadline = time.time() + 60
        while not _listed(url, f"{stage}/_running.json") and time.time() < deadline:
            time.sleep(0.1)
        assert _listed(url, f"{stage}/_running.json")
        assert "_running.json" not in os.listdir(stale_node / path.name / stage)   # B still lists the old state
        runs["node-b"] = _on_node("node-b", cmd, tmp_path / "node-b")
        said = {node: run.communicate(timeout=300)[0] for node, run in runs.items()}
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
    assert runs["node-a"].returncode == 0, said["node-a"]
    manifest = json.loads(gcs_fs().cat(f"{gcs_key(url)}/{stage}/_manifest.json"))
    assert manifest["state"] == "SUCCESS"
    assert len(manifest["attempts"]) == 1, manifest["attempts"]
    assert (path / stage / "page.txt").read_text() == "node-a\n"   # A's attempt's output, not B's
    assert "not starting a second one" in said["node-b"] or "waiting for it to end" in said["node-b"], said["node-b"]

    # A's attempt is over; B's mount may still list the directory without
    # its manifest: B's planner reads the bucket, and finds nothing to do.
    again = subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname node-b && exec "$@"', "sh", *cmd],
                           cwd=tmp_path / "node-b", capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]
    assert len(json.loads(gcs_fs().cat(f"{gcs_key(url)}/{stage}/_manifest.json"))["attempts"]) == 1
