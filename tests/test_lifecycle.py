"""The one lifecycle reader (waypost.state.lifecycle) gives the same answers on
every kind of store: a directory as it is, a listed snapshot of it, a
bucket. Every stage-state question (planner, status, plan, cron, the
executor, rerun/retry, prune) is one of its answers, so they are tested
here once, over each store; the records it reads are the ones waypost
writes (waypost.model.records), checked against their schema."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from waypost import stores
from waypost.model import manifest, records, states
from waypost.model.layout import MANIFEST, PROVISIONAL, RUNNING, UNFINISHED
from waypost.state import lifecycle

WHERE = {"experiment": "e", "pair": "p", "stage": "fit", "instance": None}


def an_attempt(state: str | None = "FAILED", run: str = "run-1") -> dict:
    return records.attempt(number=1, series=1, action="cmd", start=manifest.now_iso(), run=run,
                           host=manifest.hostname(), job=None, command="fit --all",
                           worker={"pool": "local", "class": "cpu"}, state=state,
                           end=manifest.now_iso() if state else None, exit_code=0 if state == "SUCCESS" else 1)


def a_manifest(state: str = "SUCCESS", outputs=(), run: str = "run-1", **more) -> dict:
    return records.manifest(**WHERE, state=state, created=manifest.now_iso(), attempts=[an_attempt(state, run)],
                            outputs=list(outputs), inputs=[], settings={}, config_hash="h", code_version="c",
                            run=run, **more)


def a_marker(pid: int | None, host: str | None = None, job: str | None = None) -> dict:
    return records.marker(pid=pid, host=host or manifest.hostname(), run="run-2", series=1, series_base=0,
                          outputs=["model.txt"], job=("slurm", job) if job else None, attempts=[an_attempt(None, "run-2")])


class Local:
    """A stage directory on disk, read as it is (``snapshot``: listed once)."""

    def __init__(self, tmp_path, snapshot: bool):
        self.root, self.snapshot = str(tmp_path / "root"), snapshot
        self.dir = os.path.join(self.root, "p", "e", "fit")
        os.makedirs(self.dir)

    def put(self, name: str, data: bytes, when: float | None = None) -> None:
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        if when is not None:
            os.utime(path, (when, when))

    def store(self):
        return stores.store_for(self.root, snapshot=self.snapshot)


class Bucket:
    """A stage directory in a bucket, read from one listing of the root."""

    def __init__(self, root: str):
        from waypost.stores import gcs
        self.root, self.key = root, gcs.MTIME_KEY
        self.dir = f"{root}/p/e/fit"
        self.fs, self.base = gcs.filesystem(root)

    def put(self, name: str, data: bytes, when: float | None = None) -> None:
        self.fs.pipe_file(f"{self.base}/p/e/fit/{name}", data,
                          metadata={self.key: repr(time.time() if when is None else when)})

    def store(self):
        return stores.store_for(self.root)


@pytest.fixture(params=["disk", "snapshot", "bucket"])
def place(request, tmp_path):
    if request.param == "bucket":
        return Bucket(request.getfixturevalue("bucket"))
    return Local(tmp_path, snapshot=request.param == "snapshot")


def read(place) -> lifecycle.Life:
    return lifecycle.read(place.store(), place.dir)


def dump(record: dict) -> bytes:
    return json.dumps(record).encode()


@pytest.fixture
def gone_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def live_pid():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_nothing_there_is_missing_and_files_without_a_manifest_are_adopted(place):
    life = read(place)
    assert (life.state(), life.redo, life.recheck, life.live) == (states.MISSING, False, False, None)
    place.put("model.txt", b"weights")
    assert read(place).state(WHERE) == states.ADOPTED


def test_a_success_is_done_until_an_output_it_records_is_gone(place):
    place.put("model.txt", b"weights")
    place.put(MANIFEST, dump(a_manifest(outputs=[{"path": "model.txt", "size": 7, "sha256": "0" * 64}])))
    assert read(place).state(WHERE) == states.SUCCESS
    assert read(place).state({**WHERE, "stage": "other"}) == states.ADOPTED   # a manifest copied from elsewhere
    if isinstance(place, Local):
        os.unlink(os.path.join(place.dir, "model.txt"))
    else:
        place.fs.rm(f"{place.base}/p/e/fit/model.txt")
    life = read(place)
    assert life.state(WHERE) == states.MISSING and life.missing_outputs() == ["model.txt"]


def test_an_attempt_whose_runner_is_gone_is_interrupted_and_redone(place, gone_pid):
    place.put(RUNNING, dump(a_marker(gone_pid)))
    life = read(place)
    assert life.interrupted and life.live is None
    assert (life.state(), life.redo, life.recheck) == (states.INTERRUPTED, True, False)
    assert life.marker["outputs"] == ["model.txt"]


def test_an_attempt_at_work_is_running_and_named(place, live_pid):
    place.put(RUNNING, dump(a_marker(live_pid)))
    life = read(place)
    assert life.state() == states.RUNNING and life.redo   # its job waits for it, never starts a second
    assert life.live.pid == live_pid and life.live.where == f"pid {live_pid} on {manifest.hostname()}"
    assert lifecycle.read(place.store(), place.dir, me=live_pid).live is None   # its own runner asking


def test_a_marker_older_than_the_manifest_beside_it_was_closed_by_it(place, live_pid):
    # The runner died between writing its manifest and removing its marker
    # (a job ended at its time limit, say): the manifest has the last word.
    now = time.time()
    place.put("model.txt", b"weights")
    place.put(RUNNING, dump(a_marker(live_pid)), when=now - 30)
    place.put(MANIFEST, dump(a_manifest(outputs=[{"path": "model.txt", "size": 7, "sha256": "0" * 64}])),
              when=now - 10)
    life = read(place)
    assert not life.open_attempt and life.live is None and not life.interrupted
    assert (life.state(WHERE), life.redo) == (states.SUCCESS, False)


def test_a_new_attempt_over_an_old_manifest_is_open(place, live_pid):
    now = time.time()
    place.put(MANIFEST, dump(a_manifest("TIMEOUT")), when=now - 300)
    place.put(RUNNING, dump(a_marker(live_pid)), when=now)
    life = read(place)
    assert life.open_attempt and life.state() == states.RUNNING


def test_another_hosts_attempt_is_unknown_not_gone_until_its_lease_ends(place):
    place.put(RUNNING, dump(a_marker(4242, host="node-elsewhere")), when=time.time() - 5)
    live = read(place).live
    assert live is not None and live.unknown and "node-elsewhere" in live.where
    place.put(RUNNING, dump(a_marker(4242, host="node-elsewhere")), when=time.time() - lifecycle.LEASE_S - 60)
    assert read(place).live is None and read(place).interrupted


def test_an_unreadable_marker_is_an_interrupted_attempt(place):
    place.put(RUNNING, b"{not json")
    life = read(place)
    assert life.live is None and life.state() == states.INTERRUPTED


def test_an_unfinished_series_is_redone_when_its_date_comes(place):
    place.put(MANIFEST, dump(a_manifest("TIMEOUT")))
    place.put(UNFINISHED, b"TIMEOUT\n", when=time.time() + 3600)   # in its backoff
    life = read(place)
    assert (life.redo, life.recheck, life.next_series_due) == (False, True, False)
    assert lifecycle.read(place.store(), place.dir, now=time.time() + 7200).redo   # its date has come


def test_a_provisional_stage_has_its_inputs_looked_at_again(place):
    place.put(MANIFEST, dump(a_manifest(provisional=True)))
    place.put(PROVISIONAL, b"")
    life = read(place)
    assert (life.redo, life.recheck, life.provisional) == (False, True, True)


def test_a_manifest_that_cant_be_used_is_corrupt(place):
    place.put(MANIFEST, b"[1, 2")
    life = read(place)
    assert life.state() == states.CORRUPT and "manifest" in life.error and life.manifest is None


def test_a_series_this_run_ended_is_known_to_the_executor(place, live_pid):
    place.put(MANIFEST, dump(a_manifest("FAILED", run="run-7", given_up=True)))
    life = read(place)
    assert life.ended_in_run("run-7") and not life.ended_in_run("run-8") and life.given_up
    place.put(RUNNING, dump(a_marker(live_pid)), when=time.time() + 5)   # the series goes on
    assert not read(place).ended_in_run("run-7")


# --- the records the reader reads: written in one place, to one schema -------

def test_the_records_waypost_builds_fit_their_schema():
    assert records.problems("manifest", a_manifest(outputs=[{"path": "m", "size": 1, "sha256": "a" * 64}])) == []
    assert records.problems("marker", a_marker(12)) == []
    assert records.problems("attempt", an_attempt()) == []


def test_a_record_that_does_not_fit_stops_its_writer_in_the_tests(tmp_path, monkeypatch):
    wrong = a_manifest()
    wrong["attempts"][0]["started"] = wrong["attempts"][0].pop("start")   # a field gone astray
    problems = records.problems("manifest", wrong)
    assert any("start" in p and "required" in p for p in problems), problems
    assert any("started" in p for p in problems), problems
    monkeypatch.setenv(records.CHECK_ENV, "1")
    with pytest.raises(records.RecordError, match=r"does not fit records\.schema\.json"):
        stores.store_for(str(tmp_path)).write_manifest(str(tmp_path), wrong)
    assert not (tmp_path / MANIFEST).exists()   # nothing written
    monkeypatch.delenv(records.CHECK_ENV)
    records.checked("manifest", wrong, "x")     # outside the tests: written as it is


def test_an_older_manifest_is_still_read(tmp_path):
    # What an early waypost wrote: no schema number, no run, an attempt with
    # fewer fields. It is read (and shown) as it is.
    old = {"experiment": "e", "pair": "p", "stage": "fit", "instance": None, "state": "SUCCESS",
           "attempts": [{"number": 1, "action": "cmd", "state": "SUCCESS", "exit_code": 0, "started": "x"}],
           "outputs": [{"path": "model.txt", "size": 7, "sha256": "0" * 64}], "inputs": []}
    directory = tmp_path / "p" / "e" / "fit"
    directory.mkdir(parents=True)
    (directory / "model.txt").write_text("weights")
    (directory / MANIFEST).write_text(json.dumps(old))
    life = lifecycle.read(stores.store_for(str(tmp_path)), str(directory))
    assert life.error is None and life.state(WHERE) == states.SUCCESS
    assert records.problems("manifest", old)   # not what waypost writes now
