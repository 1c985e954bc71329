"""The store contract (tests/store_contract.py), run by every backend: local
disk, a gs:// bucket through its API, a bucket mounted with rclone whose
bucket waypost knows (found in /proc/mounts), and a mount it doesn't know
(plain copies through the mount)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import gcs_fs, gcs_key
from store_contract import StoreContract

from waypost import stores
from waypost.model import locations
from waypost.stores.mounted import MountedStore, PlainMountStore


class Disk:
    def __init__(self, root: Path):
        self.root = str(root)

    def write(self, rel: str, data: bytes) -> None:
        path = Path(self.root, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def read(self, rel: str) -> bytes:
        return Path(self.root, rel).read_bytes()

    def exists(self, rel: str) -> bool:
        return Path(self.root, rel).exists()

    def open(self):
        return stores.store_for(self.root)


class Bucket:
    """Files checked through the bucket's API (what every node sees)."""

    def __init__(self, url: str, root: str | None = None):
        self.url, self.root = url, root or url

    def write(self, rel: str, data: bytes) -> None:
        gcs_fs().pipe_file(f"{gcs_key(self.url)}/{rel}", data)

    def read(self, rel: str) -> bytes:
        return gcs_fs().cat_file(f"{gcs_key(self.url)}/{rel}")

    def exists(self, rel: str) -> bool:
        return gcs_fs().exists(f"{gcs_key(self.url)}/{rel}")

    def open(self):
        return stores.store_for(self.root)


class Mount(Disk):
    """Files written through the mount (as steps write them), checked in the
    bucket (rclone uploads a file whole at its close, as gcsfuse does)."""

    def __init__(self, url: str, root: Path, store=None):
        super().__init__(root)
        self.bucket, self.store = Bucket(url), store

    def read(self, rel: str) -> bytes:
        return self.bucket.read(rel)

    def exists(self, rel: str) -> bool:
        return self.bucket.exists(rel)

    def open(self):
        return self.store(self.root) if self.store else stores.store_for(self.root)


class TestLocalStore(StoreContract):
    @pytest.fixture
    def backend(self, tmp_path):
        return Disk(tmp_path / "results")


class TestBucketStore(StoreContract):
    @pytest.fixture
    def backend(self, bucket):
        return Bucket(f"{bucket}/results")


class TestMountedStore(StoreContract):
    @pytest.fixture
    def backend(self, mount_root):
        url, path = mount_root
        backend = Mount(url, path)
        assert isinstance(backend.open(), MountedStore) and backend.open().bucket_url == url
        return backend


class TestPlainMountStore(StoreContract):
    """A mount whose bucket waypost doesn't know: all through the mount."""

    @pytest.fixture
    def backend(self, mount_root):
        url, path = mount_root
        return Mount(url, path, store=PlainMountStore)


def test_the_mount_table_maps_rclone_and_gcsfuse_mounts_to_buckets(tmp_path, monkeypatch):
    from waypost.stores import mounted
    table = tmp_path / "mounts"
    table.write_text("fgcs:runs-bucket/team /mnt/rc fuse.rclone rw 0 0\n"
                     "data-bucket /mnt/gcs fuse.gcsfuse rw 0 0\n"
                     "host:/export /mnt/sshfs fuse.sshfs rw 0 0\n"
                     "sftp:/home/me /mnt/sftp fuse.rclone rw 0 0\n"
                     "/dev/sda1 / ext4 rw 0 0\n")
    monkeypatch.setattr(mounted, "_table", lambda: mounted.__dict__["_read_table"](str(table)))
    monkeypatch.setattr(locations, "_declared", {})
    assert mounted.mount_of("/mnt/rc/results") == mounted.Mount("/mnt/rc", "rclone", "gs://runs-bucket/team")
    assert mounted.mount_of("/mnt/gcs/a/b") == mounted.Mount("/mnt/gcs", "gcsfuse", "gs://data-bucket")
    assert mounted.mount_of("/mnt/sshfs/x").url is None and mounted.mount_of("/mnt/sftp/x").url is None
    assert mounted.mount_of(str(tmp_path)) is None
    locations.declare_mounts({"/mnt/sshfs": "gs://declared/prefix"})
    assert mounted.mount_of("/mnt/sshfs/x") == mounted.Mount("/mnt/sshfs", "declared", "gs://declared/prefix")
    # The table names a bucket for the rclone mount, but no rclone process
    # here serves /mnt/rc: its remote's type is unknown, so it is no bucket.
    monkeypatch.setattr(mounted, "_ways", {})
    way = mounted.way_of(mounted.mount_of("/mnt/rc/results"))
    assert way.url is None and "whose type waypost can't read" in way.said


