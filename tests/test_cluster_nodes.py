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
    if not names or not node("up", LOGIN).returncode == 0:
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
        assert [(a["state"], a["slurm_job_id"]) for a in record["attempts"]] == [("SUCCESS", job)]
        assert record["attempts"][0]["host"] in nodes
    assert read_manifest(stage(workdir, "summary"))["state"] == "SUCCESS"
