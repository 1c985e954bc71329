"""Snakemake's executor conformance suite (``snakemake.common.tests``)
against waypost's executor, on the local Slurm cluster
(scripts/slurm-dev-cluster.sh): the workflows every executor plugin must
run (``simple``, ``groups``), each job a Slurm job submitted through
``executor: waypost``.

The suite's own workflows can't pass unchanged on this cluster: their rule
``c`` asks for ``mem="5MB"``, the plugin submits that as ``sbatch --mem 5``,
and this cluster enforces memory with cgroups (``ConstrainRAMSpace=yes`` in
cgroup.conf). The job's Snakemake, which must start in the job to run the
rule, needs ~100 MB: Slurm kills it, ``OUT_OF_MEMORY`` (seen on job 800 of
the first run: ``ReqMem 5M``, ``Detected 1 oom-kill event``). So the suite
runs here with rule ``c``'s memory raised (``TestWaypostExecutor``), and
the unchanged suite is run too, expected to fail for exactly that reason
(``TestWaypostExecutorAsShipped``: strict, so a cluster where it passes
says so)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from snakemake.common.tests import TestWorkflowsLocalStorageBase
from snakemake.settings import types as settings
from snakemake_interface_common.exceptions import WorkflowError

from snakemake_executor_plugin_waypost import ExecutorSettings

SRC = Path(__file__).resolve().parent.parent / "src"
# What Snakemake in a job needs to start (its rule ``c`` asks for 5 MB).
ENOUGH_MEMORY = {"c": {"mem": "600MB"}}


class TestWaypostExecutor(TestWorkflowsLocalStorageBase):
    __test__ = True
    latency_wait = 10

    @pytest.fixture(autouse=True)
    def _cluster(self, slurm_cluster):
        return slurm_cluster

    def get_executor(self) -> str:
        return "waypost"

    def get_executor_settings(self) -> ExecutorSettings | None:
        return ExecutorSettings(init_seconds_before_status_checks=2, no_account=True)

    def get_resource_settings(self) -> settings.ResourceSettings:
        return settings.ResourceSettings(overwrite_resources=ENOUGH_MEMORY)


def _enforces_memory() -> bool:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    return "task/cgroup" in out


class TestWaypostExecutorAsShipped(TestWaypostExecutor):
    """The suite's workflows as they are: rule ``c``'s 5 MB job is killed."""

    expect_exception = WorkflowError

    @pytest.fixture(autouse=True)
    def _memory_enforced(self, slurm_cluster):
        if not _enforces_memory():
            pytest.fail("this cluster does not enforce memory (no task/cgroup): run the suite's workflows "
                        "unchanged instead of expecting them to fail")

    def get_resource_settings(self) -> settings.ResourceSettings:
        return settings.ResourceSettings()



def test_an_untested_slurm_plugin_version_stops_the_run_with_one_line(tmp_path):
    """Another version of the Slurm plugin installed (its dist-info first on
    the path): the executor stops at its start, one line, nothing submitted."""
    other = tmp_path / "site" / "snakemake_executor_plugin_slurm-3.1.0.dist-info"
    other.mkdir(parents=True)
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: snakemake-executor-plugin-slurm\nVersion: 3.1.0\n")
    work = tmp_path / "wf"
    work.mkdir()
    (work / "Snakefile").write_text('rule made:\n    output: "made.txt"\n    shell: "touch {output}"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(SRC)])}
    run = subprocess.run([sys.executable, "-m", "snakemake", "--executor", "waypost", "--jobs", "1",
                          "--waypost-no-account"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    said = [line for line in run.stderr.splitlines() if "snakemake-executor-plugin-slurm" in line]
    assert run.returncode == 1, run.stderr
    assert said == ["waypost: waypost's executor uses private parts of snakemake-executor-plugin-slurm, tested on "
                    "2.8.x; 3.1.0 is installed: install a tested one "
                    "(pip install 'snakemake-executor-plugin-slurm==2.8.*')"], run.stderr
    assert "Traceback" not in run.stderr and not (work / "made.txt").exists()
    assert not (work / ".snakemake" / "locks").exists() or not any((work / ".snakemake" / "locks").iterdir())


def test_an_untested_slurm_plugin_version_is_one_clear_line():
    from snakemake_executor_plugin_waypost import slurm_private
    slurm_private.check()   # the installed plugin is a tested one
    with pytest.raises(slurm_private.UntestedPlugin) as raised:
        slurm_private.check("3.1.0")
    assert "\n" not in str(raised.value)
    assert "3.1.0 is installed" in str(raised.value) and "2.8.x" in str(raised.value)
