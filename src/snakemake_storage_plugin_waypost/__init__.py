"""waypost's Snakemake storage plugin: stage files on a ``gs://`` root, through gcsfs.

Selected with ``default-storage-provider: waypost`` and
``default-storage-prefix: <the root>`` (docs/buckets.md).
Snakemake then looks for stage files in the bucket (existence, mtimes) and
hands jobs their gs:// URLs; it neither fetches inputs nor stores outputs.
The step runner does (``waypost.stores.mirror``): it fetches the inputs, runs
the step on local copies, and stores the outputs, then the manifest last.

Why not snakemake-storage-plugin-gcs (1.1.4), measured against
fake-gcs-server: Snakemake uploads a job's outputs after the job, so the
manifest could only come last if every output were uploaded twice (a step's
own upload is followed by Snakemake's); reusing a stage from another
experiment would be a download and an upload; its mtimes are upload times,
so the ``_unfinished`` marker can't be dated after the placeholders
Snakemake uploads later; it creates a missing bucket instead of failing; and
it plans a 2-job workflow with 57 requests. Here one listing of the root
answers a whole planning, and an object's ``waypost-mtime`` metadata stands
for its mtime.
"""

from __future__ import annotations

from collections.abc import Iterable

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

from waypost import stores


class StorageProvider(StorageProviderBase):
    def __post_init__(self):
        pass

    @classmethod
    def example_queries(cls) -> list[ExampleQuery]:
        return [ExampleQuery(query="gs://my-bucket/results/en-de/exp1/train_student/model.json",
                             type=QueryType.ANY, description="a stage file under a gs:// root")]

    @classmethod
    def is_valid_query(cls, query: str) -> StorageQueryValidationResult:
        scheme = stores.scheme_of(query)
        valid = scheme in stores.bucket_schemes() and len(query) > len(scheme + "://")
        served = " or ".join(f"{s}://bucket/path" for s in stores.bucket_schemes())
        return StorageQueryValidationResult(query=query, valid=valid, reason=None if valid else f"expected {served}")

    def use_rate_limiter(self) -> bool:
        return False

    def default_max_requests_per_second(self) -> float:
        return 100.0

    def rate_limiter_key(self, query: str, operation):
        return None


class StorageObject(StorageObjectRead, StorageObjectWrite, StorageObjectGlob):
    def __post_init__(self):
        # Snakemake neither fetches inputs nor stores outputs (jobs get gs://
        # URLs): the step runner does, so that the manifest is stored last and
        # a reuse between gs:// locations is a server-side copy.
        self.retrieve = False
        self.fs, self.path = stores.filesystem(self.query)

    def local_suffix(self) -> str:
        return self.path  # bucket/key

    def cleanup(self):
        pass

    def get_inventory_parent(self) -> str | None:
        root = stores.root_of(self.query)
        return self.cache_key(stores.filesystem(root)[1]) if root else None

    async def inventory(self, cache: IOCacheStorageInterface):
        """Fill Snakemake's cache from the one listing of the root this file is
        under: what is listed exists, with its mtime and size; what is not
        does not (the parent key marks the root as inventoried)."""
        root = stores.root_of(self.query)
        if root is None:
            return
        for name, info in stores.listing(root).items():
            key = self.cache_key(name)
            cache.exists_in_storage[key] = True
            cache.mtime[key] = Mtime(storage=stores.mtime_of(info))
            cache.size[key] = info["size"]
        for folder, newest in stores.directories(root).items():   # a directory() output: a prefix of objects
            key = self.cache_key(folder)
            cache.exists_in_storage[key] = True
            cache.mtime[key] = Mtime(storage=newest)
            cache.size[key] = 0
        cache.exists_in_storage.has_inventory.add(self.get_inventory_parent())

    def exists(self) -> bool:
        # Asked after a job (the planning's listing answers before): the job
        # wrote in another process, so this one's cached listings are old.
        self.fs.invalidate_cache(self.path)
        return self.fs.exists(self.path)

    def mtime(self) -> float:
        """An object's; a directory()'s (a prefix): its newest object's."""
        info = self.fs.info(self.path)
        if info.get("type") == "directory":
            return max((stores.mtime_of(i) for i in self.fs.find(self.path, detail=True).values()), default=0.0)
        return stores.mtime_of(info)

    def size(self) -> int:
        return self.fs.info(self.path)["size"]

    def retrieve_object(self):
        self.fs.get_file(self.path, str(self.local_path()))

    def store_object(self):
        self.fs.put_file(str(self.local_path()), self.path)

    def remove(self):
        self.fs.rm_file(self.path)

    def list_candidate_matches(self) -> Iterable[str]:
        prefix = stores.filesystem(get_constant_prefix(self.query, strip_incomplete_parts=True))[1]
        bucket = prefix.split("/", 1)[0]   # names with "..", empty parts, ... never become wildcards
        scheme = stores.scheme_of(self.query) + "://"
        return [scheme + name for name in stores.plain_names(bucket, self.fs.find(prefix))]


class RetrievedStorageObject(StorageObject):
    """A file of a rule that runs as plain Snakemake runs it, with no
    waypost record (``waypost.planning.wiring.bucket.as_plain_on_the_bucket``):
    Snakemake fetches it before the job and stores it after, as it does
    with any storage plugin, and the job sees its local copy."""

    def __post_init__(self):
        super().__post_init__()
        self.retrieve = True
