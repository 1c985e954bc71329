"""Records name the scheduler whose job an attempt ran in, and records an
older waypost wrote (a Slurm job's id under ``slurm_job_id``, no scheduler)
still read as naming a Slurm job: the lifecycle reader, the runner's
lost-job mode and ``waypost status`` all ask ``waypost.scheduler.for_record``."""

from __future__ import annotations

import json
import subprocess

from conftest import RUNNER, read_manifest, step_input

from waypost import scheduler
from waypost.cli import statuspage
from waypost.model import manifest, records
from waypost.scheduler.slurm import SLURM

# An attempt and a running marker as waypost wrote them before records named
# their scheduler.
OLD_ATTEMPT = {"number": 1, "series": 1, "action": "cmd", "state": "TIMEOUT", "exit_code": None, "signal": 15,
               "checks": {}, "decision": {"action": "fail", "reason": "TIMEOUT"},
               "start": "2026-11-02T10:00:00+00:00", "end": "2026-11-02T11:00:00+00:00", "duration_s": 3600.0,
               "host": "node3", "run": "run-1", "slurm_job_id": "8812", "runtime_limit_s": None,
               "command": "train", "workspace": ".", "log": "_logs/attempt-1.log",
               "worker": {"pool": "onprem", "class": "cpu"}}
OLD_MANIFEST = {"schema": 1, "experiment": "e", "pair": "p", "stage": "s", "instance": None, "state": "TIMEOUT",
                "created": "2026-11-02T11:00:01+00:00", "run": "run-1", "attempts": [OLD_ATTEMPT], "outputs": [],
                "inputs": [], "settings": {}, "config_hash": "h", "code_version": "c", "reused_from": None,
                "adopted": False, "waypost_version": "0.9.0"}
OLD_MARKER = {"schema": 1, "pid": 4242, "host": "node3", "run": "run-1", "series": 1, "series_base": 0,
              "outputs": ["model.txt"], "slurm_job_id": "8813", "attempts": []}


def test_an_old_manifest_and_marker_name_a_slurm_job():
    data = manifest.parse(json.dumps(OLD_MANIFEST), "results/p/e/s/_manifest.json")
    assert records.job_of(data["attempts"][0]) == ("slurm", "8812")
    assert scheduler.for_record(data["attempts"][0]) == (SLURM, "8812")
    assert scheduler.for_record(OLD_MARKER) == (SLURM, "8813")
    assert scheduler.for_record({**OLD_MARKER, "slurm_job_id": None}) is None
    # an integer id, as hand-made manifests have it, reads as the same job
    assert records.job_of({"slurm_job_id": 8812}) == ("slurm", "8812")


def test_new_records_name_their_scheduler_and_job_and_fit_the_schema(tmp_path):
    attempt = records.attempt(number=1, series=1, action="cmd", start=manifest.now_iso(), run="r", host="n",
                              job=("slurm", "77"), command="train", worker={"pool": "onprem", "class": "cpu"})
    assert (attempt["scheduler"], attempt["scheduler_job_id"]) == ("slurm", "77") and "slurm_job_id" not in attempt
    marker = records.marker(pid=1, host="n", run="r", series=1, series_base=0, outputs=[], job=None,
                            attempts=[attempt])
    assert (marker["scheduler"], marker["scheduler_job_id"]) == (None, None)
    records.checked("marker", marker, str(tmp_path / "_running.json"))
    assert scheduler.for_record(attempt) == (SLURM, "77") and scheduler.for_record(marker) is None
    assert scheduler.current_job({"SLURM_JOB_ID": "91"}) == ("slurm", "91")
    assert scheduler.current_job({}) is None


def test_the_status_page_names_an_old_and_a_new_records_job():
    new = {**OLD_ATTEMPT, "slurm_job_id": None, "scheduler": "slurm", "scheduler_job_id": "8814"}
    cell = {"state": "TIMEOUT", "attempts": 2, "path": "results/p/e/s", "history": [OLD_ATTEMPT, new]}
    page = statuspage.render({"root": "results", "stages": ["s"], "experiments": {"e": {"p": {"s": cell}}}})
    assert "<td>slurm 8812</td>" in page and "<td>slurm 8814</td>" in page


def lost_job(stage, *options: str) -> subprocess.CompletedProcess:
    step = step_input(stage, "echo never runs > out.txt", [stage / "out.txt"])
    return subprocess.run([*RUNNER, *options, "--lost-state", "CANCELLED", "--lost-reason", "cancelled pending",
                           "--last-chance"], input=step, capture_output=True)


def test_the_runner_records_a_lost_job_under_its_scheduler_in_either_spelling(tmp_path):
    # --lost-slurm-job: what a driver from before schedulers had names passes
    for stage, options, job in ((tmp_path / "p/e/new", ["--lost-job", "501", "--lost-scheduler", "slurm"], "501"),
                                (tmp_path / "p/e/old", ["--lost-slurm-job", "502"], "502")):
        proc = lost_job(stage, *options)
        assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr   # the stage failed
        (attempt,) = read_manifest(stage)["attempts"]
        assert (attempt["state"], attempt["scheduler"], attempt["scheduler_job_id"]) == ("CANCELLED", "slurm", job)
        assert "Slurm job " + job in attempt["error"]
    # a mistake in the options is one line
    for options, says in ((["--lost-job", "503"], "--lost-job needs --lost-scheduler"),
                          (["--lost-job", "503", "--lost-scheduler", "pbs"], "no scheduler 'pbs'")):
        proc = lost_job(tmp_path / "p/e/bad", *options)
        assert proc.returncode == 1 and says in proc.stderr.decode(), proc.stderr
        assert b"Traceback" not in proc.stderr
