"""Worker classes for rules that name none, from workers.yaml's ``assign``:
by rule name (or glob), then by a resource value such as ``gpu: 2``; an
explicit ``resources: worker=`` wins. Stages and plain Snakemake rules
alike, locally (nothing blocks, the class's resources reach the job) and on
the local Slurm cluster (the partition, from sacct)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import REPO, finish, read_manifest

ONPREM = REPO / "profiles" / "onprem"
LOCAL = REPO / "profiles" / "local"
FAST = ["--waypost-init-seconds-before-status-checks", "1", "--latency-wait", "5", "--waypost-no-account"]

# A stage (gpu=1, no worker), plain rules: one with gpu=2 and no worker, two
# matched by name (one also with gpu=2, one naming its worker), one with
# nothing at all. Each
# plain job writes the resources it was given.
SNAKEFILE = '''
from waypost.snakemake import Pipeline

wp = Pipeline(config, workflow)

SHOW = "echo {rule} {resources.mem_mb} {resources.runtime} ${{SLURM_JOB_PARTITION:-none}} > {output}"


rule embed:
    output: wp.out("vectors.txt")
    resources: gpu=1
    shell: "echo GPUS=$GPUS > {output}"


rule fit_model:
    input: "results/_all/{experiment}/embed/vectors.txt"
    output: "plain/{experiment}/model.txt"
    resources: gpu=2
    shell: SHOW


rule bench_speed:
    input: "plain/{experiment}/model.txt"
    output: "plain/{experiment}/speed.txt"
    resources: gpu=2
    shell: SHOW


rule bench_pinned:
    input: "plain/{experiment}/model.txt"
    output: "plain/{experiment}/pinned.txt"
    resources: worker="small"
    shell: SHOW


rule tidy:
    input: "plain/{experiment}/speed.txt", "plain/{experiment}/pinned.txt"
    output: "plain/{experiment}/tidy.txt"
    shell: SHOW


wp.finish()

rule all:
    default_target: True
    input: wp.targets, expand("plain/{e}/tidy.txt", e=wp.experiments)
'''


def classes(partition_small: str | None, partition_gpu: str | None, partition_two: str | None,
            mem: int = 200) -> dict:
    def part(value: str | None) -> dict:
        return {"partition": value} if value else {}
    return {
        "small": {**part(partition_small), "cpus": 1, "mem_mb": mem + 10, "runtime": 7},
        "cpu": {**part(partition_small), "cpus": 1, "mem_mb": mem + 20, "runtime": 8},
        "one-gpu": {**part(partition_gpu), **({"gpus": 1, "gpu_model": "v100"} if partition_gpu else {}),
                    "cpus": 1, "mem_mb": mem + 30, "runtime": 9, "env": {"GPUS": "7", "WORKSPACE": 100}},
        "two-gpu": {**part(partition_two), **({"gpus": 2, "gpu_model": "a100"} if partition_two else {}),
                    "cpus": 1, "mem_mb": mem + 40, "runtime": 11},
    }


ASSIGN = [
    {"resources": {"gpu": 2}, "class": "two-gpu"},
    {"rules": ["bench_*"], "class": "one-gpu"},
    {"resources": {"gpu": [1, "1"]}, "class": "one-gpu"},
]


def pipeline(tmp_path: Path, assign: list) -> Path:
    (tmp_path / "workflow").mkdir()
    (tmp_path / "workflow" / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "config").mkdir()
    pools = {"pools": {"local": {"executor": "local", "classes": classes(None, None, None)},
                       # (a plain rule's Slurm job runs a Snakemake: ~600 MB)
                       "onprem": {"executor": "slurm", "classes": classes("cpu", "gpu-v100", "gpu-a100", 1000)}},
             "assign": assign}
    (tmp_path / "config" / "workers.yaml").write_text(yaml.safe_dump(pools))
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump({"experiments": {"lab": {}}}))
    return tmp_path


def start(workdir: Path, profile: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile", str(profile), *args]
    return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def shown(workdir: Path, name: str) -> list[str]:
    return (workdir / "plain" / "lab" / f"{name}.txt").read_text().split()


def test_rules_without_a_worker_get_the_assigned_class_locally(tmp_path):
    workdir = pipeline(tmp_path, ASSIGN)
    # (--resources gpu=2: the machine's GPUs, as a user would say; a gpu=2 job still runs)
    code, out = finish(start(workdir, LOCAL, "--cores", "2", "--resources", "gpu=2"), timeout=300)
    assert code == 0, out[-4000:]
    # rule name, mem_mb, runtime: a resource mapping, a name glob over a
    # resource mapping, explicit worker= over a matching glob, the default class
    assert shown(workdir, "model")[:3] == ["fit_model", "240", "11"]
    assert shown(workdir, "speed")[:3] == ["bench_speed", "230", "9"]
    assert shown(workdir, "pinned")[:3] == ["bench_pinned", "210", "7"]
    assert shown(workdir, "tidy")[:3] == ["tidy", "220", "8"]
    # the stage with gpu=1: its class by the resource mapping, GPUS as its class declares it
    stage = read_manifest(workdir / "results" / "_all" / "lab" / "embed")
    worker = stage["attempts"][-1]["worker"]
    assert worker["class"] == "one-gpu"
    if worker["GPUS_from"] == "pool":
        assert (workdir / "results" / "_all" / "lab" / "embed" / "vectors.txt").read_text() == "GPUS=7\n"


def refused(tmp_path: Path, assign: list, marker: str) -> list[str]:
    """The lines naming ``marker`` of a dry run that ``assign`` must stop
    before anything runs, without a traceback."""
    workdir = pipeline(tmp_path, assign)
    code, out = finish(start(workdir, LOCAL, "-n"), timeout=120)
    assert code != 0 and "Traceback" not in out and '  File "' not in out, out   # (nor a traceback's lines)
    return [line for line in out.splitlines() if marker in line]


def test_a_class_assign_names_that_the_pool_lacks_is_one_line(tmp_path):
    assert refused(tmp_path, [{"rules": "fit_*", "class": "eight-gpu"}], "eight-gpu") == [
        "waypost: config/workers.yaml: assign[0].class: worker class 'eight-gpu' is not in pool 'local' "
        "(expected one of: cpu, one-gpu, small, two-gpu)"]


def test_an_assign_entry_with_neither_rules_nor_resources_is_one_line(tmp_path):
    assert refused(tmp_path, [{"class": "one-gpu", "rule": "fit_model"}], "workers.yaml") == [
        "  config/workers.yaml: assign[0].rule: unknown key 'rule' (expected one of: class, "
        "resources, rules)"]


def sacct_rows(since: float, workdir: Path, jobs: int) -> list[dict]:
    begin = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 1))
    deadline = time.time() + 60
    while True:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-S", begin, "-o", "State,Partition,AllocTRES,Comment,WorkDir"],
                             capture_output=True, text=True, check=True).stdout
        rows = [dict(zip(("state", "partition", "tres", "comment"), line.split("|")[:4]))
                for line in out.splitlines() if line.endswith(f"|{workdir}")]
        if (len(rows) >= jobs and all(r["state"].split()[0] == "COMPLETED" for r in rows)) or time.time() > deadline:
            return rows
        time.sleep(0.5)


def test_rules_without_a_worker_land_in_the_assigned_partition_on_slurm(slurm_cluster, tmp_path):
    workdir = pipeline(tmp_path, ASSIGN)
    since = time.time()
    code, out = finish(start(workdir, ONPREM, *FAST), timeout=600)
    assert code == 0, out[-5000:]
    rows = sacct_rows(since, workdir, 5)

    def job(rule: str) -> dict:
        found = [r for r in rows if f"rule_{rule}_" in r["comment"] or r["comment"].startswith(f"rule_{rule}")]
        assert len(found) == 1, (rule, rows)
        return found[0]

    fit = job("fit_model")   # gpu=2, no worker: the resource mapping
    assert fit["partition"] == "gpu-a100" and "gres/gpu:a100=2" in fit["tres"], fit
    speed = job("bench_speed")   # the name glob over gpu=2's mapping; its own gpu=2 stays
    assert speed["partition"] == "gpu-v100" and "gres/gpu:v100=2" in speed["tres"], speed
    assert job("bench_pinned")["partition"] == "cpu"       # worker= wins over the glob
    assert job("tidy")["partition"] == "cpu"               # the default class
    embed = job("embed")                                   # a stage, gpu=1: the resource mapping
    assert embed["partition"] == "gpu-v100" and "gres/gpu:v100=1" in embed["tres"], embed
    stage = read_manifest(workdir / "results" / "_all" / "lab" / "embed")
    worker = stage["attempts"][-1]["worker"]
    assert worker["class"] == "one-gpu" and len(worker["GPUS"].split()) == 1, json.dumps(worker)
    assert shown(workdir, "model")[:4] == ["fit_model", "1040", "11", "gpu-a100"]
