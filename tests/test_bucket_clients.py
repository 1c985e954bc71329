"""A second bucket scheme is one client module and one registry line: the
test client ``bucket_in_memory`` (``mem://``, an in-process fsspec memory
filesystem) and ``bucketclient.CLIENTS["mem"]``, nothing else. The store
contract (tests/store_contract.py) runs against it, and the package's
functions (``store_for``, ``manifest_at``, the planning's listing, ...)
serve it as they serve ``gs://``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import bucket_in_memory
import pytest
from store_contract import STAGE, StoreContract

from waypost import stores
from waypost.model import layout, manifest
from waypost.stores import bucketclient


@pytest.fixture
def mem_bucket(monkeypatch):
    """``mem://bucket``, served once the registry names the client."""
    monkeypatch.setitem(bucketclient.CLIENTS, "mem", lambda: bucket_in_memory)
    bucket_in_memory.reset()
    bucket_in_memory.ObjectMemoryFS().mkdir("bucket")
    yield "mem://bucket"
    bucket_in_memory.reset()


class InMemory:
    """Objects written and read straight through the client's filesystem."""

    def __init__(self, url: str):
        self.root = url
        self.fs, self.key = bucket_in_memory.filesystem(url)

    def write(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.key}/{rel}", data)

    def read(self, rel: str) -> bytes:
        return self.fs.cat_file(f"{self.key}/{rel}")

    def exists(self, rel: str) -> bool:
        return self.fs.exists(f"{self.key}/{rel}")

    def open(self):
        return stores.store_for(self.root)


class TestInMemoryBucketStore(StoreContract):
    @pytest.fixture
    def backend(self, mem_bucket):
        return InMemory(f"{mem_bucket}/results")


def test_a_second_scheme_is_a_client_module_and_a_registry_line(mem_bucket):
    root = f"{mem_bucket}/results"
    backend = InMemory(root)
    stage = layout.join(root, *STAGE.split("/"))
    record = manifest.dumps({"state": "SUCCESS", "attempts": []}).encode()
    backend.write(f"{STAGE}/{layout.MANIFEST}", record)
    backend.write(f"{STAGE}/out/part-1.txt", b"1")

    store = stores.store_for(root)
    assert isinstance(store.fs, bucket_in_memory.ObjectMemoryFS) and store.snapshot and store.server_side_copy
    assert store.manifest_dirs() == [stage]
    assert stores.manifest_at(stage)["state"] == "SUCCESS" and stores.manifest_at(f"{root}/none/e/s") is None
    stores.reach(root)
    assert stores.listed_at_once(root) and stores.needs_mirror(root) and "mem" in stores.bucket_schemes()

    # the planning's one listing of the root, and a store over it
    stores.register_root(root)
    assert stores.root_of(f"{stage}/{layout.MANIFEST}") == root
    assert stores.listed(f"{stage}/{layout.MANIFEST}") and not stores.listed(f"{stage}/nothing")
    assert {f"bucket/results/{STAGE}", f"bucket/results/{STAGE}/out"} <= set(stores.directories(root))
    assert stores.over(stage).manifest(stage)["state"] == "SUCCESS"

    with pytest.raises(stores.StorageError, match=r"^mem://nobucket/x: bucket 'nobucket' does not exist$"):
        stores.store_for("mem://nobucket/x")


def test_a_scheme_without_a_client_is_one_clear_line():
    for ask in (stores.store_for, stores.manifest_at, stores.reach):
        with pytest.raises(stores.StorageError, match=r"^mem://bucket/x: waypost serves no mem:// locations "
                                                      r"\(a path, or gs://\)$"):
            ask("mem://bucket/x")


def test_choosing_a_bucket_backend_imports_no_client_library():
    """The registry and the seam name clients by loaders: a backend chosen,
    the schemes asked for, a client library's logging quieted, and still no
    gcsfs (nor even the gcs module but for the quieting)."""
    probe = ("import sys\nfrom waypost import stores\n"
             "stores.backend_of('gs://b/x'); stores.bucket_schemes()\n"
             "assert 'waypost.stores.gcs' not in sys.modules\n"
             "stores.quiet_client_logging()\n"
             "assert 'gcsfs' not in sys.modules, 'gcsfs'\n")
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_a_steps_local_copy_of_a_second_scheme_keeps_its_scheme(mem_bucket, tmp_path):
    """The step's workspace (``mirror``) over ``mem://``: its inputs come
    down, its files go up (the manifest last, as an object with metadata),
    and its URLs keep the root's scheme."""
    from waypost.stores.mirror import BucketWorkspace, local_of

    root = f"{mem_bucket}/results"
    backend = InMemory(root)
    backend.write("en-de/exp1/prep/data.txt", b"input")
    stage = f"{root}/{STAGE}"
    mirror = tmp_path / "mirror"
    work = BucketWorkspace(stage, local_of(str(mirror), stage))
    source = local_of(str(mirror), f"{root}/en-de/exp1/prep/data.txt")
    assert source == str(mirror / "bucket/results/en-de/exp1/prep/data.txt")
    work.pull([source])
    assert Path(source).read_bytes() == b"input" and work.url_of(source) == f"{root}/en-de/exp1/prep/data.txt"
    Path(work.local, "model.bin").write_bytes(b"weights")
    Path(work.local, layout.MANIFEST).write_bytes(manifest.dumps({"state": "SUCCESS", "attempts": [], "inputs": []}).encode())
    work.push([f"{work.local}/model.bin"], final=True)
    assert backend.read(f"{STAGE}/model.bin") == b"weights"
    assert stores.manifest_at(stage)["state"] == "SUCCESS"
