"""A cluster, not a node: faults where they happen on a real deployment.

The local cluster's nodes of their own (scripts/slurm-dev-node.sh: each its
own hostname, mounts, processes and slurmd) are compute nodes (partition
`compute`), cloud nodes that Slurm boots on demand and removes when idle
(`cloud-cpu`, `cloud-gpu`, State=CLOUD) and a login node for the driver
and its cron. A node taken away is its namespaces killed, with everything
it ran, as a machine lost. Facts are read from Slurm, not from waypost's
own records."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SMALL_CONFIG, SNAKEFILE, finish, gcs_fs, gcs_key, read_manifest, write_config
from test_slurm_jobs import FAST, ONPREM, pipeline, running_job, sacct, stage, wait_for

NODE_SCRIPT = REPO / "scripts" / "slurm-dev-node.sh"
SLURM_DIR = Path(os.environ.get("WAYPOST_SLURM_DIR", "/var/lib/waypost-slurm"))
LOGIN = "wp-login"
CLOUD = REPO / "profiles" / "cloud"
CLOUD_NODES = "wp-c[1-2],wp-g[1-2]"


def node(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(NODE_SCRIPT), *args], capture_output=True, text=True, **kwargs)


def on(name: str, cmd: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    """``cmd`` on node ``name``: its hostname, its mounts, its processes."""
    return subprocess.Popen(["bash", str(NODE_SCRIPT), "on", name, *cmd], cwd=cwd, text=True, **kwargs)


def node_state(name: str) -> str:
    return subprocess.run(["sinfo", "-h", "-N", "-n", name, "-o", "%T"], capture_output=True,
                          text=True).stdout.strip()


def node_of(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True).stdout.strip()


def lose(name: str) -> None:
    """A node lost under its jobs: its namespaces killed with all it ran, and
    the controller told at once (as a health check, or Slurm-GCP on a spot
    preemption, does; slurmctld would find it unresponsive after
    SlurmdTimeout anyway)."""
    assert node("kill", name).returncode == 0
    subprocess.run(["scontrol", "update", f"nodename={name}", "state=down", "reason=lost-in-test"], check=True)


def bring_back(name: str) -> None:
    """A lost compute node booted again and taking jobs."""
    assert node("start", name).returncode == 0
    subprocess.run(["scontrol", "update", f"nodename={name}", "state=resume"], capture_output=True)
    wait_for(lambda: node_state(name) in ("idle", "mixed", "allocated"), 60, f"{name} back")


@pytest.fixture(scope="module")
def nodes(slurm_cluster) -> list[str]:
    """The compute nodes of their own, each up."""
    names = subprocess.run(["sinfo", "-h", "-N", "-p", "compute", "-o", "%N"], capture_output=True,
                           text=True).stdout.split()
    if not names or node("up", LOGIN).returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: the cluster must have nodes of their own (namespaces), but has none")
        pytest.skip("the local cluster has no nodes of their own here (root can't make namespaces)")
    for name in names:
        if node_state(name) not in ("idle", "mixed", "allocated"):
            bring_back(name)
    return sorted(set(names))


def _at_work(workdir: Path, points: dict) -> dict | None:
    found = {p: running_job(stage(workdir, "work", p)) for p in points}
    return found if all(found.values()) else None


def test_one_node_lost_under_its_job_fails_only_that_job_and_the_others_finish(nodes, tmp_path):
    # A point per node (each job takes a node's 4 CPUs); one node is lost
    # while all run. Its job alone is NODE_FAIL, recorded HWFAILURE; the
    # stage's cue reruns it on a node still up; the other points' jobs
    # finish where they ran, one attempt each.
    points = {f"p{i}": "gated:2" for i in range(len(nodes))}
    policy = {"max_attempts": 3, "cues": [{"action": "rerun", "when": "cmd.HWFAILURE"}]}
    workdir = pipeline(tmp_path, points, {"partition": "compute", "cpus": 4}, stages={"work": {"policy": policy}})
    since = time.time()
    driver = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                               str(ONPREM), *FAST, "--until", "work"], cwd=workdir, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    victim = None
    try:
        jobs = wait_for(lambda: _at_work(workdir, points), 180, "every point at work")
        placed = {p: node_of(job) for p, job in jobs.items()}
        assert sorted(placed.values()) == nodes, placed            # one point on each node
        lost_point = sorted(points)[1]
        victim = placed[lost_point]
        lose(victim)
        wait_for(lambda: any(r["JobIDRaw"] == jobs[lost_point] and r["State"] == "NODE_FAIL"
                             for r in sacct("JobIDRaw", "State", since=since, workdir=workdir, ended=False)),
                 60, "Slurm to say NODE_FAIL")
        (workdir / "workflow" / "gate").touch()
        code, out = finish(driver, timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
        if victim:
            bring_back(victim)
    assert code == 0, out[-5000:]
    ended = {r["JobIDRaw"]: r["State"] for r in sacct("JobIDRaw", "State", since=since, workdir=workdir)}
    for point, job in jobs.items():
        record = read_manifest(stage(workdir, "work", point))
        steps = [(a["action"], a["state"], a["host"]) for a in record["attempts"]]
        if point == lost_point:
            assert ended[job] == "NODE_FAIL"
            assert steps[0] == ("cmd", "HWFAILURE", victim), steps
            assert steps[1][:2] == ("rerun", "SUCCESS") and steps[1][2] in set(nodes) - {victim}, steps
            assert "NODE_FAIL" in record["attempts"][0]["error"]
        else:
            assert ended[job] == "COMPLETED"
            assert steps == [("cmd", "SUCCESS", placed[point])], steps   # untouched by the other node's loss


def test_the_login_nodes_driver_dies_with_it_and_cron_there_adopts_its_jobs(nodes, tmp_path):
    # The driver runs on the login node, its jobs on compute nodes. The login
    # node is lost (every process on it, the driver's included); the jobs go
    # on. The login node boots again and its cron adopts them: no second job
    # for any point, one attempt each.
    points = {"a": "gated:2", "b": "gated:2"}
    workdir = pipeline(tmp_path, points, {"partition": "compute", "cpus": 4})
    since = time.time()
    driver = on(LOGIN, [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile", str(ONPREM),
                        *FAST], workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        jobs = wait_for(lambda: _at_work(workdir, points), 180, "both points at work")
        assert node("kill", LOGIN).returncode == 0
        driver.wait(timeout=30)
        queued = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True).stdout.split()
        assert set(jobs.values()) <= set(queued), (jobs, queued)     # the compute nodes' jobs live on
    finally:
        assert node("start", LOGIN, "login").returncode == 0
    cron = on(LOGIN, [sys.executable, "-m", "waypost.cli", "cron", "--profile", str(ONPREM), "--", *FAST], workdir,
              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def adopting() -> bool:
        logs = sorted((workdir / ".waypost" / "runs").glob("*.log"))
        return bool(logs) and logs[-1].read_text().count("of an earlier run is still at work there") == 2
    try:
        wait_for(adopting, 120, "cron's run to adopt both jobs")
    finally:
        (workdir / "workflow" / "gate").touch()
    out, _ = cron.communicate(timeout=300)
    assert cron.returncode == 0, out
    rows = sacct("JobIDRaw", "Comment", since=since, workdir=workdir)
    assert sorted(r["JobIDRaw"] for r in rows if r["Comment"].startswith("rule_work_")) == sorted(jobs.values())
    for point, job in jobs.items():
        record = read_manifest(stage(workdir, "work", point))
        assert [(a["state"], a["scheduler_job_id"]) for a in record["attempts"]] == [("SUCCESS", job)]
        assert record["attempts"][0]["host"] in nodes
    assert read_manifest(stage(workdir, "summary"))["state"] == "SUCCESS"


# --- cloud nodes: booted on demand, the bucket mounted on each ----------------

MOUNT = Path("/mnt/waypost-bucket")     # the same path on every node, each its own mount


def cloud_nodes() -> dict[str, str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", CLOUD_NODES, "-o", "%N %T"], capture_output=True,
                         text=True).stdout
    return dict(line.split() for line in out.splitlines())


def power_down_cloud() -> None:
    """Every cloud node removed (as after SuspendTime idle): zero cloud nodes."""
    subprocess.run(["scontrol", "update", f"nodename={CLOUD_NODES}", "state=power_down_force"], capture_output=True)
    wait_for(lambda: all(state == "idle~" for state in cloud_nodes().values()), 90, "the cloud nodes powered down")


@pytest.fixture
def bucket_on_every_node(nodes, gcs_emulator, tmp_path_factory):
    """A bucket that every node mounts at MOUNT as it boots (a startup
    script, as a cloud image's mounts its bucket with gcsfuse): each node its
    own rclone mount, its own caches. The login node is booted again to
    mount it; the cloud nodes are all powered down. Yields (its gs:// URL,
    the mount point on the nodes)."""
    import fake_gcs
    from conftest import _mount_or_skip

    from waypost.stores import gcs
    _mount_or_skip()
    name = f"nodes-{os.getpid()}-{int(time.time())}"
    gcs.filesystem("gs://" + name)[0].mkdir(name)
    work = tmp_path_factory.mktemp("node-mounts")
    config = fake_gcs.rclone_config(gcs_emulator, work / "rclone.conf")
    script = SLURM_DIR / "nodes" / "boot.d" / "50-test-bucket"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!/bin/sh\nmkdir -p {MOUNT}\n"
                      f"exec rclone --config {config} mount fgcs:{name} {MOUNT} --vfs-cache-mode off "
                      f"--dir-cache-time 1s --cache-dir {work}/cache-$1 --log-file {work}/rclone-$1.log --daemon\n")
    script.chmod(0o755)
    try:
        power_down_cloud()
        assert node("kill", LOGIN).returncode == 0 and node("start", LOGIN, "login").returncode == 0
        yield "gs://" + name, MOUNT
    finally:
        script.unlink()
        power_down_cloud()
        node("kill", LOGIN)
        node("start", LOGIN, "login")


def test_the_cloud_profile_runs_the_pipeline_from_zero_cloud_nodes(bucket_on_every_node, tmp_path):
    # `snakemake --profile cloud` from the login node, with no cloud node up:
    # Slurm boots them for the jobs (ResumeProgram), each mounts the bucket,
    # and the pipeline's stages land in the bucket from cloud CPU and GPU nodes.
    url, mount = bucket_on_every_node
    assert set(cloud_nodes().values()) == {"idle~"}                # zero cloud nodes
    config = copy.deepcopy(SMALL_CONFIG)
    config["experiments"]["exp1"]["pairs"] = ["en-xa"]
    config["root"] = str(mount / "results")
    write_config(tmp_path, config)
    driver = on(LOGIN, [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(tmp_path), "--profile",
                        str(CLOUD), "--configfile", str(tmp_path / "config.yaml"), *FAST], tmp_path,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    code, out = finish(driver, timeout=900)
    assert code == 0, out[-5000:]
    fs = gcs_fs()
    report = fs.cat(f"{gcs_key(url)}/results/_all/exp1/report/report.md").decode()
    assert "en-xa | student" in report
    hosts, partitions = {}, {}
    for path in fs.glob(f"{gcs_key(url)}/results/**/_manifest.json"):
        record = json.loads(fs.cat(path))
        for attempt in record["attempts"]:
            hosts[path] = attempt["host"]
            job = attempt["scheduler_job_id"]
            partitions[path] = wait_for(lambda job=job: subprocess.run(   # (accounting lags a moment)
                ["sacct", "-X", "-n", "-P", "-j", job, "-o", "Partition"], capture_output=True,
                text=True).stdout.strip(), 30, f"sacct to know job {job}")
    assert hosts and all(re.fullmatch(r"wp-[cg]\d", host) for host in hosts.values()), hosts
    assert set(partitions.values()) == {"cloud-cpu", "cloud-gpu"}, partitions
    teacher = next(p for p in partitions if "/train_teacher/" in p)
    assert partitions[teacher] == "cloud-gpu" and hosts[teacher].startswith("wp-g")
    # Idle for SuspendTime, the nodes are removed again (SuspendProgram): no process of theirs is left.
    booted = set(hosts.values())
    wait_for(lambda: all(state == "idle~" for state in cloud_nodes().values()), 150, "Slurm to suspend idle nodes")
    assert not booted & set(node("list").stdout.split())


def test_a_spot_node_lost_mid_job_is_hwfailure_and_restarts_on_another_from_its_checkpoint(
        bucket_on_every_node, tmp_path):
    # A point takes a whole cloud node. The node is taken away once the
    # point has a checkpoint in the bucket (its namespaces killed, marked down
    # as a preempted spot VM is): the job ends NODE_FAIL, recorded
    # HWFAILURE, and the stage's cue restarts it on the other cloud node,
    # which Slurm boots, from that checkpoint.
    url, mount = bucket_on_every_node
    policy = {"max_attempts": 3, "cues": [{"action": "restart", "when": "cmd.HWFAILURE"}]}
    workdir = pipeline(tmp_path, {"a": "sleep:12"}, {}, stages={"work": {"policy": policy}})
    (workdir / "config" / "workers.yaml").write_text(yaml.safe_dump({"pools": {"cloud": {"executor": "slurm", "classes": {
        "small": {"partition": "cloud-cpu", "cpus": 8, "mem_mb": 200, "runtime": 10}}}}}))
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    config["root"] = str(mount / "results")
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    stage_key = f"{gcs_key(url)}/results/_all/e/work/a"
    fs = gcs_fs()

    def at_work() -> str | None:
        fs.invalidate_cache()     # (the bucket as it is now, not as gcsfs listed it before)
        try:
            if not fs.exists(f"{stage_key}/ckpt"):
                return None
            return json.loads(fs.cat(f"{stage_key}/_running.json"))["scheduler_job_id"]
        except (OSError, ValueError, KeyError):
            return None

    since = time.time()
    driver = on(LOGIN, [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile", str(CLOUD),
                        *FAST, "--until", "work"], workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        job = wait_for(at_work, 240, "point a at work with a checkpoint")
        lost = node_of(job)
        assert lost in ("wp-c1", "wp-c2"), lost
        lose(lost)
        code, out = finish(driver, timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert code == 0, out[-5000:]
    fs.invalidate_cache()
    record = json.loads(fs.cat(f"{stage_key}/_manifest.json"))
    steps = [(a["action"], a["state"], a["host"]) for a in record["attempts"]]
    assert steps[0] == ("cmd", "HWFAILURE", lost), steps
    assert steps[-1][:2] == ("restart", "SUCCESS") and steps[-1][2] not in (lost, None), steps
    assert "NODE_FAIL" in record["attempts"][0]["error"]
    log = fs.cat(f"{stage_key}/{record['attempts'][-1]['log']}").decode()
    assert "resuming from step" in log, log
    ended = {r["JobIDRaw"]: r["State"] for r in sacct("JobIDRaw", "State", since=since, workdir=workdir)}
    assert ended[job] == "NODE_FAIL"


# --- the soak, over the cluster ----------------------------------------------

CLUSTER_FAULTS = ("compute node lost", "cloud node lost", "login node lost", "scancel")


@pytest.mark.soak
def test_soak_over_the_cluster_with_nodes_lost_keeps_its_invariants_and_converges(nodes, tmp_path):
    # The Slurm soak's invariants (tests/test_slurm_jobs.py), over several
    # nodes: crons from the login node, points on the compute nodes and, when
    # they are full, on cloud nodes Slurm boots; into each cron a seeded fault:
    # a compute node lost under a job (back after the cron), a cloud node lost
    # under a job, the login node lost with its cron (booted again for the
    # next), a job scancelled. In the end every point is done, and every one
    # of its Slurm jobs is an attempt in its manifest.
    import random

    from test_slurm_jobs import _soak_converged, _soak_invariants
    rng = random.Random(43)
    points = {f"p{i}": "sleep:10" for i in range(6)}     # 3 fill the compute nodes, 3 go to cloud nodes
    policy = {"max_attempts": 4, "max_series": 8,
              "cues": [{"action": "restart", "when": "any(cmd.TIMEOUT, cmd.PREEMPTED, cmd.HWFAILURE, cmd.CANCELLED)"}]}
    workdir = pipeline(tmp_path, points, {"partition": "compute,cloud-cpu", "cpus": 4},
                       stages={"work": {"policy": policy}})
    cron_cmd = [sys.executable, "-m", "waypost.cli", "cron", "--profile", str(ONPREM), "--", *FAST]
    since, figures, faults = time.time(), {}, []
    for round_no, fault in enumerate(CLUSTER_FAULTS):
        if round_no:   # points to do again, so the cron has work to be hit in (all: some on cloud nodes)
            redo = sorted(points) if fault == "cloud node lost" else rng.sample(sorted(points), 3)
            again = [arg for p in redo for arg in ("--instance", p)]
            subprocess.run([sys.executable, "-m", "waypost.cli", "rerun", "work", *again], cwd=workdir,
                           capture_output=True, text=True)
        run = on(LOGIN, cron_cmd, workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        lost = None
        try:
            wanted = "wp-c" if fault == "cloud node lost" else "wp-n" if fault == "compute node lost" else ""

            def at_work(wanted=wanted, run=run):
                jobs = [j for p in points if (j := running_job(stage(workdir, "work", p)))]
                found = [j for j in jobs if node_of(j).startswith(wanted)]
                return found or (run.poll() is not None and ["(none)"])
            jobs = wait_for(at_work, 180, f"a point at work for the fault '{fault}'")
            if jobs != ["(none)"] and run.poll() is None:
                faults.append(fault)
                job = rng.choice(jobs)
                if fault == "scancel":
                    subprocess.run(["scancel", job])
                elif fault == "login node lost":
                    node("kill", LOGIN)
                    node("start", LOGIN, "login")
                else:
                    lost = node_of(job)
                    lose(lost)
            run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
            if lost and lost.startswith("wp-n"):
                bring_back(lost)
            elif lost:      # a lost cloud node: Slurm removes it, to boot it again on demand
                subprocess.run(["scontrol", "update", f"nodename={lost}", "state=power_down_force"])
        _soak_invariants(workdir, since, figures)
    calm = 0
    while True:
        calm += 1
        assert calm <= 6, "the soak did not converge"
        run = on(LOGIN, cron_cmd, workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, out
        _soak_invariants(workdir, since, figures)
        if json.loads((workdir / ".waypost" / "cron.log").read_text().splitlines()[-1])["nothing_to_do"]:
            break
    attempts = _soak_converged(workdir, since, points)
    assert faults == list(CLUSTER_FAULTS), faults
    summary = {"points": len(points), "faults": faults, "slurm_jobs_of_work": figures["jobs"], "attempts": attempts,
               "calm_crons": calm}
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "soak-cluster.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("soak over the cluster:", summary)
