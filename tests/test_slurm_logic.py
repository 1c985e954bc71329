"""The pure parts of waypost's Slurm side: a job's command as one word and
back (array tasks included), sacct's array rows, Slurm times and GRES, and
a worker class checked against what scontrol shows."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import zlib

from waypost.runner import bundle
from waypost.runner import main as runner_main
from waypost.scheduler import jobstep, slurm


def test_an_array_task_runs_its_own_step_file_and_the_first_task_the_base_one():
    # As the Slurm plugin builds it: task id → zlib hex of that task's whole
    # exec line; the first task of the array runs the base command.
    files = {str(i): f"/spool/dir with space/step-s-{i}-1.sh" for i in (1, 2, 3)}
    lines = {i: f"/usr/bin/python3 -S /x/jobstep.py {shlex.quote(f)}" for i, f in files.items()}
    payload = base64.b64encode(json.dumps(
        {i: zlib.compress(lines[i].encode(), 9).hex() for i in ("2", "3")}).encode()).decode()
    argv = [files["1"], f"{jobstep.ARRAY_OPTION}{payload}"]
    assert jobstep.step_file_of(argv, "1") == files["1"]
    assert jobstep.step_file_of(argv, "2") == files["2"]
    assert jobstep.step_file_of(argv, "3") == files["3"]
    assert jobstep.step_file_of(argv, None) == files["1"]


def test_an_array_task_finds_its_index_where_its_scheduler_puts_it():
    step = "/spool/step-s-1-1.sh"
    argv = [f"{jobstep.INDEX_OPTION}{slurm.SLURM.array_index_env}", step]
    assert jobstep.array_index(argv, {"SLURM_ARRAY_TASK_ID": "2"}) == "2"
    assert jobstep.array_index(argv, {}) is None and jobstep.step_file_of(argv, None) == step
    assert jobstep.array_index([step], {"SLURM_ARRAY_TASK_ID": "3"}) == "3"   # a job submitted before the option
    assert slurm.SLURM.array_index_in_env({"SLURM_ARRAY_TASK_ID": "4"}) == "4"


def test_a_pending_job_never_starts_only_for_a_reason_no_waiting_clears():
    assert "MaxTime" in slurm.SLURM.never_starts(slurm.Row("PENDING", "PartitionTimeLimit"))
    assert slurm.SLURM.never_starts(slurm.Row("PENDING", "Resources")) is None
    assert slurm.SLURM.never_starts(slurm.Row("RUNNING", "PartitionTimeLimit")) is None
    assert slurm.Row("CANCELLED by 0").ended == "CANCELLED" and slurm.Row("PENDING").ended is None


def test_sacct_rows_of_pending_array_tasks_name_each_task():
    assert slurm.array_tasks("812_[2-4,7]") == ["812_2", "812_3", "812_4", "812_7"]
    assert slurm.array_tasks("812_[1-3%2]") == ["812_1", "812_2", "812_3"]
    assert slurm.array_tasks("812_5") == [] and slurm.array_tasks("812") == []


def test_one_map_of_slurm_states_unknown_never_success_node_failure_is_hardware():
    rows = slurm.parse_sacct("901|901|NODE_FAIL|None\n902|902|CANCELLED by 0|None\n903|903|UNKNOWN|None\n"
                             "904|904|DEADLINE|None\n905_1|906|OUT_OF_MEMORY|None\n907_[2-3]||PENDING|Priority\n"
                             "908|908|COMPLETED|None\n909|909|SOMETHING_NEW|None\n")
    ends = {job: row.ended for job, row in rows.items()}
    assert ends["901"] == "HWFAILURE" and ends["902"] == "CANCELLED" and ends["904"] == "TIMEOUT"
    assert ends["903"] is None                       # UNKNOWN: not an end, never a success
    assert ends["905_1"] == ends["906"] == "OOM" and rows["905_1"].raw == "906"
    assert ends["907_2"] is None and rows["907_3"].reason == "Priority" and rows["907_2"].raw is None
    assert ends["908"] == "SUCCESS" and ends["909"] == "FAILED"   # a state the map does not know fails
    assert rows["901"].reason == ""


def test_slurm_times_in_minutes():
    assert slurm.minutes("UNLIMITED") is None
    assert slurm.minutes("10") == 10
    assert slurm.minutes("1:30:00") == 90
    assert slurm.minutes("05:30") == 5.5
    assert slurm.minutes("2-00:00:00") == 2 * 24 * 60


def test_gres_counts_by_kind_and_model():
    assert slurm._gres("gpu:v100:4(S:0-1),gpu:a100:2") == {"gpu": 6, "gpu:v100": 4, "gpu:a100": 2}
    assert slurm._gres("gpu:2") == {"gpu": 2}
    assert slurm._gres("(null)") == {}


PARTITIONS = """\
PartitionName=cpu AllowGroups=ALL Default=YES MaxTime=UNLIMITED Nodes=vm State=UP TotalCPUs=8
PartitionName=short AllowGroups=ALL Default=NO MaxTime=00:10:00 Nodes=vm State=UP TotalCPUs=8
PartitionName=gpu-v100 AllowGroups=ALL Default=NO MaxTime=1-00:00:00 Nodes=vm State=UP TotalCPUs=8
"""
NODES = ("NodeName=vm Arch=x86_64 CoresPerSocket=8 CPUAlloc=0 CPUTot=8 AvailableFeatures=avx2,ib "
         "ActiveFeatures=avx2,ib Gres=gpu:v100:4(S:0) RealMemory=16000 Partitions=cpu,short,gpu-v100 State=IDLE\n")


def facts() -> dict:
    return {"partitions": {p["PartitionName"]: p for p in slurm._records(PARTITIONS)},
            "nodes": slurm._records(NODES), "accounts": {"lab", "root"}, "qos": {"normal"}}


def test_a_class_the_cluster_can_give_has_no_mismatch():
    assert slurm.class_mismatches({"partition": "gpu-v100", "cpus": 8, "mem_mb": 16000, "runtime": 600,
                                   "gpus": 4, "gpu_model": "v100", "constraint": "avx2&ib", "account": "lab",
                                   "qos": "normal"}, facts()) == []
    assert slurm.class_mismatches({"cpus": 1}, facts()) == []       # the default partition


def test_each_thing_the_cluster_cannot_give_is_named():
    problems = slurm.class_mismatches({"partition": "short", "runtime": 60, "cpus": 16, "mem_mb": 64000,
                                       "gpus": 1, "gpu_model": "a100", "constraint": "avx512",
                                       "account": "physics", "qos": "high"}, facts())
    text = "\n".join(problems)
    assert len(problems) == 7, text
    assert "runtime 60 min: over partition short's MaxTime (10 min)" in text and "PartitionTimeLimit" in text
    assert "cpus 16: no node of partition short has that many (at most 8)" in text
    assert "mem_mb 64000" in text and "at most 16000 MB" in text
    assert "gpus 1 × a100" in text and "constraint 'avx512'" in text and "avx2, ib" in text
    assert "account 'physics'" in text and "qos 'high'" in text
    assert slurm.class_mismatches({"partition": "gpu-a100"}, facts()) == [
        "partition 'gpu-a100': no such partition (the cluster has: cpu, short, gpu-v100)"]


def test_a_step_file_of_any_length_runs_as_a_script(tmp_path):
    # A funnel over thousands of points: far more than the 128 KiB one
    # argument of `bash -c` may hold; the job's command line names a file.
    step = tmp_path / "step.sh"
    step.write_text("set -euo pipefail\necho " + " ".join(f"point{i}" for i in range(30000)) + " | wc -w\n")
    out = subprocess.run([sys.executable, "-S", jobstep.__file__, str(step)], capture_output=True, text=True)
    assert (out.returncode, out.stdout.strip()) == (0, "30000"), out.stderr


def _step_file(path, stage_dir, command: str, **fields) -> None:
    """A stage's step file as waypost's executor writes it (the runner reading its here-document)."""
    from waypost.model import spec
    from waypost.runner import main as runner
    line = spec.encode({"stage": "s", "experiment": "e", "pair": "p", "stage_dir": str(stage_dir),
                        "outputs": [str(stage_dir / "out")], **fields})
    path.write_text(f"exec {shlex.join(runner.command(sys.executable))} <<'{spec.DELIMITER}'\n{line}\n"
                    f"{command}\n{spec.DELIMITER}\n\n")


def test_a_bundle_forks_its_runner_for_each_local_step_and_runs_any_other_file_with_bash(tmp_path):
    # Three stages in one bundle: two are the runner reading its step (run
    # in a fork of the bundle's own process, which imported the runner once),
    # one is another script (bash runs it). Each ends as itself: a failing
    # step is recorded FAILED and the next still runs.
    from conftest import read_manifest
    runner = 'tr "\\0" " " < /proc/$PPID/cmdline; echo'   # the step's runner: the command's parent
    dirs = {name: tmp_path / name for name in ("ok", "bad", "other")}
    for d in dirs.values():
        d.mkdir()
    _step_file(tmp_path / "ok.sh", dirs["ok"], f"{{ {runner}; }} > {dirs['ok']}/out; echo \"$WAYPOST_BUNDLED\" >> {dirs['ok']}/out")
    _step_file(tmp_path / "bad.sh", dirs["bad"], "echo trying; exit 3")
    (tmp_path / "other.sh").write_text(f"echo plain > {dirs['other']}/out\n")
    listing = tmp_path / "bundle.list"
    listing.write_text("".join(f"{tmp_path / n}.sh\t{tmp_path / n}.status\n" for n in ("bad", "ok", "other")))
    proc = subprocess.run([*runner_main.command(sys.executable), bundle.BUNDLE_OPTION, str(listing)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {n: (tmp_path / f"{n}.status").read_text() for n in dirs} == {"ok": "0\n", "bad": "3\n", "other": "0\n"}
    assert read_manifest(dirs["ok"])["state"] == "SUCCESS" and read_manifest(dirs["bad"])["state"] == "FAILED"
    ran_by, bundled = (dirs["ok"] / "out").read_text().splitlines()
    # the step's runner is a fork of the bundle: its command line is the bundle's, not launch.py's
    assert bundle.BUNDLE_OPTION in ran_by, ran_by   # (a runner started alone: `python -S launch.py`)
    assert bundled == "1"
    assert (dirs["other"] / "out").read_text() == "plain\n"


def test_a_signal_to_a_bundle_ends_its_forked_step_as_the_runner_records_it_and_starts_no_more(tmp_path):
    import signal
    import time

    from conftest import read_manifest
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    _step_file(tmp_path / "first.sh", first, f"touch {first}/started; sleep 60")
    _step_file(tmp_path / "second.sh", second, f"touch {second}/out")
    listing = tmp_path / "bundle.list"
    listing.write_text("".join(f"{tmp_path / n}.sh\t{tmp_path / n}.status\n" for n in ("first", "second")))
    proc = subprocess.Popen([*runner_main.command(sys.executable), bundle.BUNDLE_OPTION, str(listing)],
                              stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (first / "started").exists():
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    record = read_manifest(first)
    assert record["state"] != "SUCCESS" and record["attempts"][0]["state"] != "SUCCESS", record
    assert not os.path.exists(tmp_path / "second.status") and not (second / "out").exists()


def test_a_bundle_forks_only_for_its_own_interpreter_and_runner_however_spelt(tmp_path):
    from waypost.model import spec
    from waypost.runner import main as runner
    ours = runner.command(sys.executable)
    python, launch = ours[0], ours[-1]
    spelt = os.path.join(os.path.dirname(python), "..", os.path.basename(os.path.dirname(python)),
                         os.path.basename(python))

    def head(*words):
        return f"exec {shlex.join(words)} <<'{spec.DELIMITER}'"
    assert bundle._runs_this_runner(head(spelt, "-S", launch), ours, spec.DELIMITER)
    assert not bundle._runs_this_runner(head(python, "-S", str(tmp_path / "launch.py")), ours, spec.DELIMITER)
    assert not bundle._runs_this_runner(head(python, launch), ours, spec.DELIMITER)              # with site
    assert not bundle._runs_this_runner(head(python, "-S", launch).replace("exec ", ""), ours, spec.DELIMITER)
    assert not bundle._runs_this_runner(head(python, "-S", launch) + " extra", ours, spec.DELIMITER)
