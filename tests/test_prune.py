"""`waypost prune` and `waypost status --sizes`: archived workspaces
(`.attempts/<n>/`) beyond the retention go, nothing still needed does, and
those only an attempt history points into are slimmed to their logs and
manifest; on disk and in a gs:// root (fake-gcs-server).

The stage dirs are written here as the runner leaves them (manifests from
records.manifest, archives with their own manifest and logs), no pipeline run.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import gcs_fs as fs
from conftest import gcs_key as key
from conftest import gcs_objects as objects
from conftest import prepare_reference, waypost, write_config

from waypost import stores
from waypost.model import config as wconfig
from waypost.model import manifest, records
from waypost.ops import prune

REPO = Path(__file__).resolve().parent.parent
DAY = 86400

CONFIG = {
    "root": "results",
    "experiments": {
        "exp1": {"pairs": ["en-xa", "en-xb"],
                 "per_pair": {"en-xb": {"train_backward": {"retention": {"keep_days": 10}}}}},
        "exp2": {"pairs": ["en-xa"],
                 "reuse": {"clean_corpus": {"en-xa": "results/en-xa/exp1/clean_corpus/.attempts/1"}}},
    },
    "retention": {"keep_last": 2},
    "stages": {"train_teacher": {"retention": {"keep_last": 1}}},
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def attempt(number: int, series: int, workspace: str = ".", state: str = "FAILED") -> dict:
    """An attempt record as the runner writes it (its workspace archived or not)."""
    log = f"_logs/attempt-{number}.log"
    return records.attempt(number=number, series=series, action="cmd", state=state, start=manifest.now_iso(),
                           end=manifest.now_iso(), exit_code=0 if state == "SUCCESS" else 1, duration_s=1.0,
                           host="node1", run="r", job=None, command="train",
                           worker={"pool": "local", "class": "cpu"},
                           log=log if workspace == "." else f"{workspace}/{log}") | {"workspace": workspace}


def record(where: str, state: str, attempts: list, outputs=(), inputs=(), reused_from=None) -> dict:
    """A manifest of the stage dir ``pair/experiment/stage[/instance]``."""
    pair, experiment, stage, *instance = where.split("/")
    return records.manifest(created=manifest.now_iso(), experiment=experiment, pair=pair, stage=stage,
                            instance=(instance or [None])[0], state=state, attempts=attempts,
                            outputs=list(outputs), inputs=list(inputs), settings={}, config_hash="abc",
                            code_version="v1", reused_from=reused_from)


def model(number: int) -> bytes:
    return f"checkpoint of series {number}\n".encode() * (40 * number)


class Files:
    """Writes stage files under a root: on disk, or as objects in a bucket."""

    def __init__(self, root: str):
        self.root = root

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def write(self, rel: str, data: bytes) -> None:
        if stores.is_bucket_url(self.root):
            fs().pipe_file(key(self.path(rel)), data)
        else:
            os.makedirs(os.path.dirname(self.path(rel)), exist_ok=True)
            with open(self.path(rel), "wb") as f:
                f.write(data)

    def manifest(self, rel_dir: str, data: dict, name: str = "_manifest.json") -> None:
        self.write(f"{rel_dir}/{name}", json.dumps(data, indent=2).encode())

    def archives(self, where: str, count: int, success: tuple[int, ...] = ()) -> None:
        """``count`` archives as series of the runner leave them: a model,
        the log, the series' manifest (SUCCESS for those in ``success``)."""
        for n in range(1, count + 1):
            base = f"{where}/.attempts/{n}"
            state = "SUCCESS" if n in success else "FAILED"
            self.write(f"{base}/model.bin", model(n))
            self.write(f"{base}/_logs/attempt-{n}.log", b"log\n")
            self.manifest(base, record(where, state, [attempt(n, n, state=state)],
                                       outputs=[{"path": "model.bin", "size": len(model(n)),
                                                 "sha256": sha(model(n))}] if state == "SUCCESS" else []))

    def finished(self, where: str, history: list, data: bytes = b"current model\n", **extra) -> dict:
        """The stage's current workspace: SUCCESS, with ``history`` before its own attempt."""
        self.write(f"{where}/model.bin", data)
        self.write(f"{where}/_logs/attempt-9.log", b"log\n")
        data_record = record(where, "SUCCESS", [*history, attempt(9, 9, state="SUCCESS")],
                             outputs=[{"path": "model.bin", "size": len(data), "sha256": sha(data)}], **extra)
        self.manifest(where, data_record)
        return data_record


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def build_tree(files: Files, sleeper_pid: int) -> None:
    """The stage dirs of the scenario; comments say what prune must do."""
    # keep_last 2: 6 and 5 are the newest; 4 is in the current manifest's
    # history and 3 in an interrupted runner's marker (both slimmed: their
    # model goes, their log and manifest stay); 2 holds the outputs a live
    # consumer was made from (the stage was redone since); 1 goes.
    backward = "en-xa/exp1/train_backward"
    files.archives(backward, 6, success=(2,))
    files.finished(backward, [attempt(4, 4, workspace=".attempts/4")])
    files.manifest(backward, {"pid": dead_pid(), "host": socket.gethostname(), "series": 10,
                              "attempts": [attempt(3, 3, workspace=".attempts/3")]}, name="_running.json")
    files.finished("en-xa/exp1/translate_mono", [], inputs=[{
        "path": files.path(f"{backward}/model.bin"), "manifest": files.path(f"{backward}/_manifest.json"),
        "state": "SUCCESS", "sha256": sha(model(2)), "provisional": False}])
    # train_teacher keeps 1 (its own retention): instance 0's archive 1 is
    # what exp2 reused; 2 goes. Instance 1: 1 goes.
    files.archives("en-xa/exp1/train_teacher/0", 3, success=(1,))
    files.archives("en-xa/exp1/train_teacher/1", 2)
    files.finished("en-xa/exp2/train_teacher/0", [],
                   reused_from=files.path("en-xa/exp1/train_teacher/0/.attempts/1"))
    # clean_corpus: archive 1 is where the config's reuse of exp2 points.
    files.archives("en-xa/exp1/clean_corpus", 3, success=(1,))
    # en-xb's train_backward also keeps 10 days: 2 (5 days old) stays, 1 (30) goes.
    files.archives("en-xb/exp1/train_backward", 4)
    # An attempt is running in en-xb's train_student: nothing there is touched.
    files.archives("en-xb/exp1/train_student", 4)
    files.manifest("en-xb/exp1/train_student", {"pid": sleeper_pid, "host": socket.gethostname(), "series": 5,
                                                "attempts": []}, name="_running.json")
    # The funnel: 1 goes.
    files.archives("_all/exp1/report", 3)


