"""Smaller things of issue 41 (point 8): a step run in its own stage
directory (Maestro's and Merlin's workspace per step), with relative inputs
and outputs; a given-up point whose settings changed, in `waypost plan`;
what `waypost retry --help` promises; an unknown `--instance`, per stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import LOCAL_PROFILE, read_manifest

SNAKEFILE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule mesh:
    input: geometry="inputs/geometry.txt"
    output: grid=wp.out("grid.txt", instances=wp.grid)
    shell: "touch marked && pwd > here.txt && sed 's/^/{wildcards.instance}: /' {input.geometry} > {output.grid}"

rule solve:
    input: grid=wp.stage("mesh", "grid.txt")
    params: code=lambda wildcards: 0
    output: field=wp.out("field.txt", instances=wp.grid)
    shell: "test -s {input.grid} && pwd > {output.field} && exit {params.code}"

rule tally:
    input: fields=wp.each("mesh", "grid.txt")
    output: total=wp.out("total.txt", funnel=True)
    shell: "cat {input.fields} > {output.total}"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def study(work: Path, mesh_policy: dict, solve: dict | None = None) -> None:
    (work / "flow").mkdir(exist_ok=True)
    (work / "flow" / "Snakefile").write_text(SNAKEFILE)
    (work / "inputs").mkdir(exist_ok=True)
    (work / "inputs" / "geometry.txt").write_text("cube\nsphere\n")
    config = {"root": "runs", "experiments": {"shapes": {"grid": {"size": [4, 8]}}},
              "stages": {"mesh": {"policy": mesh_policy}, "solve": solve or {}, "tally": {}}}
    (work / "config.yaml").write_text(json.dumps(config))


def run(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(work / "flow" / "Snakefile"), "-d",
                           str(work), "--profile", str(LOCAL_PROFILE), "--configfile", str(work / "config.yaml"),
                           *args], cwd=work, capture_output=True, text=True, timeout=600)
    assert not check or done.returncode == 0, done.stdout + done.stderr
    return done


def cli(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waypost.cli", args[0], "--config", str(work / "config.yaml"),
                           "--workflow", str(work / "flow"), *args[1:]], cwd=work, capture_output=True, text=True,
                          timeout=300)


def test_a_step_runs_in_its_stage_directory_when_its_policy_says_so(tmp_path):
    study(tmp_path, {"workdir": "stage"})
    run(tmp_path)
    meshes = sorted((tmp_path / "runs" / "_all" / "shapes" / "mesh").iterdir())
    assert [m.name for m in meshes] == ["size4", "size8"]
    for mesh in meshes:
        # The literal `touch marked` is the point's own; the relative input
        # (outside the root) and output (in it) still worked from there.
        assert (mesh / "marked").exists() and Path((mesh / "here.txt").read_text().strip()) == mesh
        assert (mesh / "grid.txt").read_text() == f"{mesh.name}: cube\n{mesh.name}: sphere\n"
        assert read_manifest(mesh)["state"] == "SUCCESS"
    assert not (tmp_path / "marked").exists()
    # The default: as Snakemake, the workflow's working directory.
    field = tmp_path / "runs" / "_all" / "shapes" / "solve" / "size4" / "field.txt"
    assert Path(field.read_text().strip()) == tmp_path


def test_a_step_runs_in_the_workflow_directory_by_default(tmp_path):
    study(tmp_path, {})
    run(tmp_path, "--until", "mesh")
    assert (tmp_path / "marked").exists()
    assert not list((tmp_path / "runs").rglob("marked"))


def test_a_wrong_workdir_is_one_line(tmp_path):
    study(tmp_path, {"workdir": "point"})
    done = run(tmp_path, check=False)
    assert done.returncode != 0 and "workdir" in done.stderr and "Traceback" not in done.stderr


def test_a_given_up_point_whose_settings_changed_says_so_in_plan(tmp_path):
    study(tmp_path, {}, {"policy": {"max_series": 1}, "level": 1})
    flow = tmp_path / "flow" / "Snakefile"
    flow.write_text(flow.read_text().replace("code=lambda wildcards: 0", "code=lambda wildcards: 3"))
    run(tmp_path, check=False)
    solved = tmp_path / "runs" / "_all" / "shapes" / "solve" / "size8"
    assert read_manifest(solved)["given_up"]

    config = json.loads((tmp_path / "config.yaml").read_text())
    config["stages"]["solve"]["level"] = 2
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    out = cli(tmp_path, "plan", "--profile", str(LOCAL_PROFILE), "--width", "250")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no drift" not in out.stdout and "next run: nothing to do" in out.stdout, out.stdout
    assert "given up, and its settings changed since" in out.stdout
    row = next(line for line in out.stdout.splitlines() if "solve" in line)
    assert "given up; its settings changed since: level: 1 → 2: `waypost retry`" in row, out.stdout


def test_retry_help_says_how_the_next_series_begins():
    out = subprocess.run([sys.executable, "-m", "waypost.cli", "retry", "--help"], capture_output=True, text=True)
    text = " ".join(out.stdout.split())
    assert "in place" not in text.replace("unless a cue restarts", "")
    assert "a fresh start in a new workspace, the old one archived, unless a cue restarts or reruns" in text


def test_an_unknown_instance_lists_the_instances_of_each_stage(tmp_path):
    study(tmp_path, {})
    run(tmp_path, "--until", "mesh")
    out = cli(tmp_path, "rerun", "mesh", "--instance", "size5")
    assert out.returncode != 0
    assert "mesh's instances: size4, size8" in out.stderr, out.stderr
    out = cli(tmp_path, "plan", "--profile", str(LOCAL_PROFILE), "--instance", "size5")
    # (no stage named: each stage's own, not one list of them all)
    assert "(mesh's instances: size4, size8; solve's instances: size4, size8;" in out.stderr, out.stderr
