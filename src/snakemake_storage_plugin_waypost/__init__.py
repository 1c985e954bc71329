"""waypost's Snakemake storage plugin: stage files on a ``gs://`` root, through gcsfs.

Selected with ``default-storage-provider: waypost`` and
``default-storage-prefix: <the root>`` (README: "Running with a bucket").
Snakemake then sees stage outputs in the bucket (existence, mtimes), fetches
a job's inputs into ``.snakemake/storage/waypost/<bucket>/...`` before it
runs and stores its outputs afterwards. The step runner owns the rest of the
stage directory's I/O (workspace, logs, archives, the manifest last; see
``waypost.remote_stage``).

Why not snakemake-storage-plugin-gcs (1.1.4), measured against
fake-gcs-server: it uploads every output again after the job even when the
step runner already stored it (so the manifest can't be the last object
written without uploading every model twice); its mtimes are the objects'
upload times, so the ``_unfinished`` marker can't be dated after the
placeholders Snakemake uploads later (the next run would not redo a failed
stage); it creates a missing bucket instead of failing; it asks for a
project even on the emulator, and plans a 2-job workflow with 57 requests.
Here: one listing of the root answers a whole planning, an output already
stored identically is not uploaded again, an object's ``waypost-mtime``
metadata stands for its mtime, and a missing bucket is an error.
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Iterable, List, Optional

from snakemake_interface_storage_plugins.io import IOCacheStorageInterface, Mtime, get_constant_prefix
from snakemake_interface_storage_plugins.storage_object import (
    StorageObjectGlob,
    StorageObjectRead,
    StorageObjectWrite,
)
from snakemake_interface_storage_plugins.storage_provider import (
    ExampleQuery,
    QueryType,
    StorageProviderBase,
    StorageQueryValidationResult,
)

from waypost import storage

MTIME_KEY = "waypost-mtime"


def mtime_of(info: dict) -> float:
    """An object's mtime: its ``waypost-mtime`` metadata, else when it was written."""
    stamp = (info.get("metadata") or {}).get(MTIME_KEY)
    return float(stamp) if stamp else info["mtime"].timestamp()


def _md5(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()


class StorageProvider(StorageProviderBase):
    def __post_init__(self):
        pass

    @classmethod
    def example_queries(cls) -> List[ExampleQuery]:
        return [ExampleQuery(query="gs://my-bucket/results/en-de/exp1/train_student/model.json",
                             type=QueryType.ANY, description="a stage file under a gs:// root")]

    @classmethod
    def is_valid_query(cls, query: str) -> StorageQueryValidationResult:
        valid = query.startswith(storage.GCS_PREFIX) and len(query) > len(storage.GCS_PREFIX)
        return StorageQueryValidationResult(query=query, valid=valid,
                                            reason=None if valid else "expected gs://bucket/path")

    def use_rate_limiter(self) -> bool:
        return False

    def default_max_requests_per_second(self) -> float:
        return 100.0

    def rate_limiter_key(self, query: str, operation):
        return None


class StorageObject(StorageObjectRead, StorageObjectWrite, StorageObjectGlob):
    def __post_init__(self):
        self.fs, self.path = storage.filesystem(self.query)

    def local_suffix(self) -> str:
        return self.path  # bucket/key

    def cleanup(self):
        pass

    def get_inventory_parent(self) -> Optional[str]:
        root = storage.root_of(self.query)
        return self.cache_key(storage.filesystem(root)[1]) if root else None

    async def inventory(self, cache: IOCacheStorageInterface):
        """Fill Snakemake's cache from the one listing of the root this file is
        under: what is listed exists, with its mtime and size; what is not
        does not (the parent key marks the root as inventoried)."""
        root = storage.root_of(self.query)
        if root is None:
            return
        for name, info in storage.listing(root).items():
            key = self.cache_key(name)
            cache.exists_in_storage[key] = True
            cache.mtime[key] = Mtime(storage=mtime_of(info))
            cache.size[key] = info["size"]
        cache.exists_in_storage.has_inventory.add(self.get_inventory_parent())

    def exists(self) -> bool:
        return self.fs.exists(self.path)

    def mtime(self) -> float:
        return mtime_of(self.fs.info(self.path))

    def size(self) -> int:
        return self.fs.info(self.path)["size"]

    def retrieve_object(self):
        self.fs.get_file(self.path, str(self.local_path()))

    def store_object(self):
        local = str(self.local_path())
        try:
            info = self.fs.info(self.path)
        except FileNotFoundError:
            info = None
        if info and info["size"] == os.path.getsize(local) and info.get("md5Hash") == _md5(local):
            return  # the step runner stored it already, before the stage's manifest
        self.fs.put_file(local, self.path)

    def remove(self):
        self.fs.rm_file(self.path)

    def list_candidate_matches(self) -> Iterable[str]:
        prefix = storage.filesystem(get_constant_prefix(self.query, strip_incomplete_parts=True))[1]
        return [storage.GCS_PREFIX + name for name in self.fs.find(prefix)]
