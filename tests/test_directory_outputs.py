"""A ``directory()`` output is a stage's output like a file, on every kind of
root (disk, a gs:// bucket, a mounted bucket): every file in it is in the
manifest (path, size, sha256, crc32c); presence, verify (and its repair),
adopt and reuse handle it; reuse leaves the source's files as they were."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import test_stores
import yaml
from conftest import LOCAL_PROFILE, gcs_flags, gcs_fs, gcs_key, planned

SNAKEFILE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule slice_tiles:
    output: tiles=directory(wp.out("tiles"))
    params: n=lambda w: config["stages"]["slice_tiles"]["tiles"]
    shell: "mkdir -p {output.tiles}/edge && for i in $(seq {params.n}); do echo tile-$i > {output.tiles}/t$i.dat; done && echo e > {output.tiles}/edge/border.dat"

rule mosaic:
    input: tiles=wp.stage("slice_tiles", "tiles")
    output: m=wp.out("mosaic.txt")
    shell: "cat {input.tiles}/*.dat {input.tiles}/edge/*.dat | sort > {output.m}"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


class Disk(test_stores.Disk):
    """A root on disk (or a mount) as the tests see it, and its Snakemake flags."""
    flags: tuple = ()

    def names(self, rel: str) -> set[str]:
        base = Path(self.root, rel)
        return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()}


class Bucket(test_stores.Bucket):
    def __init__(self, url: str):
        super().__init__(url)
        self.flags = gcs_flags(url)

    def names(self, rel: str) -> set[str]:
        base = f"{gcs_key(self.root)}/{rel}"
        gcs_fs().invalidate_cache()
        return {name[len(base) + 1:] for name in gcs_fs().find(base)}


@pytest.fixture(params=["disk", "bucket", "mount"])
def root(request, tmp_path):
    if request.param == "disk":
        return Disk(tmp_path / "results")
    if request.param == "bucket":
        return Bucket(request.getfixturevalue("bucket") + "/results")
    _, path = request.getfixturevalue("mount_root")
    return Disk(path / "results")


def run(work: Path, root, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                           str(LOCAL_PROFILE), *root.flags, *args], cwd=work, capture_output=True, text=True,
                          timeout=600)
    assert not check or proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def waypost(work: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "waypost.cli", args[0], "--config", "config/config.yaml", "--workflow", "workflow",
           *args[1:]]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)


def configure(work: Path, root, experiments: dict) -> None:
    (work / "config").mkdir(exist_ok=True)
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(
        {"root": root.root, "stages": {"slice_tiles": {"tiles": 3}}, "experiments": experiments}))


def manifest_of(root, stage_dir: str) -> dict:
    return json.loads(root.read(f"{stage_dir}/_manifest.json"))


def test_a_directory_output_is_recorded_verified_adopted_and_reused(root, tmp_path):
    work = tmp_path / "work"
    (work / "workflow").mkdir(parents=True)
    (work / "workflow" / "Snakefile").write_text(SNAKEFILE)
    configure(work, root, {"north": {}})
    run(work, root)
    tiles = "_all/north/slice_tiles"
    made = manifest_of(root, tiles)
    assert sorted(o["path"] for o in made["outputs"]) == ["tiles/edge/border.dat", "tiles/t1.dat", "tiles/t2.dat",
                                                         "tiles/t3.dat"]
    assert all(o["sha256"] and o["crc32c"] and o["size"] == len(root.read(f"{tiles}/{o['path']}"))
               for o in made["outputs"])
    assert root.read("_all/north/mosaic/mosaic.txt").decode().split() == ["e", "tile-1", "tile-2", "tile-3"]
    assert planned(work, *root.flags, snakefile=work / "workflow" / "Snakefile", configfile="config/config.yaml") == {}

    # A file of the directory changed (same size): verify finds it, --repair
    # sets the stage aside, the next run redoes it alone (presence mode).
    root.write(f"{tiles}/tiles/t2.dat", b"tile-X\n")
    found = waypost(work, "verify")
    assert found.returncode == 1 and "tiles/t2.dat does not match its checksum" in found.stdout, found.stdout
    assert waypost(work, "verify", "--repair").returncode == 1
    assert planned(work, *root.flags, snakefile=work / "workflow" / "Snakefile",
                   configfile="config/config.yaml") == {"slice_tiles": 1}
    run(work, root)
    assert root.read(f"{tiles}/tiles/t2.dat") == b"tile-2\n"
    assert root.read(f"{tiles}/.attempts/1/tiles/t2.dat") == b"tile-X\n"   # archived, not deleted
    assert waypost(work, "verify").returncode == 0

    # A directory dropped in by hand is adopted, every file of it recorded.
    configure(work, root, {"north": {}, "south": {}})
    for name in ("a.dat", "edge/b.dat"):
        root.write(f"_all/south/slice_tiles/tiles/{name}", name.encode())
    adopted = waypost(work, "adopt", "slice_tiles", "--experiment", "south")
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    record = manifest_of(root, "_all/south/slice_tiles")
    assert record["adopted"] and sorted(o["path"] for o in record["outputs"]) == ["tiles/a.dat", "tiles/edge/b.dat"]
    assert waypost(work, "verify").returncode == 0

    # Reused into another experiment: the same files, checked, and the source unchanged.
    before = {n: root.read(f"{tiles}/{n}") for n in root.names(tiles) if not n.startswith((".", "_logs"))}
    configure(work, root, {"north": {}, "south": {}, "east": {"reuse": {"slice_tiles": "north"}}})
    run(work, root)
    copy = manifest_of(root, "_all/east/slice_tiles")
    assert copy["reused_from"].endswith("/_all/north/slice_tiles")
    assert sorted((o["path"], o["sha256"]) for o in copy["outputs"]) == \
        sorted((o["path"], o["sha256"]) for o in manifest_of(root, tiles)["outputs"])
    assert root.read("_all/east/mosaic/mosaic.txt") == root.read("_all/north/mosaic/mosaic.txt")
    assert {n: root.read(f"{tiles}/{n}") for n in before} == before


def test_a_directory_input_is_pulled_whole_and_again_only_when_the_bucket_changed(bucket, tmp_path):
    """The step runner's local copy of a directory() input in a bucket: every
    object below it; left as it is (jobs side by side may be reading it)
    while the bucket's objects are the same ones; replaced whole, with no
    file of the old copy left, once one changed (even to the same size)."""
    from waypost.stores.mirror import BucketWorkspace, local_of
    mirror = tmp_path / "mirror"
    stage = f"{bucket}/p/e/reader"
    work = BucketWorkspace(stage, local_of(str(mirror), stage))
    tiles = f"{gcs_key(bucket)}/p/e/slicer/tiles"
    for name, data in (("a.dat", b"aa"), ("edge/b.dat", b"bb"), ("gone.dat", b"x")):
        gcs_fs().pipe_file(f"{tiles}/{name}", data)
    local = Path(local_of(str(mirror), f"{bucket}/p/e/slicer/tiles"))
    work.pull([str(local)])
    assert {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*") if p.is_file()} == \
        {"a.dat": b"aa", "edge/b.dat": b"bb", "gone.dat": b"x"}
    inode = local.stat().st_ino
    work.pull([str(local)])
    assert local.stat().st_ino == inode   # the same objects: the copy left alone
    gcs_fs().pipe_file(f"{tiles}/a.dat", b"AA")
    gcs_fs().rm_file(f"{tiles}/gone.dat")
    work.pull([str(local)])
    assert {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*") if p.is_file()} == \
        {"a.dat": b"AA", "edge/b.dat": b"bb"}
