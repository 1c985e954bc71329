"""A second bucket client, for tests only: ``mem://bucket/key`` served by an
in-process fsspec memory filesystem. It is what a new service is to waypost
(``waypost.stores.bucketclient.BucketClient``): this module and one line in
``bucketclient.CLIENTS``. fsspec's memory filesystem lists no user metadata,
generation or crc32c, so ``ObjectMemoryFS`` keeps them itself, as an
object store does (an object is whole or absent, a copy keeps its metadata).
"""

from __future__ import annotations

import io
import itertools
from typing import ClassVar

from fsspec.implementations.memory import MemoryFileSystem

from waypost.model import manifest
from waypost.stores.base import StorageError

SCHEME = "mem://"
_generations = itertools.count(1)


class ObjectMemoryFS(MemoryFileSystem):
    """Objects named ``bucket/key`` (no leading slash, as a bucket's client
    names them), each with its user metadata and generation."""

    protocol = "waypost-mem"
    root_marker = ""
    store: ClassVar[dict] = {}
    pseudo_dirs: ClassVar[list] = [""]
    written: ClassVar[dict[str, dict]] = {}   # object name → {"metadata": ..., "generation": ...}

    @classmethod
    def _strip_protocol(cls, path):
        return str(path).removeprefix(SCHEME).removeprefix(cls.protocol + "://").strip("/")

    def _open(self, path, mode="rb", **kwargs):
        opened = super()._open(path, mode, **kwargs)
        if "w" in mode or "x" in mode:
            self.written[self._strip_protocol(path)] = {"metadata": dict(kwargs.get("metadata") or {}),
                                                        "generation": next(_generations)}
        return opened

    def pipe_file(self, path, value, mode="overwrite", metadata=None, **kwargs):
        self.open(path, "xb" if mode == "create" else "wb", data=value, metadata=metadata)

    def cp_file(self, path1, path2, **kwargs):
        super().cp_file(path1, path2, **kwargs)
        source = self.written.get(self._strip_protocol(path1), {})
        self.written[self._strip_protocol(path2)] = {"metadata": dict(source.get("metadata") or {}),
                                                     "generation": next(_generations)}

    def _shaped(self, info: dict) -> dict:
        """A file's info as an object store lists it."""
        if info.get("type") != "file":
            return info
        stored = self.store[info["name"]]
        kept = self.written.get(info["name"], {})
        return {**info, "mtime": stored.modified, "metadata": kept.get("metadata") or {},
                "generation": kept.get("generation"),
                "crc32c": manifest.digests_stream(io.BytesIO(stored.getvalue()))[1]}

    def info(self, path, **kwargs):
        return self._shaped(super().info(path, **kwargs))

    def ls(self, path, detail=True, **kwargs):
        found = super().ls(path, detail=detail, **kwargs)
        return [self._shaped(info) for info in found] if detail else found

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        found = super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        return {name: self._shaped(info) for name, info in found.items()} if detail else found


def filesystem(url: str):
    return ObjectMemoryFS(), url[len(SCHEME):].rstrip("/")


def explain(exc: BaseException, url: str) -> StorageError:
    if isinstance(exc, FileNotFoundError):
        return StorageError(f"{url}: not found (no such bucket?)")
    return StorageError(f"{url}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def check_bucket(root: str) -> None:
    fs, path = filesystem(root)
    bucket = path.split("/")[0]
    if not fs.exists(bucket):
        raise StorageError(f"{root}: bucket {bucket!r} does not exist")


def probe(url: str) -> None:
    """In process: always reached."""


def quiet_logging() -> None:
    """It logs nothing."""


def reset() -> None:
    ObjectMemoryFS.store.clear()
    ObjectMemoryFS.pseudo_dirs[:] = [""]
    ObjectMemoryFS.written.clear()
