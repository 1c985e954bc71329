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


# --- the config's parameter sets ------------------------------------------------

def points(tmp_path: Path, experiment: dict) -> dict[str, dict]:
    """An experiment's points, its config at ``tmp_path/study.yaml``."""
    from waypost.model import config as wconfig
    raw = {"experiments": {"bench": experiment}}
    prepared = wconfig.prepare(raw, str(tmp_path / "workflow"), str(tmp_path / "study.yaml"))
    return wconfig.points(prepared, "bench")


def error_of(tmp_path: Path, experiment: dict) -> str:
    from waypost.model import config as wconfig
    with pytest.raises(wconfig.ConfigError) as caught:
        points(tmp_path, experiment)
    assert "\n" not in str(caught.value).replace("invalid config:\n  ", ""), caught.value
    return str(caught.value)


def test_zipped_lists_make_a_point_per_position(tmp_path: Path):
    found = points(tmp_path, {"zip": {"mesh": [8, 16, 32], "rep": [1, 1, 2], "tag": ["a", "b", "c"]}})
    assert found == {"mesh8-rep1-taga": {"mesh": 8, "rep": 1, "tag": "a"},
                     "mesh16-rep1-tagb": {"mesh": 16, "rep": 1, "tag": "b"},
                     "mesh32-rep2-tagc": {"mesh": 32, "rep": 2, "tag": "c"}}
    where = f"{tmp_path / 'study.yaml'}: experiments.bench.zip"
    assert f"{where}: lists of one length are zipped, a point per position; these are: mesh 3, rep 2" in \
        error_of(tmp_path, {"zip": {"mesh": [8, 16, 32], "rep": [1, 2]}})
    assert f"{where} (position 3): the point mesh8-rep1 again (first at {where} (position 1))" in \
        error_of(tmp_path, {"zip": {"mesh": [8, 16, 8], "rep": [1, 2, 1]}})
    assert f"{where}.policy: 'policy' is one of waypost's own words" in \
        error_of(tmp_path, {"zip": {"policy": [1]}})
    assert "experiments.bench: grid and zip: an experiment has one parameter set" in \
        error_of(tmp_path, {"grid": {"mesh": [8]}, "zip": {"rep": [1]}})


def test_a_table_makes_a_point_per_row_and_names_what_it_cant_read(tmp_path: Path):
    (tmp_path / "inputs").mkdir()
    table = tmp_path / "inputs" / "points.csv"
    table.write_text("mesh, rep ,solver\n8,1,cg\n\n16,2.5,gmres\n")
    assert points(tmp_path, {"table": "inputs/points.csv"}) == {
        "mesh8-rep1-solvercg": {"mesh": 8, "rep": 1, "solver": "cg"},
        "mesh16-rep2.5-solvergmres": {"mesh": 16, "rep": 2.5, "solver": "gmres"}}
    table.write_text("instance,mesh,rep\ncoarse,8,1\nfine,64,1\n")   # a column that names the points
    assert points(tmp_path, {"table": "inputs/points.csv"}) == {"coarse": {"mesh": 8, "rep": 1},
                                                              "fine": {"mesh": 64, "rep": 1}}
    headless = tmp_path / "inputs" / "samples.csv"   # Merlin's samples file and its column_labels
    headless.write_text("0.5,10\n0.75,20\n")
    assert list(points(tmp_path, {"table": {"file": "inputs/samples.csv", "columns": ["x", "n"]}})) == [
        "x0.5-n10", "x0.75-n20"]
    table.write_text("mesh,tag\n100_0,1e3\n8,inf\n")   # only numbers as a table writes them are numbers
    assert points(tmp_path, {"table": "inputs/points.csv"}) == {
        "mesh100_0-tag1000.0": {"mesh": "100_0", "tag": 1000.0}, "mesh8-taginf": {"mesh": 8, "tag": "inf"}}

    path = tmp_path / "inputs" / "points.csv"
    assert f"experiments.bench.table: {tmp_path / 'inputs' / 'gone.csv'}: file not found" in \
        error_of(tmp_path, {"table": "inputs/gone.csv"})
    table.write_text("mesh,rep\n8,1\n16\n")
    assert f"{path}: line 3: 1 values, and 2 columns (mesh, rep)" in error_of(tmp_path, {"table": "inputs/points.csv"})
    table.write_text("mesh,rep,mesh\n8,1,2\n")
    assert f"{path}: line 1: the column 'mesh' is named twice" in error_of(tmp_path, {"table": "inputs/points.csv"})
    table.write_text("mesh,rep\n8,1\n16,1\n8,1\n")
    assert f"{path}: line 4: the point mesh8-rep1 again (first at {path}: line 2)" in \
        error_of(tmp_path, {"table": "inputs/points.csv"})
    table.write_text("mesh,rep\n8,\n")
    assert f"{path}: line 2: no value in the column 'rep'" in error_of(tmp_path, {"table": "inputs/points.csv"})
    table.write_text("mesh,rep\n8,one two\n")
    assert f"{path}: line 2: the point {{'mesh': 8, 'rep': 'one two'}} makes the instance name 'mesh8-repone two'" \
        in error_of(tmp_path, {"table": "inputs/points.csv"})
    table.write_text("mesh,2nd\n8,1\n")
    assert f"{path}: line 1: '2nd' can't name a parameter" in error_of(tmp_path, {"table": "inputs/points.csv"})
    table.write_text("mesh,rep\n")
    assert f"{path}: no rows" in error_of(tmp_path, {"table": "inputs/points.csv"})


