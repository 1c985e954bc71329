"""Which mounts waypost serves through a bucket's API (issue 38, points 1
and 2), on real rclone FUSE mounts:

- a mount of a remote that is no GCS bucket (``hasher`` or ``crypt`` over a
  local disk), whose /proc/mounts source ``remote:name`` looks like an
  rclone GCS mount's, with a bucket of that very name in the emulator: a
  pipeline on it works through the mount and never touches the bucket;
- a GCS mount (rclone, its own endpoint in its own config) whose bucket API
  this process can't reach (STORAGE_EMULATOR_HOST at a closed port): the run
  goes on through the mount; with the mount declared in the config
  (``mounts:``), one clear error line.

Either way the user gets one line saying how waypost serves the mount."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SMALL_CONFIG, _mount_or_skip, gcs_fs, planned, snakemake, waypost, write_config

# A pipeline small enough for a mount (one pair, a few stages).
UNTIL = os.environ.get("T_UNTIL", "train_vocab")
STAGES = ("fetch_corpus", "clean_corpus", "train_vocab")


def small_config(root: Path, **more) -> dict:
    config = {**copy.deepcopy(SMALL_CONFIG), "root": str(root), **more}
    config["experiments"] = {"trial": {"pairs": ["en-xa"], "teachers": 2}}
    return config


def mount_lines(text: str, point: Path) -> list[str]:
    """The lines that tell how waypost serves the mount at ``point``."""
    return [line for line in text.splitlines() if line.startswith("waypost:") and f"mount ({point})" in line]


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "aiohttp" not in text, text[-3000:]


# --- a mount of a remote that is not a bucket ----------------------------------

REMOTES = {
    # a hasher over a local directory: checksums kept aside, files as they are
    "hasher": "type = hasher\nremote = {disk}\n",
    # an encrypted remote over a local directory (names encrypted too)
    "crypt": "type = crypt\nremote = {disk}\npassword = {password}\n",
}


@pytest.fixture(params=sorted(REMOTES))
def disk_mount(request, gcs_emulator, tmp_path_factory):
    """A remote of another type than GCS, over a local directory, mounted
    with rclone as ``<remote>:<name>``, and a bucket called ``<name>`` in the
    emulator: yields (the bucket's name, the mount point)."""
    _mount_or_skip()
    import fake_gcs
    work = tmp_path_factory.mktemp(f"disk-{request.param}")
    name = f"shelf-{request.param}-{os.getpid()}"
    (work / "disk" / name).mkdir(parents=True)
    password = subprocess.run(["rclone", "obscure", "not-a-secret"], capture_output=True, text=True,
                              check=True).stdout.strip()
    config = work / "rclone.conf"
    config.write_text("[larder]\n" + REMOTES[request.param].format(disk=work / "disk", password=password))
    gcs_fs().mkdir(name)
    with fake_gcs.rclone_mounted(config, f"larder:{name}", work / "mnt", work, "--vfs-cache-mode", "off",
                                 "--dir-cache-time", "1s") as point:
        yield name, point
    gcs_fs().rm(name, recursive=True)


def test_a_mount_of_another_remote_type_works_through_the_mount(disk_mount, tmp_path):
    """The bucket of the mount's name holds the first stage of an earlier
    run of the same pipeline at the same place (``runs/...``), as a team's
    bucket might."""
    name, point = disk_mount
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    write_config(earlier, small_config(earlier / "runs"))
    snakemake(earlier, "--until", STAGES[0])
    gcs_fs().put(str(earlier / "runs"), f"{name}/", recursive=True)
    theirs = {o: i["generation"] for o, i in gcs_fs().find(name, detail=True).items()}
    assert any(o.endswith(f"/{STAGES[0]}/_manifest.json") for o in theirs)
    root = point / "runs"
    write_config(tmp_path, small_config(root))
    run = snakemake(tmp_path, "--until", UNTIL)
    said = run.stdout + run.stderr
    assert "archived" not in said and "attempt 2" not in said, said[-3000:]
    for stage in STAGES:
        stage_dir = root / "en-xa" / "trial" / stage
        record = json.loads((stage_dir / "_manifest.json").read_text())
        assert record["state"] == "SUCCESS" and len(record["attempts"]) == 1, record
        assert not (stage_dir / ".attempts").exists()
    # The bucket of that name was neither written nor read as the root.
    assert {o: i["generation"] for o, i in gcs_fs().find(name, detail=True).items()} == theirs
    assert planned(tmp_path, "--until", UNTIL) == {}
    lines = mount_lines(said, point)
    assert len(lines) == 1 and "through the mount" in lines[0], said[-3000:]

    status = waypost(tmp_path, "status", "--json")
    cells = json.loads(status.stdout)["experiments"]["trial"]["en-xa"]
    assert {stage: cells[stage]["state"] for stage in STAGES} == dict.fromkeys(STAGES, "SUCCESS")
    assert len(mount_lines(status.stderr, point)) == 1
    rerun = waypost(tmp_path, "rerun", "train_vocab", "--experiment", "trial")
    assert "will be redone" in rerun.stdout, rerun.stdout + rerun.stderr
    assert (root / "en-xa" / "trial" / "train_vocab" / ".attempts" / "1" / "_manifest.json").exists()
    assert len(mount_lines(rerun.stderr, point)) == 1


# --- a GCS mount whose bucket API this process can't reach ------------------------

def closed_port() -> str:
    import fake_gcs
    return f"http://127.0.0.1:{fake_gcs.free_port()}"


def test_a_gcs_mount_whose_api_is_unreachable_works_through_the_mount(mount_root, tmp_path):
    _, root = mount_root
    away = {"STORAGE_EMULATOR_HOST": closed_port()}
    write_config(tmp_path, small_config(root / "results"))
    run = snakemake(tmp_path, "--until", UNTIL, env=away)
    said = run.stdout + run.stderr
    no_traceback(said)
    point = root.parent
    lines = mount_lines(said, point)
    assert len(lines) == 1, said[-3000:]
    assert "can't reach" in lines[0] and "through the mount" in lines[0] and "mounts:" in lines[0], lines
    for stage in STAGES:
        record = json.loads((root / "results" / "en-xa" / "trial" / stage / "_manifest.json").read_text())
        assert record["state"] == "SUCCESS" and len(record["attempts"]) == 1, record
    status = subprocess.run([sys.executable, "-m", "waypost.cli", "status", "--json", "--config",
                             str(tmp_path / "config.yaml"), "--workflow", str(REPO / "workflow")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env={**os.environ, **away})
    assert status.returncode == 0, status.stderr
    cells = json.loads(status.stdout)["experiments"]["trial"]["en-xa"]
    assert {stage: cells[stage]["state"] for stage in STAGES} == dict.fromkeys(STAGES, "SUCCESS")
    assert len(mount_lines(status.stderr, point)) == 1
    # With the API reachable again, the same records, read through it.
    assert json.loads(waypost(tmp_path, "status", "--json").stdout)["experiments"]["trial"]["en-xa"] == cells


def test_a_declared_gcs_mount_whose_api_is_unreachable_is_one_error_line(mount_root, tmp_path):
    url, root = mount_root
    point = root.parent
    away = {"STORAGE_EMULATOR_HOST": closed_port()}
    write_config(tmp_path, small_config(root / "results", mounts={str(point): url.rsplit("/", 1)[0]}))
    run = snakemake(tmp_path, "--until", UNTIL, env=away, check=False)
    said = run.stdout + run.stderr
    assert run.returncode != 0
    no_traceback(said)
    assert not (root / "results" / "en-xa").exists()
    status = subprocess.run([sys.executable, "-m", "waypost.cli", "status", "--config", str(tmp_path / "config.yaml"),
                             "--workflow", str(REPO / "workflow")], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env={**os.environ, **away})
    assert status.returncode == 1
    no_traceback(status.stderr)
    assert status.stderr.count("\n") == 1 and "can't reach" in status.stderr and str(point) in status.stderr, \
        status.stderr


# --- remotes defined in rclone's environment -----------------------------------

@pytest.mark.parametrize("kind", ["gcs", "local"])
def test_a_remote_defined_in_rclones_environment_is_known_by_its_type(kind, gcs_emulator, tmp_path):
    """``RCLONE_CONFIG_<REMOTE>_TYPE`` in the environment of the rclone
    process (no config file names the remote): a GCS one is served through
    the bucket's API, a local one through the mount."""
    _mount_or_skip()
    import fake_gcs

    from waypost.stores import mounted, store_for
    from waypost.stores.mounted import MountedStore, PlainMountStore
    name = f"envtype-{kind}-{os.getpid()}"
    gcs_fs().mkdir(name)
    env = {"RCLONE_CONFIG_BENCH_TYPE": kind}
    if kind == "gcs":
        env.update(RCLONE_CONFIG_BENCH_ANONYMOUS="true", RCLONE_CONFIG_BENCH_ENDPOINT=f"{gcs_emulator}/storage/v1/",
                   RCLONE_CONFIG_BENCH_BUCKET_POLICY_ONLY="true")
    else:
        (tmp_path / name).mkdir()
    empty = tmp_path / "rclone.conf"
    empty.write_text("")
    source = f"bench:{name}"   # a local remote's path relative to rclone's working directory: a bucket's look
    try:
        with fake_gcs.rclone_mounted(empty, source, tmp_path / "mnt", tmp_path / "work", "--dir-cache-time", "1s",
                                     env=env, cwd=tmp_path) as point:
            store = store_for(str(point / "results"), quiet=True)
            assert isinstance(store, MountedStore if kind == "gcs" else PlainMountStore), mounted.way_of(
                mounted.mount_of(str(point)))
            if kind == "gcs":
                assert store.bucket_url == f"gs://{name}/results"
    finally:
        gcs_fs().rm(name, recursive=True)
