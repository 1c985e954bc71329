"""Stage jobs on a real Slurm cluster (scripts/slurm-dev-cluster.sh) as the
HPC half of our users runs them: the step runner straight in the job, packed
classes as job arrays, jobs that can never start, every end in the manifest,
and no futile resubmission. Facts are read from sacct, not from waypost's
own records."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, finish, read_manifest

from waypost.model import manifest

ONPREM = REPO / "profiles" / "onprem"
FAST = ["--waypost-init-seconds-before-status-checks", "1", "--latency-wait", "5", "--waypost-no-account"]

# One stage with an instance per point, a consumer per point, and a funnel
# over both; what each point's step does is in the config.
SNAKEFILE = '''
from waypost.snakemake import Pipeline

wp = Pipeline(config, workflow)


def points(experiment):
    return list(config["experiments"][experiment]["points"])


rule work:
    output: out=wp.out("out.txt", instances=points)
    params: how=lambda wc: config["experiments"][wc.experiment]["points"][wc.instance]
    resources: worker="small"
    shell: "python3 {workflow.basedir}/step.py {params.how} {output.out}"


rule use:
    input: work=wp.stage("work", "out.txt")
    output: out=wp.out("used.txt", instances=points)
    resources: worker="small"
    shell: "cp {input.work} {output.out}"


rule summary:
    input: work=wp.each("work", "out.txt")
    output: out=wp.out("summary.txt", funnel=True)
    resources: worker="small"
    shell: "cat {input.work} > {output.out}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''

# A step: "sleep:N" works N half-seconds with a checkpoint after each (and
# resumes from it), "gated:N" too, then waits until the test opens the gate
# (workflow/gate): it can't end before the test has done what it does to it;
# "fail" exits 1, "alloc:MB" holds that much memory.
STEP = '''
import os, sys, time
how, out = sys.argv[1], sys.argv[2]
gate = how.startswith("gated:")
how = how.replace("gated:", "sleep:")
ckpt = os.path.join(os.environ["WAYPOST_STAGE_DIR"], "ckpt")
if how == "fail":
    sys.exit("this step always fails")
if how.startswith("alloc:"):
    block = bytearray(int(how[6:]) * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(1)
    how = "sleep:1"
done = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
if done:
    print(f"resuming from step {done}", flush=True)
for i in range(done, int(how[6:])):
    time.sleep(0.5)
    with open(ckpt + ".tmp", "w") as f:
        f.write(str(i + 1))
    os.replace(ckpt + ".tmp", ckpt)
while gate and not os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gate")):
    time.sleep(0.2)
open(out, "w").write(how + "\\n")
'''

RESTART = {"max_attempts": 3, "cues": [{"action": "restart", "when": "any(cmd.TIMEOUT, cmd.PREEMPTED)"}]}


def pipeline(tmp_path: Path, points: dict, small: dict, stages: dict | None = None) -> Path:
    (tmp_path / "workflow").mkdir()
    (tmp_path / "workflow" / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "workflow" / "step.py").write_text(STEP)
    (tmp_path / "workflow" / "schemas").mkdir()
    (tmp_path / "workflow" / "schemas" / "config.schema.yaml").write_text(yaml.safe_dump({"properties": {
        "experiments": {"additionalProperties": {"properties": {"points": {"type": "object"}}}}}}))
    (tmp_path / "config").mkdir()
    pools = {"pools": {"onprem": {"executor": "slurm", "classes": {
        "small": {"partition": "cpu", "cpus": 1, "mem_mb": 200, "runtime": 10, **small}}}}}
    (tmp_path / "config" / "workers.yaml").write_text(yaml.safe_dump(pools))
    config = {"experiments": {"e": {"points": points}}, "stages": {"summary": {"policy": {"depends": "all_done"}},
                                                                     **(stages or {})}}
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def start(workdir: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile", str(ONPREM), *FAST, *args]
    return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def sacct(*fields: str, since: float, workdir: Path, jobs: int | None = None, ended: bool = True) -> list[dict]:
    """Every job (array tasks one by one) of a run in ``workdir`` since
    ``since``, as sacct says, once it says it: slurmdbd lags slurmctld by a
    moment, so ask until ``jobs`` rows (when given) are there and, with
    ``ended``, all ended."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 1))
    deadline = time.time() + 60
    while True:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-S", start, "-o", ",".join(("State", *fields, "WorkDir"))],
                             capture_output=True, text=True, check=True).stdout
        rows = [line.split("|")[:-1] for line in out.splitlines() if line.endswith(f"|{workdir}")]
        settled = (jobs is None or len(rows) >= jobs) and (not ended or not any(
            row[0].split()[0] in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED") for row in rows))
        if settled or time.time() > deadline:
            return [dict(zip(fields, row[1:])) for row in rows]
        time.sleep(0.5)


def stage(workdir: Path, name: str, instance: str | None = None) -> Path:
    path = workdir / "results" / "_all" / "e" / name
    return path / instance if instance else path


def running_job(stage_dir: Path) -> str | None:
    """The Slurm job of the attempt at work in a stage dir, once it saved a checkpoint."""
    try:
        return json.loads((stage_dir / "_running.json").read_text())["scheduler_job_id"] \
            if (stage_dir / "ckpt").exists() else None
    except (OSError, ValueError, KeyError):
        return None


def test_stage_jobs_run_the_step_runner_without_snakemake(slurm_cluster, tmp_path):
    workdir = pipeline(tmp_path, {"a": "sleep:1", "b": "sleep:1"}, {})
    since = time.time()
    code, out = finish(start(workdir), timeout=300)
    assert code == 0, out[-5000:]
    jobs = sacct("JobIDRaw", "Comment", "State", since=since, workdir=workdir, jobs=5)
    assert len(jobs) == 5 and {j["State"] for j in jobs} == {"COMPLETED"}, jobs
    for job in jobs:       # what each job ran: waypost's jobstep, no `python -m snakemake`
        script = subprocess.run(["scontrol", "write", "batch_script", job["JobIDRaw"], "-"],
                                capture_output=True, text=True).stdout
        if script:
            assert "jobstep.py" in script and "-m snakemake" not in script, script
    for point in ("a", "b"):
        assert read_manifest(stage(workdir, "work", point))["attempts"][0]["scheduler_job_id"]
    done = subprocess.run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile", str(ONPREM),
                           "-n", *FAST], cwd=workdir, capture_output=True, text=True)
    assert "Nothing to be done" in done.stdout + done.stderr