SAMPLE = {"n": 4, "seed": 11, "parameters": {"visc": {"loguniform": [1.0e-4, 1.0e-2]},
                                              "mesh": {"choice": [8, 16, 32]},
                                              "amp": {"uniform": [0.5, 1.0]}, "steps": {"uniform": [10, 20]}}}


def test_the_sample_in_the_docs_makes_the_point_they_name(tmp_path: Path):
    """docs/studies.md's ``sample:`` example, and the first point name it quotes."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "studies.md").read_text()
    first = "viscosity0.000444289-amplitude0.575425-steps295-solvercg"
    assert f"`{first}`" in docs
    assert next(iter(points(tmp_path, {"sample": {"n": 100, "seed": 7, "parameters": {
        "viscosity": {"loguniform": [1.0e-4, 1.0e-2]}, "amplitude": {"uniform": [0.5, 1.0]},
        "steps": {"uniform": [100, 400]}, "solver": {"choice": ["cg", "gmres"]}}}}))) == first


def test_a_sample_is_drawn_again_the_same_from_its_seed(tmp_path: Path):
    import random
    first = points(tmp_path, {"sample": SAMPLE})
    assert len(first) == 4 and first == points(tmp_path, {"sample": SAMPLE})
    other = points(tmp_path, {"sample": {**SAMPLE, "seed": 12}})
    assert len(other) == 4 and not set(other) & set(first)
    more = points(tmp_path, {"sample": {**SAMPLE, "n": 6}})
    assert list(more)[:4] == list(first)   # more points: the first ones are the same
    # the draws: Random(seed).random() alone, one per parameter in order, as documented
    rng = random.Random(11)
    u = [rng.random() for _ in range(4)]
    values = next(iter(first.values()))
    assert values["visc"] == float(f"{10 ** (-4 + 2 * u[0]):.6g}")
    assert values["mesh"] == [8, 16, 32][int(u[1] * 3)]
    assert values["amp"] == float(f"{0.5 + 0.5 * u[2]:.6g}")
    assert values["steps"] == 10 + int(u[3] * 11) and all(10 <= p["steps"] <= 20 for p in more.values())
    assert next(iter(first)) == "-".join(f"{k}{v}" for k, v in values.items())

    where = f"{tmp_path / 'study.yaml'}: experiments.bench.sample"
    assert f"{where}: 3 distinct points in 400 draws, and n is 4: expected a smaller n, or more values" in \
        error_of(tmp_path, {"sample": {"n": 4, "seed": 1, "parameters": {"mesh": {"choice": [8, 16, 32]}}}})
    bad = error_of(tmp_path, {"sample": {"n": 2, "seed": 1, "parameters": {"amp": {"uniform": ["low", 1]}}}})
    assert "experiments.bench.sample.parameters.amp.uniform[0]" in bad and "number" in bad
    assert f"{where}.parameters.amp.loguniform: expected [low, high], two numbers, low below high, both above 0" in \
        error_of(tmp_path, {"sample": {"n": 2, "seed": 1, "parameters": {"amp": {"loguniform": [0, 1]}}}})
    assert f"{where}.parameters.amp.uniform: expected [low, high], two numbers, low below high; got [2, 1]" in \
        error_of(tmp_path, {"sample": {"n": 2, "seed": 1, "parameters": {"amp": {"uniform": [2, 1]}}}})


# --- runs over the other sets -----------------------------------------------------

def test_labels_name_the_points_and_a_name_ending_in_a_digit_stays_unambiguous(tmp_path: Path):
    """Issue 56: Maestro's ``label: SIZE.%%`` per parameter names the points
    (an experiment's ``labels``, for any parameter set); without one, a
    parameter whose name ends in a digit is joined to its value by ``.``:
    ``V10.25`` could be V1 = 0.25 or V10 = .25, ``V1.0.25`` only the first."""
    labelled = points(tmp_path, {"zip": {"SIZE": [10, 20], "ITERATIONS": [10, 20]},
                                 "labels": {"SIZE": "SIZE.%%", "ITERATIONS": "ITER.%%"}})
    assert list(labelled) == ["SIZE.10-ITER.10", "SIZE.20-ITER.20"]
    assert list(points(tmp_path, {"grid": {"V1": [0.25], "V10": [0.5]}})) == ["V1.0.25-V10.0.5"]
    assert list(points(tmp_path, {"sample": {"n": 1, "seed": 3, "parameters": {"x2": {"choice": [7]}}}})) == \
        ["x2.7"]
    assert list(points(tmp_path, {"grid": {"nu": [0.01], "amp": [0.5]}})) == ["nu0.01-amp0.5"]   # (as before)
    where = f"{tmp_path / 'study.yaml'}: experiments.bench"
    assert f"{where}.labels: mu: not a parameter of its grid" in \
        error_of(tmp_path, {"grid": {"nu": [0.01]}, "labels": {"mu": "mu.%%"}})
    assert f"{where}.labels.nu: 'nu' is not a label with %% where the value goes (SIZE.%% makes SIZE.10)" in \
        error_of(tmp_path, {"grid": {"nu": [0.01]}, "labels": {"nu": "nu"}})


def test_labelled_points_run_and_a_funnel_per_value_is_named_by_its_label(tmp_path: Path):
    run = tiny_pipeline(tmp_path, STUDY, study({"zip": {"mesh": [8, 8, 16], "rep": [1, 2, 1]},
                                                "labels": {"mesh": "MESH.%%", "rep": "trial%%"}}))
    first = run(*reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "out" / "_all" / "bench"
    assert sorted(p.name for p in (out / "solve").iterdir()) == ["MESH.16-trial1", "MESH.8-trial1", "MESH.8-trial2"]
    assert sorted(p.name for p in (out / "per_mesh").iterdir()) == ["MESH.16", "MESH.8"]
    assert (out / "per_mesh" / "MESH.8" / "table.txt").read_text() == "table of mesh 8\nmesh 8 rep 1\nmesh 8 rep 2\n"


def test_a_zipped_set_runs_a_point_per_position_and_its_funnels_gather_them(tmp_path: Path):
    run = tiny_pipeline(tmp_path, STUDY, study({"zip": {"mesh": [8, 8, 16], "rep": [1, 2, 1]}}))
    first = run(*reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert ran(tmp_path) == {"solve": 3, "per_mesh": 2, "overall": 1}
    out = tmp_path / "out" / "_all" / "bench"
    assert sorted(p.name for p in (out / "solve").iterdir()) == ["mesh16-rep1", "mesh8-rep1", "mesh8-rep2"]
    assert (out / "overall" / "summary.txt").read_text() == (
        "table of mesh 8\nmesh 8 rep 1\nmesh 8 rep 2\ntable of mesh 16\nmesh 16 rep 1\n")


def test_a_tables_new_row_is_a_new_point_and_a_changed_value_is_drift(tmp_path: Path):
    run = tiny_pipeline(tmp_path, STUDY, study({"table": "points.csv"}))
    table = tmp_path / "config" / "points.csv"
    table.write_text("instance,mesh,rep\nc1,8,1\nc2,8,2\nf1,32,1\n")
    first = run(*reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert ran(tmp_path) == {"solve": 3, "per_mesh": 2, "overall": 1}
    out = tmp_path / "out" / "_all" / "bench"
    assert read_manifest(out / "solve" / "f1")["settings"] == {"mesh": 32, "rep": 1}

    table.write_text("instance,mesh,rep\nc1,8,1\nc2,8,2\nf1,32,1\nf2,32,2\n")   # a row more
    planned = run("-n", *reported(tmp_path))
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert ran(tmp_path) == {"solve": 1, "per_mesh": 1}   # the new point, and its mesh's table
    assert "bench/per_mesh/mesh32: made from 1 inputs, now 2 (1 new, 0 gone): redone" in planned.stderr

    table.write_text("instance,mesh,rep\nc1,8,1\nc2,8,3\nf1,32,1\n")   # a value changed: the point's settings
    plan = cli(tmp_path, "plan", "--json")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    drift = json.loads(plan.stdout)["drift"]
    assert [(r["stage"], r["instance"], r["what"]) for r in drift] == [("solve", "c2", ["settings: rep: 2 → 3"])]

    table.unlink()
    gone = run("-n")
    said = gone.stdout + gone.stderr
    assert gone.returncode != 0 and "Traceback" not in said
    assert "config/config.yaml: experiments.bench.table: config/points.csv: file not found" in said, said


def test_a_seeded_sample_runs_its_points_and_another_seed_draws_others(tmp_path: Path):
    sample = {"n": 3, "seed": 5, "parameters": {"mesh": {"choice": [8, 16]}, "rep": {"uniform": [1, 1000]}}}
    run = tiny_pipeline(tmp_path, STUDY, study({"sample": sample}))
    first = run(*reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    solved = sorted(p.name for p in (tmp_path / "out" / "_all" / "bench" / "solve").iterdir())
    assert solved == sorted(points(tmp_path, {"sample": sample}))
    assert ran(tmp_path)["solve"] == 3
    again = run("-n", *reported(tmp_path))   # the same seed: the same points, done
    assert again.returncode == 0 and ran(tmp_path) == {}
    write_config(tmp_path, study({"sample": {**sample, "seed": 6}}), name="config/config.yaml")
    other = run("-n", *reported(tmp_path))
    assert other.returncode == 0, other.stderr[-3000:]
    assert ran(tmp_path)["solve"] == 3   # three other points


@pytest.mark.parametrize("change, message", [
    (('over="rep"', 'over="trial"'),
     "rule per_mesh: wp.each('solve', ..., over='trial'): stage solve has no dimension 'trial' (its dimensions: "
     "mesh, rep)"),
    (('wp.grid.per("mesh")', 'wp.grid.per("rep")'),
     "rule per_mesh: wp.each('solve', ..., over='rep'): gathering along rep keeps mesh, and this stage's instances "
     "have no 'mesh' (expected instances=wp.grid.per('mesh'))"),
    (('wp.grid.per("mesh")', 'wp.grid.per("size")', 'over="rep"', 'over=["mesh", "rep"]',
      'wp.dim("mesh")', 'wp.dim("size")'),
     "config/config.yaml: experiments.bench: rule per_mesh runs once per value of 'size' "
     "(instances=wp.grid.per('size')), and this experiment's points have no parameter 'size' (their parameters: "
     "mesh, rep)"),
    (('wp.dim("rep")', 'wp.dim("seed")'),
     "rule solve: wp.dim('seed'): no dimension 'seed' (rule solve's instances have: mesh, rep)"),
    (('wp.grid.per("mesh")', 'wp.grid.per()'), "rule per_mesh: wp.grid.per(): expected the names of some"),
])
def test_a_parameter_named_wrong_is_one_error(tmp_path: Path, change, message):
    snakefile = STUDY
    for old, new in zip(change[::2], change[1::2]):
        snakefile = snakefile.replace(old, new)
    run = tiny_pipeline(tmp_path, snakefile, study(GRID))
    proc = run("-n")
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and message in said, said[-3000:]
    assert "Traceback" not in said and 'File "' not in said, said[-3000:]