def test_the_mount_table_is_read_once_until_a_mount_changes_it(tmp_path):
    """The table is read once per process and read again after a mount or
    unmount (the kernel's poll on /proc/self/mounts), and a fork reads its own."""
    import os
    import subprocess

    from waypost.stores import mounted
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the mount-table test mounts a tmpfs: it needs root in CI")
        pytest.skip("mounts a tmpfs: needs root")
    first = mounted._table()
    assert mounted._table() is first
    point = tmp_path / "mnt"
    point.mkdir()
    mounting = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], capture_output=True, text=True)
    if mounting.returncode:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: the mount-table test must mount a tmpfs: {mounting.stderr.strip()}")
        pytest.skip("can't mount a tmpfs here")
    try:
        mounted_now = mounted._table()
        assert str(point) in [p for _, p, _ in mounted_now] and mounted._table() is mounted_now
    finally:
        subprocess.run(["umount", str(point)], check=True)
    assert str(point) not in [p for _, p, _ in mounted._table()]
    kept = mounted._table()
    pid = os.fork()
    if pid == 0:   # (a fork shares the parent's open file: it reads the table itself)
        os._exit(0 if mounted._table() is not kept and mounted._cached[0] == os.getpid() else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert mounted._table() is kept


def test_an_rclone_source_names_its_remote_and_path():
    from waypost.stores.mounted import bucket_of_source
    from waypost.stores.rclone import split_source
    assert split_source("shelf:runs/a") == ("shelf", None, "runs/a")
    assert split_source("fgcs{x_ABl}:bucket") == ("fgcs", None, "bucket")
    assert split_source("fgcs,anonymous=true:bucket") == ("fgcs", None, "bucket")
    assert split_source(":gcs:bucket/p") == (None, "gcs", "bucket/p")
    assert split_source(":local{a1}:/srv/x") == (None, "local", "/srv/x")
    assert split_source("team-data") == (None, None, "")
    assert bucket_of_source("fuse.rclone", ":gcs:bucket/p") == "bucket/p"
    assert bucket_of_source("fuse.rclone", ":local:/srv/x") is None
    assert bucket_of_source("fuse.rclone", "team-data") is None


def test_a_directory_output_is_described_and_reused_file_by_file(tmp_path):
    """A ``directory()`` output: its files in the manifest, brought in through the store."""
    from waypost.model import manifest
    source = tmp_path / "results/p/e1/s"
    (source / "shards/a").mkdir(parents=True)
    (source / "shards/a/0.bin").write_bytes(b"0")
    (source / "shards/1.bin").write_bytes(b"1")
    outputs = manifest.describe_outputs(str(source), [str(source / "shards")])
    assert [o["path"] for o in outputs] == ["shards/1.bin", "shards/a/0.bin"]
    target = tmp_path / "results/p/e2/s"
    how, _ = stores.store_for(str(tmp_path / "results")).bring(stores.store_for(str(source)), str(source),
                                                                 str(target), outputs)
    assert how in ("copied", "reflinked") and (target / "shards/a/0.bin").read_bytes() == b"0"
    assert (source / "shards/a/0.bin").stat().st_nlink == 1


def test_a_snapshot_knows_a_directory_is_not_there_from_its_parents_listing(tmp_path, monkeypatch):
    """A planning asks about every stage directory, and those still to be
    done are not there: after one listing of their parent, they cost none."""
    root = tmp_path / "results"
    (root / "p/e/s/there").mkdir(parents=True)
    (root / "p/e/s/there/out.txt").write_text("x")
    (root / "p/e/s/afile").write_text("x")
    import os
    store = stores.store_for(str(root), snapshot=True)
    listed = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: listed.append(path) or scandir(path))
    assert store.entries(str(root / "p/e/s/there")) == ["out.txt"]
    assert store.exists(str(root / "p/e/s/there/out.txt"))
    first = len(listed)
    assert [store.entries(str(root / f"p/e/s/gone{i}")) for i in range(3)] == [[], [], []]
    assert store.entries(str(root / "q/e/s/i")) == [] and not store.exists(str(root / "q/e/s/i/out.txt"))
    assert store.entries(str(root / "p/e/s/afile")) == []   # a file, not a directory
    assert len(listed) == first
    # outside the root, or not spelled as it lists: listed as it is
    assert store.entries(str(tmp_path / "elsewhere")) == [] and len(listed) == first + 1
    assert store.entries(str(root / "p/e/s/./there")) == ["out.txt"]


def test_the_registry_picks_a_backend_by_the_roots_scheme(tmp_path):
    """A ``gs://`` URL is the bucket's backend, a path the path's, and a
    scheme none serves one clear line naming those served; the package
    dispatches there."""
    from waypost.stores import registry
    from waypost.stores.bucketroot import BucketRoot
    from waypost.stores.local import LocalStore
    from waypost.stores.pathroot import PathRoot

    assert registry.scheme_of("gs://bucket/run") == "gs"
    assert registry.scheme_of(str(tmp_path)) == registry.scheme_of("results/gs://x") == ""
    assert isinstance(registry.backend_of("gs://bucket/run"), BucketRoot)
    assert all(isinstance(registry.backend_of(loc), PathRoot) for loc in (str(tmp_path), "results"))
    with pytest.raises(stores.StorageError, match=r"^s3://b/x: waypost serves no s3:// locations \(a path, or gs://\)$"):
        stores.store_for("s3://b/x")
    assert type(stores.store_for(str(tmp_path))) is LocalStore
    assert stores.consistent(str(tmp_path)) == str(tmp_path) and not stores.on_a_bucket_mount(str(tmp_path))
    assert stores.listed_at_once("gs://bucket/run") and not stores.listed_at_once(str(tmp_path))


def test_the_package_names_its_backends_helpers_lazily():
    """What callers ask of a backend's module is the package's name for it
    (the same object); a name it doesn't have is an AttributeError."""
    from waypost.stores import gcs, mirror

    assert stores.StorageError is gcs.StorageError and stores.local_of is mirror.local_of
    assert "listing" in dir(stores)
    with pytest.raises(AttributeError):
        stores.no_such_helper  # noqa: B018