REMOVED = ["en-xa/exp1/train_backward/.attempts/1", "en-xa/exp1/train_teacher/0/.attempts/2",
           "en-xa/exp1/train_teacher/1/.attempts/1", "en-xb/exp1/train_backward/.attempts/1",
           "_all/exp1/report/.attempts/1"]
SLIMMED = ["en-xa/exp1/train_backward/.attempts/3", "en-xa/exp1/train_backward/.attempts/4"]


def age(path: Path, days: float) -> None:
    when = time.time() - days * DAY
    for top, _, names in os.walk(path):
        for name in names:
            os.utime(os.path.join(top, name), (when, when))
    os.utime(path, (when, when))


def listed(out: str, verb: str) -> list[str]:
    """The archives a prune run's lines start with ``verb`` (relative to results/)."""
    return sorted(line.split()[len(verb.split())].split("results/", 1)[1] for line in out.splitlines()
                  if line.startswith(verb + " ") and "/.attempts/" in line)


def every_file(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "120"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def local_tree(tmp_path, sleeper) -> Path:
    write_config(tmp_path, CONFIG)
    build_tree(Files(str(tmp_path / "results")), sleeper)
    age(tmp_path / "results/en-xb/exp1/train_backward/.attempts/1", 30)
    age(tmp_path / "results/en-xb/exp1/train_backward/.attempts/2", 5)
    return tmp_path


def test_dry_run_then_prune_removes_exactly_what_it_listed_and_nothing_still_needed(local_tree):
    results = local_tree / "results"
    before = every_file(results)
    sizes = json.loads(waypost(local_tree, "status", "--sizes", "--json").stdout)
    assert sizes["archives"] == 6 + 3 + 2 + 3 + 4 + 4 + 3
    by_dir = {(r["pair"], r["stage"], r["instance"]): r for r in sizes["stages"]}
    assert by_dir[("en-xa", "train_backward", None)]["archives"] == 6
    assert by_dir[("en-xa", "train_teacher", "0")]["archives"] == 3
    assert by_dir[("_all", "report", None)]["archives"] == 3
    assert sizes["bytes"] == sum(r["bytes"] for r in sizes["stages"])
    table = waypost(local_tree, "status", "--sizes").stdout
    assert "archived workspaces" in table and "total" in table and "KiB" in table

    out = waypost(local_tree, "prune", "-n").stdout
    assert every_file(results) == before                       # a dry run changes nothing
    assert listed(out, "would remove") == sorted(REMOVED)
    assert listed(out, "would slim") == SLIMMED
    why = {line.split()[1].split("results/", 1)[1]: line.split(": ", 1)[1] for line in out.splitlines()
           if line.startswith("keep ") and "/.attempts/" in line}
    assert why["en-xa/exp1/train_backward/.attempts/6"] == "among the newest 2"
    slim = {line.split()[2].split("results/", 1)[1]: line for line in out.splitlines()
            if line.startswith("would slim ")}
    assert slim["en-xa/exp1/train_backward/.attempts/4"].endswith(
        "but attempt 4's workspace and log in the current manifest: keeps its _logs/ and _manifest.json")
    assert slim["en-xa/exp1/train_backward/.attempts/3"].endswith(
        "but attempt 3's workspace and log in the current _running.json: keeps its _logs/ and _manifest.json")
    assert f"  {prune.human(len(model(4)))} of " in slim["en-xa/exp1/train_backward/.attempts/4"]
    assert why["en-xa/exp1/train_backward/.attempts/2"] == \
        "its outputs are inputs of results/en-xa/exp1/translate_mono (made before the stage was redone)"
    assert why["en-xa/exp1/train_teacher/0/.attempts/1"] == "results/en-xa/exp2/train_teacher/0 was reused from it"
    assert why["en-xa/exp1/train_teacher/0/.attempts/3"] == "among the newest 1"
    assert why["en-xa/exp1/clean_corpus/.attempts/1"].startswith("the config's reuse of clean_corpus (exp2, en-xa)")
    assert why["en-xb/exp1/train_backward/.attempts/2"].startswith("archived 5.0 day(s) ago, within keep_days 10")
    for n in range(1, 5):
        assert why[f"en-xb/exp1/train_student/.attempts/{n}"].startswith("an attempt is running in its stage dir (pid")
    removed_bytes = sum(len(model(int(p.rsplit("/", 1)[1]))) + 4 + len((results / p / "_manifest.json").read_bytes())
                        for p in REMOVED)
    slimmed_bytes = len(model(3)) + len(model(4))
    assert f"would remove 5 archive(s), {prune.human(removed_bytes)}; " \
           f"would slim 2, {prune.human(slimmed_bytes)}; kept 18," in out
    assert "en-xb/exp1/train_backward/.attempts/1" in out
    assert "beyond the newest 2 and 30 day(s) old (keep_days 10)" in out

    real = waypost(local_tree, "prune").stdout
    assert listed(real, "removed") == listed(out, "would remove")
    assert listed(real, "slimmed") == SLIMMED
    assert f"removed 5 archive(s), {prune.human(removed_bytes)}; slimmed 2, {prune.human(slimmed_bytes)}; kept 18," \
        in real
    after = every_file(results)
    assert before - after == {f for f in before if any(f.startswith(p + "/") for p in REMOVED)} | \
        {f"{p}/model.bin" for p in SLIMMED}
    for n in (3, 4):
        kept = sorted(every_file(results / f"en-xa/exp1/train_backward/.attempts/{n}"))
        assert kept == [f"_logs/attempt-{n}.log", "_manifest.json"]
    for gone in REMOVED:
        assert not (results / gone).exists()
    # Every live workspace is whole; what was kept is whole.
    for where in ("en-xa/exp1/train_backward", "en-xa/exp1/translate_mono", "en-xa/exp2/train_teacher/0"):
        assert manifest.verify_outputs(str(results / where), manifest.read(str(results / where))) == []
    assert (results / "en-xa/exp1/train_backward/_running.json").exists()
    assert (results / "en-xa/exp1/train_teacher/0/.attempts/1/model.bin").read_bytes() == model(1)

    again = waypost(local_tree, "prune", "-n").stdout
    assert "would remove 0 archive(s), 0 B; would slim 0, 0 B; kept 20," in again
    assert "slimmed already (only its _logs/ and _manifest.json are left): attempt 4's" in again
    assert json.loads(waypost(local_tree, "status", "--sizes", "--json").stdout)["archives"] == 20


def test_prune_takes_a_selection_and_refuses_unknown_names(local_tree):
    out = waypost(local_tree, "prune", "-n", "--stage", "train_teacher").stdout
    assert listed(out, "would remove") == ["en-xa/exp1/train_teacher/0/.attempts/2",
                                           "en-xa/exp1/train_teacher/1/.attempts/1"]
    assert "train_backward" not in out
    out = waypost(local_tree, "prune", "--pair", "_all").stdout
    assert listed(out, "removed") == ["_all/exp1/report/.attempts/1"]
    assert (local_tree / "results/en-xa/exp1/train_backward/.attempts/1").exists()
    out = waypost(local_tree, "prune", "-n", "--experiment", "exp2").stdout
    assert "no archived workspaces" in out
    for args in (["--stage", "nosuch"], ["--experiment", "nosuch"], ["--pair", "xx-yy"]):
        proc = waypost(local_tree, "prune", "-n", *args, check=False)
        assert proc.returncode == 2 and "unknown" in proc.stderr, proc.stderr
    proc = waypost(local_tree, "status", "--sizes", "--experiment", "nosuch", check=False)
    assert proc.returncode == 2
    one = json.loads(waypost(local_tree, "status", "--sizes", "--json", "--experiment", "exp1", "--pair", "en-xb").stdout)
    assert {(r["pair"], r["stage"]) for r in one["stages"]} == {("en-xb", "train_backward"), ("en-xb", "train_student")}
    assert one["archives"] == 8


def test_keep_last_null_keeps_everything_and_keep_last_0_goes_by_age(local_tree):
    config = copy.deepcopy(CONFIG)
    config["retention"] = {"keep_last": None}
    config["stages"] = {}
    write_config(local_tree, config)
    out = waypost(local_tree, "prune").stdout
    assert "removed 0 archive(s)" in out and "keep_last: null keeps every archive" in out
    config["retention"] = {"keep_last": 0, "keep_days": 20}
    write_config(local_tree, config)
    out = waypost(local_tree, "prune", "-n", "--pair", "en-xb", "--stage", "train_backward").stdout
    assert listed(out, "would remove") == ["en-xb/exp1/train_backward/.attempts/1"]


def test_retention_merges_like_policy_and_is_not_a_step_setting():
    config = prepare_reference(copy.deepcopy(CONFIG), "test")
    assert config["retention"] == {"keep_last": 2}
    assert prune.retention(config, "exp1", "en-xa", "train_backward") == {"keep_last": 2, "keep_days": None}
    assert prune.retention(config, "exp1", "en-xb", "train_backward") == {"keep_last": 2, "keep_days": 10}
    assert prune.retention(config, "exp1", "en-xa", "train_teacher") == {"keep_last": 1, "keep_days": None}
    assert "retention" not in wconfig.step_settings(config, "exp1", "en-xb", "train_backward")
    defaults = prepare_reference({"experiments": {"e": {"pairs": ["en-xa"]}}}, "test")
    assert defaults["retention"] == {"keep_last": 3, "keep_days": None}
    assert prune.retention(defaults, "e", "en-xa", "export") == prune.DEFAULT_RETENTION


@pytest.mark.parametrize("retention, message", [
    ({"keep_last": -1}, "retention.keep_last"),
    ({"keep_days": 0}, "retention.keep_days"),
    ({"keep": 3}, "unknown key 'keep'"),
])
def test_a_bad_retention_is_a_config_error(tmp_path, retention, message):
    config = copy.deepcopy(CONFIG)
    config["stages"]["train_student"] = {"retention": retention}
    write_config(tmp_path, config)
    proc = waypost(tmp_path, "prune", "-n", check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_prune_in_a_bucket(bucket, tmp_path, sleeper):
    root = f"{bucket}/results"
    files = Files(root)
    build_tree(files, sleeper)
    config = copy.deepcopy(CONFIG)
    config["root"] = root
    config["experiments"]["exp2"]["reuse"]["clean_corpus"]["en-xa"] = f"{root}/en-xa/exp1/clean_corpus/.attempts/1"
    # No ages to set in a bucket: en-xb's train_backward keeps all 4 (all younger than 10 days).
    expected = sorted(p for p in REMOVED if not p.startswith("en-xb/exp1/train_backward"))
    write_config(tmp_path, config)
    before = objects(root)

    sizes = json.loads(waypost(tmp_path, "status", "--sizes", "--json").stdout)
    assert sizes["archives"] == 25
    out = waypost(tmp_path, "prune", "-n").stdout
    assert objects(root) == before
    assert listed(out, "would remove") == expected
    assert listed(out, "would slim") == SLIMMED
    assert "its outputs are inputs of gs://" in out and "was reused from it" in out
    assert "but attempt 3's workspace and log in the current _running.json" in out
    assert "an attempt is running in its stage dir (pid" in out
    assert "within keep_days 10" in out

    real = waypost(tmp_path, "prune").stdout
    assert listed(real, "removed") == expected
    assert listed(real, "slimmed") == SLIMMED
    after = objects(root)
    assert before - after == {o for o in before if any(o.startswith(p + "/") for p in expected)} | \
        {f"{p}/model.bin" for p in SLIMMED}
    assert "en-xa/exp1/train_backward/.attempts/2/_manifest.json" in after
    assert json.loads(waypost(tmp_path, "status", "--sizes", "--json").stdout)["archives"] == 25 - len(expected)


# A stage failing run after run under cron: every series archived the one
# before it, with its checkpoints, and the runner copied every earlier series
# into the current manifest's history (workspace and log in the archives).
FAILING = "en-xa/exp1/train_student"
CHECKPOINT = 300_000


def checkpoint(n: int) -> bytes:
    return bytes([n]) * CHECKPOINT


def failing_stage(files: Files, series: int = 6) -> None:
    """Archives 1..series-1 of FAILING (a checkpoint, a log, the series'
    manifest each), the current FAILED manifest with all of them in its
    history; archive 1's checkpoint is an input of a live manifest."""
    history = []
    for n in range(1, series):
        base = f"{FAILING}/.attempts/{n}"
        files.write(f"{base}/checkpoints/last.pt", checkpoint(n))
        files.write(f"{base}/notes.txt", b"step 100\n")
        files.write(f"{base}/_logs/attempt-{n}.log", f"series {n}: out of memory\n".encode())
        files.manifest(base, record(FAILING, "FAILED", [*history, attempt(n, n)]))
        history.append(attempt(n, n, workspace=f".attempts/{n}"))
    files.write(f"{FAILING}/_logs/attempt-{series}.log", b"out of memory again\n")
    files.manifest(FAILING, record(FAILING, "FAILED", [*history, attempt(series, series)]))
    files.finished("en-xa/exp1/translate_mono", [], inputs=[{
        "path": files.path(f"{FAILING}/.attempts/1/checkpoints/last.pt"), "manifest": None,
        "state": "FAILED", "sha256": sha(checkpoint(1)), "provisional": False}])


def history_logs_readable(workdir: Path, root: str) -> list[str]:
    """Each attempt's log, as ``waypost status`` finds it through the current manifest: all there."""
    grid = json.loads(waypost(workdir, "status", "--json", "--pair", "en-xa").stdout)
    cell = grid["experiments"]["exp1"]["en-xa"]["train_student"]
    logs = [f"{root}/{FAILING}/{a['log']}" for a in cell["history"]]
    assert len(logs) == 6
    return logs


def test_a_failing_stage_s_archives_only_its_history_points_into_are_slimmed(tmp_path):
    config = copy.deepcopy(CONFIG)
    config["retention"] = {"keep_last": 2, "keep_days": 10}
    write_config(tmp_path, config)
    results = tmp_path / "results"
    failing_stage(Files(str(results)))
    stage = results / FAILING
    for n in (1, 2, 3):
        age(stage / f".attempts/{n}", 30)
    before = every_file(results)
    archived_at = {n: os.stat(stage / f".attempts/{n}").st_mtime for n in (1, 2)}

    out = waypost(tmp_path, "prune", "-n", "--stage", "train_student").stdout
    assert every_file(results) == before                       # a dry run changes nothing
    assert listed(out, "would remove") == []
    # 1 stays whole (a live input in it), 2 and 3 are slimmed: beyond keep_last 2
    # and 30 days old, but in the history; 4 and 5 are the newest 2.
    assert listed(out, "would slim") == [f"{FAILING}/.attempts/2", f"{FAILING}/.attempts/3"]
    lines = {word.split("results/", 1)[1]: line for line in out.splitlines()
             for word in line.split() if "/.attempts/" in word}
    assert lines[f"{FAILING}/.attempts/1"].startswith("keep ")
    assert "an input of results/en-xa/exp1/translate_mono" in lines[f"{FAILING}/.attempts/1"]
    assert "attempt 1's workspace and log in the current manifest" in lines[f"{FAILING}/.attempts/1"]
    assert lines[f"{FAILING}/.attempts/4"].startswith("keep ")
    assert "among the newest 2" in lines[f"{FAILING}/.attempts/4"]
    frees = CHECKPOINT + len(b"step 100\n")
    for n in (2, 3):
        line = lines[f"{FAILING}/.attempts/{n}"]
        assert f"  {prune.human(frees)} of " in line and ", 2 of 4 file(s): " in line
        assert line.endswith(f"and 30 day(s) old (keep_days 10), but attempt {n}'s workspace and log "
                             "in the current manifest: keeps its _logs/ and _manifest.json")
    assert f"would remove 0 archive(s), 0 B; would slim 2, {prune.human(2 * frees)}; kept 3," in out

    real = waypost(tmp_path, "prune", "--stage", "train_student").stdout
    assert listed(real, "slimmed") == [f"{FAILING}/.attempts/2", f"{FAILING}/.attempts/3"]
    assert f"removed 0 archive(s), 0 B; slimmed 2, {prune.human(2 * frees)}; kept 3," in real
    after = every_file(results)
    assert before - after == {f"{FAILING}/.attempts/{n}/{name}" for n in (2, 3)
                              for name in ("checkpoints/last.pt", "notes.txt")}
    for n in (2, 3):
        archive = stage / f".attempts/{n}"
        assert sorted(os.listdir(archive)) == ["_logs", "_manifest.json"]          # empty dirs go too
        assert (archive / f"_logs/attempt-{n}.log").read_text() == f"series {n}: out of memory\n"
        assert manifest.read(str(archive))["attempts"][-1]["number"] == n          # its own record, readable
    assert os.stat(stage / ".attempts/2").st_mtime == archived_at[2]               # its age is the archive's
    assert (stage / ".attempts/1/checkpoints/last.pt").read_bytes() == checkpoint(1)
    assert (stage / ".attempts/4/checkpoints/last.pt").read_bytes() == checkpoint(4)
    for log in history_logs_readable(tmp_path, "results"):
        assert (tmp_path / log).is_file(), log
    attempts = waypost(tmp_path, "status", "--attempts", "train_student", "--pair", "en-xa", "--all-attempts").stdout
    assert "train_student" in attempts and attempts.count("FAILED") >= 6

    # Slimmed already: nothing more to free, not listed as slim again.
    again = waypost(tmp_path, "prune", "-n", "--stage", "train_student").stdout
    assert listed(again, "would slim") == [] and listed(again, "would remove") == []
    assert "would remove 0 archive(s), 0 B; would slim 0, 0 B; kept 5," in again
    assert again.count("slimmed already (only its _logs/ and _manifest.json are left)") == 2
    assert every_file(results) == after

    # Once the history no longer points into them (the stage's manifest now
    # a fresh series'), the slimmed archives are removed whole as any other.
    (stage / "_manifest.json").write_text(json.dumps(record(FAILING, "FAILED", [attempt(6, 6)])))
    out = waypost(tmp_path, "prune", "--stage", "train_student").stdout
    assert listed(out, "removed") == [f"{FAILING}/.attempts/2", f"{FAILING}/.attempts/3"]
    assert "and 30 day(s) old (keep_days 10)" in out


def test_an_archive_with_nothing_the_history_reads_goes_whole(tmp_path):
    """``rerun: new`` archives the workspace but the logs: the history's
    workspace points into the archive, its log into the stage dir."""
    write_config(tmp_path, CONFIG)
    files = Files(str(tmp_path / "results"))
    history = []
    for n in (1, 2, 3):
        files.write(f"{FAILING}/.attempts/{n}/checkpoints/last.pt", checkpoint(n))
        files.write(f"{FAILING}/_logs/attempt-{n}.log", b"log\n")
        history.append({**attempt(n, 1), "workspace": f".attempts/{n}"})
    files.manifest(FAILING, record(FAILING, "FAILED", history))
    out = waypost(tmp_path, "prune", "-n").stdout
    assert listed(out, "would slim") == [f"{FAILING}/.attempts/1"]
    assert f"{prune.human(CHECKPOINT)} of {prune.human(CHECKPOINT)}, 1 of 1 file(s)" in out
    assert "attempt 1's workspace in the current manifest" in out
    real = waypost(tmp_path, "prune").stdout
    assert listed(real, "slimmed") == [f"{FAILING}/.attempts/1"]
    assert not (tmp_path / f"results/{FAILING}/.attempts/1").exists()
    assert (tmp_path / f"results/{FAILING}/.attempts/2/checkpoints/last.pt").exists()
    assert (tmp_path / f"results/{FAILING}/_logs/attempt-1.log").exists()


def test_a_failing_stage_s_archives_are_slimmed_in_a_bucket(bucket, tmp_path):
    root = f"{bucket}/results"
    config = copy.deepcopy(CONFIG)
    config["root"] = root
    write_config(tmp_path, config)
    failing_stage(Files(root))
    before = objects(root)

    out = waypost(tmp_path, "prune", "-n", "--stage", "train_student").stdout
    assert objects(root) == before
    slimmed = [f"{FAILING}/.attempts/2", f"{FAILING}/.attempts/3"]   # 1: a live input; 4 and 5: the newest 2
    assert listed(out, "would slim") == slimmed
    assert "an input of gs://" in out
    frees = CHECKPOINT + len(b"step 100\n")
    assert f"would remove 0 archive(s), 0 B; would slim 2, {prune.human(2 * frees)}; kept 3," in out

    real = waypost(tmp_path, "prune", "--stage", "train_student").stdout
    assert listed(real, "slimmed") == slimmed
    after = objects(root)
    assert before - after == {f"{p}/{name}" for p in slimmed for name in ("checkpoints/last.pt", "notes.txt")}
    assert f"{FAILING}/.attempts/1/checkpoints/last.pt" in after
    for n in (2, 3):
        assert {f"{FAILING}/.attempts/{n}/_logs/attempt-{n}.log", f"{FAILING}/.attempts/{n}/_manifest.json"} <= after
        record_ = json.loads(fs().cat_file(key(f"{root}/{FAILING}/.attempts/{n}/_manifest.json")))
        assert record_["attempts"][-1]["number"] == n
    for log in history_logs_readable(tmp_path, root):
        assert fs().exists(key(log)), log

    again = waypost(tmp_path, "prune", "-n", "--stage", "train_student").stdout
    assert "would slim 0, 0 B; kept 5," in again and again.count("slimmed already") == 2
