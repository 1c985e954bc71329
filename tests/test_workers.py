"""Worker pools → resources, and GPUS/WORKSPACE detection precedence."""

from __future__ import annotations

import os
import stat

import pytest
from conftest import REPO

from waypost.model import config as wconfig
from waypost.model import workers
from waypost.scheduler.slurm import SLURM

WORKERS = str(REPO / "config" / "workers.yaml")


def test_pools_and_classes_resolve_to_slurm_plugin_resources():
    data = workers.load(WORKERS)
    assert set(data["pools"]) >= {"local", "onprem", "cloud"}
    for pool in data["pools"].values():
        assert set(pool["classes"]) >= {"cpu", "cpu-large", "gpu", "gpu-large"}
    gpu_large = workers.worker_class(data, "onprem", "gpu-large")
    assert workers.resources(gpu_large, names=SLURM.resource_names) == {
        "slurm_partition": "gpu-a100", "gpu": 4, "gpu_model": "a100", "cpus_per_task": 4,
        "mem_mb": 16000, "runtime": 2880}


def test_overrides_and_growth_per_attempt():
    spec = {"partition": "cpu", "cpus": 2, "mem_mb": 1000, "runtime": 10, "account": "lab", "extra": "--exclusive"}
    third = workers.resources(spec, {"runtime": 20, "qos": "high"}, attempt=3, runtime_growth=1.5, memory_growth=2,
                              names=SLURM.resource_names)
    assert third == {"slurm_partition": "cpu", "cpus_per_task": 2, "mem_mb": 4000, "runtime": 45,
                     "slurm_account": "lab", "slurm_extra": "--exclusive", "qos": "high"}


def test_unknown_pool_or_class_is_a_clear_error():
    data = workers.load(WORKERS)
    with pytest.raises(wconfig.ConfigError, match="pool 'hpc' is not in the workers file"):
        workers.worker_class(data, "hpc", "gpu")
    with pytest.raises(wconfig.ConfigError, match="worker class 'gpu-huge' is not in pool 'onprem'"):
        workers.worker_class(data, "onprem", "gpu-huge")


def test_bad_workers_file_names_file_and_key(tmp_path):
    bad = tmp_path / "workers.yaml"
    bad.write_text("pools:\n  onprem:\n    executor: slurm\n    classes:\n      gpu: {gpus: many, memory: 3}\n")
    with pytest.raises(wconfig.ConfigError) as err:
        workers.load(str(bad))
    text = str(err.value)
    assert str(bad) in text
    assert "pools.onprem.classes.gpu.gpus: expected integer" in text
    assert "pools.onprem.classes.gpu.memory: unknown key 'memory'" in text


@pytest.fixture
def no_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.fixture
def fake_nvidia_smi(monkeypatch, tmp_path):
    """An nvidia-smi that reports two 16 GB GPUs and one 80 GB one."""
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n[ \"$1\" = --query-gpu=index,uuid,memory.total ] || exit 2\n"
                      "printf '0, GPU-a, 16384\\n1, GPU-b, 16384\\n2, GPU-c, 81920\\n'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_gpus_precedence_cuda_then_slurm_then_declared(no_nvidia_smi):
    declared = {"GPUS": "0 1", "WORKSPACE": 9000}
    assert workers.worker_env({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_GPUS": "5"}, declared)["GPUS"] == "2 3"
    env = workers.worker_env({"SLURM_JOB_GPUS": "4,5"}, declared)
    assert (env["GPUS"], env["GPUS_from"]) == ("4 5", "SLURM_JOB_GPUS")
    env = workers.worker_env({}, declared)
    assert env == {"GPUS": "0 1", "GPUS_from": "pool", "WORKSPACE": 9000, "WORKSPACE_from": "pool"}
    assert workers.worker_env({}, {})["GPUS"] == ""


def test_nvidia_smi_gives_gpus_and_workspace(fake_nvidia_smi):
    env = workers.worker_env({}, {"GPUS": "0", "WORKSPACE": 1000})
    assert (env["GPUS"], env["GPUS_from"]) == ("0 1 2", "nvidia-smi")
    assert (env["WORKSPACE"], env["WORKSPACE_from"]) == (int(16384 * 0.75), "nvidia-smi")
    # Only the allocated device counts for the workspace.
    env = workers.worker_env({"CUDA_VISIBLE_DEVICES": "2"}, {})
    assert (env["GPUS"], env["WORKSPACE"]) == ("2", int(81920 * 0.75))


def test_waypost_workers_prints_the_pool_a_profile_selects(tmp_path):
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "waypost.cli", "workers", "--profile", "profiles/onprem", "--json"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    table = json.loads(out)
    assert table["pool"] == "onprem" and table["executor"] == "slurm"
    assert table["classes"]["gpu"]["slurm_partition"] == "gpu-v100"
    text = subprocess.run([sys.executable, "-m", "waypost.cli", "workers", "--pool", "cloud"],
                          cwd=REPO, capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "150"}).stdout
    assert "cloud-gpu" in text and "constraint=spot" in text


def test_nvidia_smi_is_asked_once_per_process_and_its_forks_inherit_it(monkeypatch, tmp_path):
    """The step server and a bundle ask before they fork runners: a step on
    a GPU node doesn't wait for nvidia-smi. One that failed is asked again."""
    asked = tmp_path / "asked"
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho >> {asked}\n[ -e {tmp_path}/broken ] && exit 9\n"
                      "printf '0, GPU-a, 16384\\n'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "broken").touch()
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert workers.worker_env({}, {})["GPUS_from"] == "pool"
    assert workers.worker_env({}, {})["GPUS_from"] == "pool"
    assert len(asked.read_text().splitlines()) == 2   # (failed: asked each time)
    (tmp_path / "broken").unlink()
    for _ in range(3):
        assert workers.worker_env({}, {})["GPUS"] == "0"
    assert len(asked.read_text().splitlines()) == 3
    pid = os.fork()
    if pid == 0:   # a forked runner: the listing is already here
        os._exit(0 if workers.worker_env({"CUDA_VISIBLE_DEVICES": "0"}, {})["WORKSPACE"] == 12288 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(asked.read_text().splitlines()) == 3