def test_a_packed_class_is_one_array_and_its_timeout_and_preemption_are_retried_alone(slurm_cluster, tmp_path):
    # Four points packed into one array, each task 2 of the node's 8 CPUs:
    # the node is full, so an urgent job preempts one task; another is made
    # to run out of time. Each restarts from its own checkpoint, alone.
    # Each waits at its gate once it has worked (and checkpointed): no task
    # can end before the test has preempted one and timed out another; the
    # test waits on states (sacct, checkpoints), never on a step's pace.
    points = {p: "gated:2" for p in ("a", "b", "c", "d")}
    workdir = pipeline(tmp_path, points, {"cpus": 2, "pack": 4},
                       stages={"work": {"policy": RESTART}})
    since = time.time()
    proc = start(workdir, "--until", "work")
    jobs = wait_for(lambda: (lambda found: found if len(found) == 4 else None)(
        {p: running_job(stage(workdir, "work", p)) for p in points if running_job(stage(workdir, "work", p))}),
        120, "the four tasks at work")
    arrays = wait_for(lambda: (lambda found: found if set(jobs.values()) <= set(found) else None)(
        {row["JobIDRaw"]: row["JobID"] for row in sacct("JobIDRaw", "JobID", since=since, workdir=workdir, ended=False)}),
        30, "sacct to know the four tasks")
    assert len({arrays[j].split("_")[0] for j in jobs.values()}) == 1, arrays     # one array
    urgent = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-D", str(workdir), "-p", "urgent", "-c", "2", "--mem", "100",
                             "--wrap", "sleep 2"], capture_output=True, text=True, check=True).stdout.strip()

    def ended(state: str) -> list[str]:
        rows = sacct("JobIDRaw", "State", since=since, workdir=workdir, ended=False)
        return [p for p, j in jobs.items() if any(r["JobIDRaw"] == j and r["State"] == state for r in rows)]
    preempted = wait_for(lambda: ended("PREEMPTED"), 60, "a preemption")
    assert len(preempted) == 1
    timed_out = next(p for p in points if p not in preempted)
    subprocess.run(["scontrol", "update", f"jobid={arrays[jobs[timed_out]]}", "timelimit=0"], check=True)
    wait_for(lambda: timed_out in ended("TIMEOUT"), 120, "the time limit")
    (workdir / "workflow" / "gate").touch()
    code, out = finish(proc, timeout=300)
    assert code == 0, out[-5000:]
    states = {r["JobIDRaw"]: r["State"].split()[0] for r in sacct("JobIDRaw", "State", since=since, workdir=workdir)}
    assert states[jobs[preempted[0]]] == "PREEMPTED" and states[jobs[timed_out]] == "TIMEOUT"
    assert states[urgent] == "COMPLETED"
    for point in points:
        record = read_manifest(stage(workdir, "work", point))
        steps = [(a["action"], a["state"]) for a in record["attempts"]]
        if point == timed_out:
            assert steps == [("cmd", "TIMEOUT"), ("restart", "SUCCESS")], steps
        elif point == preempted[0]:
            assert steps == [("cmd", "PREEMPTED"), ("restart", "SUCCESS")], steps
        else:
            assert steps == [("cmd", "SUCCESS")], (point, steps)
        if len(steps) == 2:   # resumed in place, in a job of its own
            log = (stage(workdir, "work", point) / record["attempts"][1]["log"]).read_text()
            assert "resuming from step" in log
            retry = record["attempts"][1]["scheduler_job_id"]
            known = wait_for(lambda retry=retry: {r["JobIDRaw"]: r["JobID"] for r in sacct(
                "JobIDRaw", "JobID", since=since, workdir=workdir)}.get(retry), 60, "sacct to know the retry")
            assert retry != jobs[point] and "_" not in known


