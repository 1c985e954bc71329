"""Snakemake's own conformance tests for storage plugins
(``snakemake_interface_storage_plugins.tests.TestStorageBase``, 4.x) run
against waypost's storage plugin over fake-gcs-server: store, exists,
mtime, size, checksum, inventory, retrieve, remove; a missing object; the
query check."""

from __future__ import annotations

import os
import uuid

import pytest
from snakemake_interface_storage_plugins.tests import TestStorageBase

from snakemake_storage_plugin_waypost import StorageProvider


@pytest.fixture(autouse=True)
def _emulator(bucket):
    os.environ["WAYPOST_CONFORMANCE_BUCKET"] = bucket
    yield
    os.environ.pop("WAYPOST_CONFORMANCE_BUCKET", None)


class TestWaypostStoragePlugin(TestStorageBase):
    __test__ = True
    retrieve_only = False
    store_only = False
    delete = True
    files_only = True

    def get_storage_provider_cls(self):
        return StorageProvider

    def get_query(self, tmp_path) -> str:
        return f"{os.environ['WAYPOST_CONFORMANCE_BUCKET']}/results/p/e/s/{uuid.uuid4().hex}.txt"

    def get_query_not_existing(self, tmp_path) -> str:
        return f"{os.environ['WAYPOST_CONFORMANCE_BUCKET']}/results/p/e/s/missing-{uuid.uuid4().hex}.txt"
