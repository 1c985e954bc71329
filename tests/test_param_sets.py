"""A study's points beyond a cross product, run by Snakemake: a grid's (and
any parameter set's) parameters are dimensions a funnel gathers along (a
funnel per value of one parameter reads only its points, and a rerun of one
point redoes only its value's funnel), and the config's other parameter
sets (zipped lists, a CSV table, a seeded random sample) make points the
same way a grid does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_manifest, write_config
from test_series import _job_stats, reported, tiny_pipeline

STUDY = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


rule solve:
    output: out=wp.out("out.txt", instances=wp.grid)
    params: mesh=wp.setting("mesh"), rep=wp.dim("rep")
    shell: "echo mesh {params.mesh} rep {params.rep} > {output.out}"


rule per_mesh:
    input: runs=wp.each("solve", "out.txt", over="rep")
    output: table=wp.out("table.txt", instances=wp.grid.per("mesh"))
    params: mesh=wp.dim("mesh")
    shell: "(echo table of mesh {params.mesh}; cat {input.runs}) > {output.table}"


rule overall:
    input: tables=wp.each("per_mesh", "table.txt")
    output: summary=wp.out("summary.txt", funnel=True)
    shell: "cat {input.tables} > {output.summary}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def study(points: dict, **more) -> dict:
    return {"root": "out", "experiments": {"bench": {**points, **more}}}


def cli(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waypost.cli", args[0], "--config", "config/config.yaml",
                           "--workflow", "workflow", *args[1:]], cwd=work, capture_output=True, text=True,
                          timeout=120)


def ran(work: Path) -> dict[str, int]:
    return _job_stats(work / "events.jsonl")


GRID = {"grid": {"mesh": [8, 16, 32], "rep": [1, 2, 3, 4]}}


def test_a_funnel_per_value_of_a_grid_parameter_gathers_only_its_points(tmp_path: Path):
    run = tiny_pipeline(tmp_path, STUDY, study(GRID))
    first = run(*reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert ran(tmp_path) == {"solve": 12, "per_mesh": 3, "overall": 1}
    out = tmp_path / "out" / "_all" / "bench"
    assert sorted(p.name for p in (out / "per_mesh").iterdir() if p.is_dir()) == ["mesh16", "mesh32", "mesh8"]
    assert (out / "per_mesh" / "mesh16" / "table.txt").read_text() == (
        "table of mesh 16\n" + "".join(f"mesh 16 rep {r}\n" for r in (1, 2, 3, 4)))
    inputs = [i["path"] for i in read_manifest(out / "per_mesh" / "mesh16")["inputs"]]
    assert sorted(Path(p).parent.name for p in inputs) == [f"mesh16-rep{r}" for r in (1, 2, 3, 4)]
    assert read_manifest(out / "per_mesh" / "mesh16")["instance"] == "mesh16"

    # One point redone, and what was made from it: its mesh's table and the summary, no other table.
    rerun = cli(tmp_path, "rerun", "solve", "--instance", "mesh16-rep3", "--downstream")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "3 stage(s) will be redone" in rerun.stdout, rerun.stdout
    assert "per_mesh/mesh16:" in rerun.stdout and "per_mesh/mesh8" not in rerun.stdout
    again = run(*reported(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert ran(tmp_path) == {"solve": 1, "per_mesh": 1, "overall": 1}
    assert (out / "per_mesh" / "mesh16" / ".attempts" / "1").is_dir()
    assert not (out / "per_mesh" / "mesh8" / ".attempts").exists()

    # A new value of the gathered parameter: its points, and every table (each gathers one more;
    # the summary's set of tables is the same: presence mode keeps it, as for any fan-in).
    write_config(tmp_path, study({"grid": {"mesh": [8, 16, 32], "rep": [1, 2, 3, 4, 5]}}),
                 name="config/config.yaml")
    planned = run("-n", *reported(tmp_path))
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert ran(tmp_path) == {"solve": 3, "per_mesh": 3}
    # A new value of the kept one: its points and its table; the others' are done.
    write_config(tmp_path, study({"grid": {"mesh": [8, 16, 32, 64], "rep": [1, 2, 3, 4]}}),
                 name="config/config.yaml")
    planned = run("-n", *reported(tmp_path))
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert ran(tmp_path) == {"solve": 4, "per_mesh": 1, "overall": 1}