def test_a_bundled_class_runs_its_stages_in_one_job_each_with_its_own_end(slurm_cluster, tmp_path):
    # Four points bundled (`bundle: 4`): one Slurm job runs their steps in
    # turn, each with its own runner: one succeeds, one fails, one runs over
    # its own time limit (its runner ends it: the job's limit is the
    # bundle's), and each is recorded as itself; what needs the good ones
    # goes on, the funnel over all of them too.
    points = {"p1": "sleep:1", "p2": "fail", "p3": "sleep:30", "p4": "sleep:1"}
    workdir = pipeline(tmp_path, points, {"bundle": 4},
                       stages={"work": {"policy": {"max_attempts": 1, "runtime": 0.05}}})
    since = time.time()
    code, out = finish(start(workdir), timeout=300)
    assert code != 0, out[-5000:]                        # two points did not succeed
    records = {p: read_manifest(stage(workdir, "work", p)) for p in points}
    assert {p: r["state"] for p, r in records.items()} == {"p1": "SUCCESS", "p2": "FAILED", "p3": "TIMEOUT",
                                                            "p4": "SUCCESS"}, out[-5000:]
    jobs = {r["attempts"][0]["scheduler_job_id"] for r in records.values()}
    assert len(jobs) == 1, records                        # one Slurm job ran all four
    assert {p for p in points if stage(workdir, "use", p).joinpath("used.txt").exists()} == {"p1", "p4"}
    assert (stage(workdir, "summary") / "summary.txt").read_text().splitlines() == ["sleep:1", "sleep:1"]
    (job,) = jobs
    states = {r["JobIDRaw"]: r["State"] for r in sacct("JobIDRaw", "State", since=since, workdir=workdir)}
    assert states[job] == "COMPLETED", states             # the bundle itself ended well
    # its time limit is the four stages' together (1 minute: 4 × 0.05, rounded up)
    limit = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "TimelimitRaw"], capture_output=True,
                           text=True, check=True).stdout.split()[0]
    assert limit == "1", limit


