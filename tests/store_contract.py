"""The contract every StageStore backend passes (fsspec's ``tests/abstract``
is the model): ``StoreContract`` is written once against the interface;
a backend's tests are one subclass giving the ``backend`` fixture
(tests/test_stores.py). A fourth backend is one class there, one here.

``backend`` gives an object with ``root`` (the root as users name it),
``write(rel, data)`` and ``read(rel)`` / ``exists(rel)`` (straight to where
the files really are: the disk, the bucket's API) and ``open()`` (a fresh
store over the root: a bucket store is a snapshot).
"""

from __future__ import annotations

import io
import json
import os
import time

import pytest

from waypost.model import layout, manifest, records
from waypost.state import lifecycle

STAGE = "en-de/exp1/train"
FILES = {"model.bin": b"weights" * 100, "sub/vocab.txt": b"a b c\n", "_logs/attempt-1.log": b"log\n"}


def record(state: str = "SUCCESS", outputs=()) -> dict:
    return records.manifest(experiment="exp1", pair="en-de", stage="train", instance=None, state=state,
                            created=manifest.now_iso(), attempts=[], outputs=list(outputs), inputs=[], settings={},
                            config_hash="", code_version="")


class StoreContract:
    @pytest.fixture
    def backend(self):
        raise NotImplementedError("a backend's test class gives its backend")

    def stage(self, backend, name: str = STAGE) -> str:
        return layout.join(backend.root, *name.split("/"))

    def populate(self, backend, files=FILES, stage: str = STAGE, state: str = "SUCCESS") -> list[dict]:
        for rel, data in files.items():
            backend.write(f"{stage}/{rel}", data)
        outputs = [{"path": rel, "size": len(data), "sha256": manifest.sha256_stream(io.BytesIO(data)),
                    "crc32c": manifest.digests_stream(io.BytesIO(data))[1]}
                   for rel, data in files.items() if not rel.startswith("_")]
        backend.write(f"{stage}/{layout.MANIFEST}", manifest.dumps(record(state, outputs)).encode())
        return outputs

    # --- listing -------------------------------------------------------------
    def test_lists_stage_dirs_entries_and_sizes(self, backend):
        self.populate(backend)
        self.populate(backend, {"b.txt": b"b"}, "en-fr/exp1/train")
        store = backend.open()
        stage = self.stage(backend)
        assert store.manifest_dirs() == sorted([stage, self.stage(backend, "en-fr/exp1/train")])
        assert store.entries(stage) == sorted(["_logs", layout.MANIFEST, "model.bin", "sub"])
        assert store.isdir(layout.join(stage, "sub")) and store.isfile(layout.join(stage, "model.bin"))
        assert not store.exists(layout.join(stage, "missing")) and store.size(layout.join(stage, "missing")) is None
        assert store.size(layout.join(stage, "model.bin")) == len(FILES["model.bin"])
        assert store.files(stage) == sorted([*FILES, layout.MANIFEST])
        assert store.file_sizes(stage)["sub/vocab.txt"] == len(FILES["sub/vocab.txt"])
        assert store.state_dirs(stage) == [(None, stage)]
        assert store.relative(stage) == STAGE and store.key(stage + "/") == store.key(stage)
        total, count, newest = store.usage(stage)
        assert count == len(FILES) + 1 and total >= sum(map(len, FILES.values())) and newest > time.time() - 600

    def test_instances_are_state_dirs(self, backend):
        for instance in ("0", "1"):
            self.populate(backend, {"m.bin": b"m"}, f"{STAGE}/{instance}")
        store = backend.open()
        stage = self.stage(backend)
        assert [i for i, _ in store.state_dirs(stage)] == ["0", "1"]

    # --- records -------------------------------------------------------------
    def test_manifest_round_trip_and_none(self, backend):
        self.populate(backend)
        store = backend.open()
        stage = self.stage(backend)
        assert store.manifest(stage)["state"] == "SUCCESS"
        assert store.manifest(self.stage(backend, "en-de/exp1/other")) is None
        store.write_manifest(stage, record("FAILED"))
        assert json.loads(backend.read(f"{STAGE}/{layout.MANIFEST}"))["state"] == "FAILED"
        assert backend.open().manifest(stage)["state"] == "FAILED"

    def test_an_unusable_manifest_is_one_clear_error(self, backend):
        backend.write(f"{STAGE}/{layout.MANIFEST}", b"{not json")
        with pytest.raises(manifest.ManifestError, match="unreadable manifest"):
            backend.open().manifest(self.stage(backend))

    def test_running_marker_lease_and_heartbeat(self, backend):
        mine = {"pid": os.getpid(), "host": manifest.hostname(), "slurm_job_id": None, "attempts": []}
        elsewhere = {"pid": 1, "host": "another-node", "slurm_job_id": None, "attempts": []}
        backend.write(f"{STAGE}/{layout.RUNNING}", json.dumps(mine).encode())
        backend.write(f"en-fr/exp1/train/{layout.RUNNING}", json.dumps(elsewhere).encode())
        store = backend.open()
        stage, other = self.stage(backend), self.stage(backend, "en-fr/exp1/train")
        assert store.marker_dirs(layout.RUNNING) == sorted([stage, other])
        text, _ = store.marker(stage)
        assert json.loads(text)["pid"] == os.getpid()
        assert lifecycle.read(store, stage).live.where == f"pid {os.getpid()} on {manifest.hostname()}"
        assert lifecycle.read(store, stage, me=os.getpid()).live is None
        live = lifecycle.read(store, other).live   # another node's: alive until its lease runs out
        assert live is not None and live.where.startswith("unknown: pid 1 on another-node")
        time.sleep(1.1)
        age = store.marker(other)[1]
        store.heartbeat(layout.join(other, layout.RUNNING))
        fresh = backend.open().marker(other)[1]
        assert fresh < age   # every reader sees the new heartbeat
        assert json.loads(backend.read(f"en-fr/exp1/train/{layout.RUNNING}")) == elsewhere

    def test_write_marker_and_remove(self, backend):
        self.populate(backend)
        store = backend.open()
        stage = self.stage(backend)
        store.write_marker(layout.join(stage, layout.UNFINISHED), "FAILED\n")
        assert backend.read(f"{STAGE}/{layout.UNFINISHED}") == b"FAILED\n"
        store.remove(layout.join(stage, layout.UNFINISHED))
        assert not backend.exists(f"{STAGE}/{layout.UNFINISHED}")
        store.remove_files(stage, ["sub/vocab.txt"])
        assert not backend.exists(f"{STAGE}/sub/vocab.txt") and backend.exists(f"{STAGE}/model.bin")
        store.remove_tree(stage)
        assert not backend.exists(f"{STAGE}/model.bin") and backend.open().manifest_dirs() == []

    def test_lists_every_manifest_for_the_catalog_with_stamps_that_change(self, backend):
        self.populate(backend)
        self.populate(backend, {"m.bin": b"m"}, "en-fr/exp2/score/0")
        self.populate(backend, {"deep.txt": b"d"}, f"{STAGE}/sub/deeper")   # below an instance: not a stage
        backend.open().archive(self.stage(backend), keep=("_logs",))
        self.populate(backend, {"model.bin": b"again"})
        stage, instance = self.stage(backend), self.stage(backend, "en-fr/exp2/score/0")
        archived = layout.join(stage, layout.ATTEMPTS, "1")
        listed = backend.open().listed_manifests()
        assert sorted(listed) == sorted([stage, archived, instance])
        read = {d: (stamp, manifest.parse(text, d)) for d, stamp, text in backend.open().read_manifests(sorted(listed), listed)}
        assert set(read) == set(listed) and read[instance][1]["state"] == "SUCCESS"
        assert all(stamp for stamp, _ in read.values())
        time.sleep(0.01)
        backend.open().write_manifest(instance, record("FAILED"))
        again = backend.open().listed_manifests()
        assert again[instance] != listed[instance] and again[stage] == listed[stage]

    def test_a_manifest_too_big_to_read_is_refused_in_the_listing(self, backend):
        from waypost.model import trust
        self.populate(backend)
        backend.write(f"en-fr/exp1/train/{layout.MANIFEST}", b" " * (trust.MAX_MANIFEST_BYTES + 1))
        refused: dict = {}
        listed = backend.open().listed_manifests(refused)
        big = self.stage(backend, "en-fr/exp1/train")
        assert self.stage(backend) in listed
        if big in refused:   # listed with sizes: never read
            assert big not in listed and "not read" in refused[big][1]
        else:                # read as it comes, and refused there
            [(_, _, text)] = backend.open().read_manifests([big])
            with pytest.raises(manifest.ManifestError):
                if isinstance(text, Exception):
                    raise text
                manifest.parse(text, big)

    # --- archives --------------------------------------------------------------
    def test_archive_moves_the_workspace_and_numbers_archives(self, backend):
        self.populate(backend)
        stage = self.stage(backend)
        assert backend.open().archive(stage, keep=("_logs",)) == ".attempts/1"
        assert backend.read(f"{STAGE}/.attempts/1/model.bin") == FILES["model.bin"]
        assert not backend.exists(f"{STAGE}/model.bin") and backend.exists(f"{STAGE}/_logs/attempt-1.log")
        assert not backend.exists(f"{STAGE}/.attempts/1/{layout.ARCHIVING}")
        backend.write(f"{STAGE}/again.txt", b"2")
        store = backend.open()
        assert store.archive(stage) == ".attempts/2"
        assert backend.open().archives(stage) == ["1", "2"]
        assert backend.open().archive(stage) is None   # nothing left

    def test_an_archive_cut_short_is_finished_by_the_next(self, backend):
        self.populate(backend)
        # What an archive interrupted between its copies and its deletes leaves:
        backend.write(f"{STAGE}/.attempts/1/{layout.ARCHIVING}", json.dumps(["model.bin"]).encode())
        backend.write(f"{STAGE}/.attempts/1/model.bin", FILES["model.bin"])
        stage = self.stage(backend)
        assert backend.open().archive(stage) == ".attempts/1"
        assert backend.read(f"{STAGE}/.attempts/1/sub/vocab.txt") == FILES["sub/vocab.txt"]
        assert not backend.exists(f"{STAGE}/.attempts/1/{layout.ARCHIVING}")
        assert backend.open().archives(stage) == ["1"]

    def test_archive_from_moves_a_jobs_outputs_elsewhere_into_its_records_archive(self, backend):
        """A rule in its own layout: its record in one directory, its outputs
        (and side files) where its rule put them; each is archived at its
        path from there, into the archive a record's archive just made."""
        record_dir = "_all/exp1/fit/a"
        backend.write(f"{record_dir}/{layout.MANIFEST}", b"{}")
        backend.write("data/a/model.bin", b"weights")
        backend.write("data/a/sub/notes.txt", b"side")
        backend.write("data/a/other.txt", b"not the job's")
        directory, base = self.stage(backend, record_dir), self.stage(backend, "data/a")
        store = backend.open()
        assert store.archive_from(directory, base, ["model.bin", "sub/notes.txt", "gone.txt"]) == ".attempts/1"
        assert backend.read(f"{record_dir}/.attempts/1/model.bin") == b"weights"
        assert backend.read(f"{record_dir}/.attempts/1/sub/notes.txt") == b"side"
        assert not backend.exists("data/a/model.bin") and not backend.exists("data/a/sub/notes.txt")
        assert backend.exists("data/a/other.txt") and backend.exists(f"{record_dir}/{layout.MANIFEST}")
        assert not backend.exists(f"{record_dir}/.attempts/1/{layout.ARCHIVING}")
        assert backend.open().archive_from(directory, base, ["model.bin"]) is None   # nothing there
        backend.write("data/a/model.bin", b"again")
        store = backend.open()
        assert store.archive(directory) == ".attempts/2"
        assert store.archive_from(directory, base, ["model.bin"], into=".attempts/2") == ".attempts/2"
        assert backend.read(f"{record_dir}/.attempts/2/model.bin") == b"again"
        assert backend.read(f"{record_dir}/.attempts/2/{layout.MANIFEST}") == b"{}"

    # --- checksums and reuse -----------------------------------------------------
    def test_digests_match_the_manifest(self, backend):
        outputs = self.populate(backend)
        store = backend.open()
        stage = self.stage(backend)
        for out in outputs:
            sha256, crc32c = store.digests(layout.join(stage, out["path"]))
            assert sha256 == out["sha256"] and crc32c in (None, out["crc32c"])
            assert store.crc32c(layout.join(stage, out["path"])) in (None, out["crc32c"])
        if store.listed_crc32c:
            assert store.crc32c(layout.join(stage, "model.bin")) == outputs[0]["crc32c"]

    def test_bring_copies_a_stage_and_leaves_the_source_alone(self, backend, tmp_path):
        """From a stage of the same store (server-side where it can) and from disk."""
        from waypost import stores
        outputs = self.populate(backend)
        source = self.stage(backend)
        before = backend.open().file_sizes(source)
        target = self.stage(backend, "en-de/exp2/train")
        how, crc32cs = backend.open().bring(stores.store_for(source), source, target, outputs)
        assert backend.read("en-de/exp2/train/sub/vocab.txt") == FILES["sub/vocab.txt"]
        assert backend.open().file_sizes(source) == before and not backend.exists("en-de/exp2/train/_logs")
        if backend.open().server_side_copy:
            assert how == "copied in the bucket" and crc32cs["model.bin"] == outputs[0]["crc32c"]
        disk = tmp_path / "disk/en-de/exp1/train"
        for rel, data in FILES.items():
            (disk / rel).parent.mkdir(parents=True, exist_ok=True)
            (disk / rel).write_bytes(data)
        mtime = (disk / "model.bin").stat().st_mtime_ns, (disk / "model.bin").stat().st_ctime_ns
        other = self.stage(backend, "en-de/exp3/train")
        backend.open().bring(stores.store_for(str(disk)), str(disk), other, outputs)
        assert backend.read("en-de/exp3/train/model.bin") == FILES["model.bin"]
        assert ((disk / "model.bin").stat().st_mtime_ns, (disk / "model.bin").stat().st_ctime_ns) == mtime
        assert (disk / "model.bin").stat().st_nlink == 1

    def test_bring_refuses_a_source_that_differs(self, backend):
        from waypost import stores
        outputs = self.populate(backend)
        backend.write(f"{STAGE}/model.bin", b"changed since")
        source, target = self.stage(backend), self.stage(backend, "en-de/exp2/train")
        with pytest.raises(manifest.ManifestError, match="differs from its manifest"):
            backend.open().bring(stores.store_for(source), source, target, outputs)
        assert not backend.exists("en-de/exp2/train/model.bin") and not backend.exists("en-de/exp2/train/sub/vocab.txt")