def test_a_job_slurm_can_never_start_ends_with_its_reason(slurm_cluster, tmp_path):
    # `short` allows 10 minutes; the class asks for 60: PartitionTimeLimit.
    workdir = pipeline(tmp_path, {"a": "sleep:1"}, {"partition": "short", "runtime": 60})
    check = subprocess.run([sys.executable, "-m", "waypost.cli", "workers", "--check", "--pool", "onprem"],
                           cwd=workdir, capture_output=True, text=True)
    assert check.returncode == 1 and "runtime 60 min: over partition short's MaxTime (10 min)" in check.stdout
    since = time.time()
    code, _ = finish(start(workdir, "--until", "work"), timeout=120)
    assert code != 0
    jobs = sacct("JobIDRaw", "State", "Reason", since=since, workdir=workdir, jobs=1)
    assert len(jobs) == 1 and jobs[0]["State"].startswith("CANCELLED"), jobs     # one job, not resubmitted
    record = read_manifest(stage(workdir, "work", "a"))
    assert record["state"] == "CANCELLED" and "PartitionTimeLimit" in record["reason"]
    assert record["attempts"][0]["scheduler_job_id"] == jobs[0]["JobIDRaw"]
    shown = subprocess.run([sys.executable, "-m", "waypost.cli", "status", "--attempts", "work"], cwd=workdir,
                           capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "PartitionTimeLimit" in shown and "cancelled" in shown


def test_a_class_too_small_is_recorded_oom_and_rerun_with_more_memory(slurm_cluster, tmp_path):
    policy = {"max_attempts": 2, "memory_growth": 4, "cues": [{"action": "rerun", "when": "cmd.OOM"}]}
    workdir = pipeline(tmp_path, {"a": "alloc:300"}, {"mem_mb": 100}, stages={"work": {"policy": policy}})
    since = time.time()
    code, out = finish(start(workdir, "--until", "work"), timeout=300)
    assert code == 0, out[-5000:]
    record = read_manifest(stage(workdir, "work", "a"))
    assert [(a["action"], a["state"]) for a in record["attempts"]] == [("cmd", "OOM"), ("rerun", "SUCCESS")]
    asked = {r["JobIDRaw"]: r["ReqMem"] for r in sacct("JobIDRaw", "ReqMem", since=since, workdir=workdir, jobs=2)}
    first, second = (a["scheduler_job_id"] for a in record["attempts"])
    assert asked[first] == "100M" and asked[second] == "400M", asked


def test_a_consumer_of_a_failed_stage_is_one_slurm_job_not_four(slurm_cluster, tmp_path):
    # `work` fails for good (a funnel goes on over it); `use` needs it and is
    # recorded SKIPPED once: the profile's retries don't submit it again.
    workdir = pipeline(tmp_path, {"a": "fail"}, {})
    since = time.time()
    code, _ = finish(start(workdir), timeout=300)
    assert code != 0
    jobs = sacct("JobIDRaw", "Comment", "State", since=since, workdir=workdir, jobs=3)      # work, use, summary
    by_rule = {rule: [j for j in jobs if j["Comment"].startswith(f"rule_{rule}")] for rule in ("work", "use")}
    assert len(by_rule["work"]) == 1 and len(by_rule["use"]) == 1, jobs
    assert read_manifest(stage(workdir, "work", "a"))["state"] == "FAILED"
    assert read_manifest(stage(workdir, "use", "a"))["state"] == "SKIPPED"
    assert read_manifest(stage(workdir, "summary"))["state"] == "SUCCESS"


def test_a_funnel_over_ten_thousand_inputs_runs_on_slurm_from_its_step_file(slurm_cluster, tmp_path):
    # The job's command line names a step file: neither sbatch's arguments
    # nor the job's carry the command (300 KB of paths here).
    from test_shell_semantics import check_long_funnel, long_funnel
    names = long_funnel(tmp_path, 10_000)
    pools = {"pools": {"onprem": {"executor": "slurm", "classes": {
        "cpu": {"partition": "cpu", "cpus": 1, "mem_mb": 200, "runtime": 10}}}}}
    (tmp_path / "config" / "workers.yaml").write_text(yaml.safe_dump(pools))
    since = time.time()
    code, out = finish(start(tmp_path), timeout=300)
    assert code == 0, out[-5000:]
    data = check_long_funnel(tmp_path, names)
    (job,) = sacct("JobIDRaw", since=since, workdir=tmp_path, jobs=1)
    assert data["attempts"][0]["scheduler_job_id"] == job["JobIDRaw"]
    script = subprocess.run(["scontrol", "write", "batch_script", job["JobIDRaw"], "-"],
                            capture_output=True, text=True).stdout
    assert "jobstep.py" in script and len(script) < 4096 and names[0] not in script, script[:2000]


def _work_jobs(since: float, workdir: Path) -> list[str]:
    """The Slurm jobs (raw ids; an array's tasks each) runs in ``workdir``
    submitted for stage `work` (an array's comment is its first task's)."""
    rows = sacct("JobIDRaw", "Comment", since=since, workdir=workdir, ended=False)
    return sorted(r["JobIDRaw"] for r in rows if r["Comment"].startswith("rule_work_"))


@pytest.mark.parametrize("packed", [False, True], ids=["one job", "packed array task"])
def test_a_dead_drivers_job_is_adopted_never_doubled(slurm_cluster, tmp_path, packed):
    # The driver is SIGKILLed while a point runs in Slurm (a login node
    # rebooting); its job goes on. Cron runs at once: it waits for that job
    # as if it had submitted it, submits no second one for the point, and
    # the pipeline converges on the first job's result.
    points = {"a": "gated:2", "b": "gated:2"}
    workdir = pipeline(tmp_path, points, {"pack": 2} if packed else {})
    since = time.time()
    driver = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                               str(ONPREM), *FAST], cwd=workdir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    jobs = wait_for(lambda: (lambda found: found if len(found) == 2 else None)(
        {p: running_job(stage(workdir, "work", p)) for p in points if running_job(stage(workdir, "work", p))}),
        120, "both points at work")
    os.killpg(driver.pid, 9)
    driver.wait(timeout=30)
    queued = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True).stdout.split()
    assert set(jobs.values()) <= set(queued), (jobs, queued)     # Slurm's jobs live on

    cron = subprocess.Popen([sys.executable, "-m", "waypost.cli", "cron", "--profile", str(ONPREM), "--", *FAST],
                            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def adopting() -> bool:
        logs = sorted((workdir / ".waypost" / "runs").glob("*.log"))
        return bool(logs) and logs[-1].read_text().count("of an earlier run is still at work there") == 2
    wait_for(adopting, 120, "cron's run to adopt both jobs")
    (workdir / "workflow" / "gate").touch()
    out, _ = cron.communicate(timeout=300)
    assert cron.returncode == 0, out
    assert _work_jobs(since, workdir) == sorted(jobs.values())      # one Slurm job per stage, ever
    for point, job in jobs.items():
        record = read_manifest(stage(workdir, "work", point))
        assert [(a["state"], a["scheduler_job_id"]) for a in record["attempts"]] == [("SUCCESS", job)]
        assert not (stage(workdir, "work", point) / ".attempts").exists()   # nothing archived under it
    assert read_manifest(stage(workdir, "summary"))["state"] == "SUCCESS"
    again = subprocess.run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                            str(ONPREM), *FAST, "-n"], cwd=workdir, capture_output=True, text=True)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_node_failure_is_recorded_hwfailure_and_rerun_per_the_policy(slurm_cluster, tmp_path):
    # The node goes down under a running job (NODE_FAIL), then comes back.
    policy = {"max_attempts": 3, "cues": [{"action": "rerun", "when": "cmd.HWFAILURE"}]}
    workdir = pipeline(tmp_path, {"a": "gated:2"}, {}, stages={"work": {"policy": policy}})
    node = subprocess.run(["sinfo", "-h", "-p", "cpu", "-o", "%N"], capture_output=True, text=True, check=True).stdout.strip()
    since = time.time()
    proc = start(workdir, "--until", "work")
    try:
        try:
            job = wait_for(lambda: running_job(stage(workdir, "work", "a")), 120, "point a at work")
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=waypost-test"],
                           check=True)
            wait_for(lambda: any(r["JobIDRaw"] == job and r["State"] == "NODE_FAIL"
                                 for r in sacct("JobIDRaw", "State", since=since, workdir=workdir, ended=False)),
                     60, "Slurm to say NODE_FAIL")
        finally:   # (back up by itself already, ReturnToService=2: fine)
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
        (workdir / "workflow" / "gate").touch()
        code, out = finish(proc, timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out[-5000:]
    record = read_manifest(stage(workdir, "work", "a"))
    steps = [(a["action"], a["state"], a["scheduler_job_id"]) for a in record["attempts"]]
    assert steps[0] == ("cmd", "HWFAILURE", job) and steps[-1][:2] == ("rerun", "SUCCESS"), steps
    assert "NODE_FAIL" in record["attempts"][0]["error"]        # Slurm's word is kept
    assert record["state"] == "SUCCESS"


def test_slurmctld_stopped_and_started_mid_run_is_unknown_never_gone(slurm_cluster, tmp_path):
    # slurmctld goes away for a while as the points run: running jobs live on,
    # the run waits (unknown is never gone), and converges once it is back:
    # one job per point, one attempt each.
    points = {"a": "gated:2", "b": "gated:2"}
    workdir = pipeline(tmp_path, points, {})
    since = time.time()
    proc = start(workdir)
    jobs = wait_for(lambda: (lambda found: found if len(found) == 2 else None)(
        {p: running_job(stage(workdir, "work", p)) for p in points if running_job(stage(workdir, "work", p))}),
        120, "both points at work")
    restart = subprocess.run(["bash", str(REPO / "scripts" / "slurm-dev-cluster.sh"), "restart", "slurmctld"],
                             capture_output=True, text=True, env={**os.environ, "WAYPOST_SLURM_DOWN_SECONDS": "8"})
    assert restart.returncode == 0, restart.stdout + restart.stderr
    assert proc.poll() is None                                   # the run waited through it
    (workdir / "workflow" / "gate").touch()
    code, out = finish(proc, timeout=300)
    assert code == 0, out[-5000:]
    assert _work_jobs(since, workdir) == sorted(jobs.values())
    for point, job in jobs.items():
        record = read_manifest(stage(workdir, "work", point))
        assert [(a["state"], a["scheduler_job_id"]) for a in record["attempts"]] == [("SUCCESS", job)]
    assert read_manifest(stage(workdir, "summary"))["state"] == "SUCCESS"


SOAK_POINTS = 10
SOAK_FAULTS = ("scancel", "node down", "driver kill", "slurmctld restart")


def _soak_invariants(workdir: Path, since: float, figures: dict) -> None:
    """What must hold after every cron, whatever was done to the run."""
    rows = sacct("JobIDRaw", "Comment", "Start", "End", "State", since=since, workdir=workdir, ended=False)
    by_point: dict[str, list[dict]] = {}
    for row in rows:
        if row["Comment"].startswith("rule_work_wildcards_e_"):
            by_point.setdefault(row["Comment"].rsplit("_", 1)[1], []).append(row)
    for point, jobs in by_point.items():
        # Never two live attempts in one directory: its jobs' running spans never overlap.
        spans = sorted((j["Start"], j["End"] if j["End"] not in ("Unknown", "") else "9999")
                       for j in jobs if j["Start"] not in ("Unknown", "None", ""))
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"two jobs of work/{point} ran at once: {jobs}"
        directory = stage(workdir, "work", point)
        # Never an archive of a live attempt: every archived running record's job had ended.
        for archived in directory.glob(".attempts/*/_running.json"):
            job = json.loads(archived.read_text()).get("scheduler_job_id")
            live = [j for j in jobs if j["JobIDRaw"] == str(job) and j["State"] in ("RUNNING", "PENDING")]
            assert not live, f"{archived} was archived while its job {job} was at work"
        data = read_manifest(directory) if (directory / "_manifest.json").exists() else None
        if data and data["state"] == "SUCCESS":
            # Every SUCCESS with its outputs present and their checksums matching.
            assert manifest.verify_outputs(str(directory), data) == [], directory
    figures["jobs"] = sum(len(j) for j in by_point.values())


def _soak_converged(workdir: Path, since: float, points) -> int:
    """Every point SUCCESS, and each of its Slurm jobs an attempt in its
    manifest or in one `waypost rerun` archived; the final manifests' attempts."""
    rows = sacct("JobIDRaw", "Comment", since=since, workdir=workdir)
    attempts = 0
    for point in points:
        data = read_manifest(stage(workdir, "work", point))
        assert data["state"] == "SUCCESS", (point, data["attempts"])
        records = [data, *(json.loads(m.read_text()) for m in stage(workdir, "work", point).glob(
            ".attempts/*/_manifest.json"))]
        recorded = {str(a.get("scheduler_job_id")) for r in records for a in r["attempts"]}
        jobs = {r["JobIDRaw"] for r in rows if r["Comment"] == f"rule_work_wildcards_e_{point}"}
        assert jobs <= recorded, f"work/{point}: Slurm jobs {sorted(jobs - recorded)} are in no attempt of its manifest"
        attempts += len(data["attempts"])
    return attempts


def test_soak_on_slurm_with_random_faults_keeps_its_invariants_and_converges(slurm_cluster, tmp_path):
    # Crons run one after another; into each a seeded fault comes while its
    # points run: a job scancelled, the node down then back, the driver
    # SIGKILLed (the next cron starts at once), slurmctld restarted. After
    # every cron the invariants hold; in the end every point is done and
    # every one of its Slurm jobs is in its manifest's attempts.
    import random
    rng = random.Random(28)
    points = {f"p{i}": "sleep:6" for i in range(SOAK_POINTS)}
    policy = {"max_attempts": 4, "max_series": 8,
              "cues": [{"action": "restart", "when": "any(cmd.TIMEOUT, cmd.PREEMPTED, cmd.HWFAILURE, cmd.CANCELLED)"}]}
    workdir = pipeline(tmp_path, points, {}, stages={"work": {"policy": policy}})
    node = subprocess.run(["sinfo", "-h", "-p", "cpu", "-o", "%N"], capture_output=True, text=True, check=True).stdout.strip()
    cron_cmd = [sys.executable, "-m", "waypost.cli", "cron", "--profile", str(ONPREM), "--", *FAST]
    since, figures, faults = time.time(), {}, []
    for round_no in range(len(SOAK_FAULTS) * 2):
        fault = SOAK_FAULTS[round_no % len(SOAK_FAULTS)]
        if round_no:   # some points to do again, so the cron has work to be hit in (refused where one is at work)
            again = [arg for p in rng.sample(sorted(points), 4) for arg in ("--instance", p)]
            subprocess.run([sys.executable, "-m", "waypost.cli", "rerun", "work", *again], cwd=workdir,
                           capture_output=True, text=True)
        run = subprocess.Popen(cron_cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
        try:
            at_work = wait_for(lambda run=run: [p for p in points if running_job(stage(workdir, "work", p))] or
                               (run.poll() is not None and ["(none)"]), 120, "a point at work")
            time.sleep(rng.uniform(0, 1.5))
            if at_work != ["(none)"] and run.poll() is None:
                faults.append(fault)
                job = running_job(stage(workdir, "work", rng.choice(at_work)))
                if fault == "scancel" and job:
                    subprocess.run(["scancel", job])
                elif fault == "node down":
                    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=soak"])
                    time.sleep(2)
                    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
                elif fault == "driver kill":
                    os.killpg(run.pid, 9)
                elif fault == "slurmctld restart":
                    subprocess.run(["bash", str(REPO / "scripts" / "slurm-dev-cluster.sh"), "restart", "slurmctld"],
                                   capture_output=True, env={**os.environ, "WAYPOST_SLURM_DOWN_SECONDS": "3"})
            run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, 9)
                run.communicate()
        _soak_invariants(workdir, since, figures)
    # No more faults: crons until one has nothing to do.
    calm = 0
    while True:
        calm += 1
        assert calm <= 8, "the soak did not converge"
        out = subprocess.run(cron_cmd, cwd=workdir, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        _soak_invariants(workdir, since, figures)
        if json.loads((workdir / ".waypost" / "cron.log").read_text().splitlines()[-1])["nothing_to_do"]:
            break
    attempts = _soak_converged(workdir, since, points)
    assert read_manifest(stage(workdir, "summary"))["state"] == "SUCCESS"
    summary = {"points": SOAK_POINTS, "faults": faults, "slurm_jobs_of_work": figures["jobs"],
               "attempts": attempts, "calm_crons": calm}
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "soak-slurm.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("soak on slurm:", summary)


def test_the_first_status_round_comes_at_the_profiles_pace_not_snakemakes_ten_seconds(slurm_cluster, tmp_path):
    # The status rounds start while nothing is submitted yet: those empty
    # rounds, and the first one that finds its jobs still at work, keep the
    # profile's pace (`init-seconds-before-status-checks`, 1 s here), never
    # Snakemake's own default of 10 s between checks. So a point's consumer
    # is submitted within moments of the point's Slurm job ending.
    workdir = pipeline(tmp_path, {"k7": "sleep:2"}, {})
    since = time.time()
    code, out = finish(start(workdir), timeout=300)
    assert code == 0, out[-5000:]
    rows = sacct("JobIDRaw", "Submit", "Start", "End", since=since, workdir=workdir, jobs=3)
    assert len(rows) == 3, rows
    ordered = sorted(rows, key=lambda r: (r["Submit"], int(r["JobIDRaw"])))
    hop = (time.mktime(time.strptime(ordered[1]["Submit"], "%Y-%m-%dT%H:%M:%S"))
           - time.mktime(time.strptime(ordered[0]["End"], "%Y-%m-%dT%H:%M:%S")))
    assert hop <= 3, (hop, ordered)   # sacct's times are whole seconds
