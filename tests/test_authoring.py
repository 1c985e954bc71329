"""A team's own pipeline on waypost: `waypost init` from the installed
package, a stage said once (a copied rule can't touch another stage's
directory), and every missing piece one clear error, never a traceback."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO

from waypost.model import events


def run(cmd, cwd, env=None, check=True):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def planned_jobs(snakemake: list[str], cwd: Path, env: dict) -> set[str]:
    """The rules a dry run would run (not ``all``), as Snakemake reports them
    to waypost's logger plugin (found in the installed package)."""
    path = cwd / "planned-events.jsonl"
    run([*snakemake, "-n", *events.snakemake_args(str(path))], cwd=cwd, env=env)
    found = set(events.counts(events.read(str(path))))
    path.unlink()
    return found


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv outside the repo with waypost installed from a wheel
    built from this checkout (not editable). Its other dependencies are this
    test environment's (a .pth file), so the test needs no network."""
    base = tmp_path_factory.mktemp("installed")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(base / "dist"), str(REPO)], cwd=base)
    wheel = next((base / "dist").glob("waypost-*.whl"))
    run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], cwd=base)
    python = base / "venv" / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=base).stdout.strip()
    Path(site, "deps-of-the-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, str(wheel)], cwd=base)
    where = run([str(python), "-c", "import waypost; print(waypost.__file__)"], cwd=base).stdout.strip()
    assert where.startswith(site) and not where.startswith(str(REPO)), where
    return python


def test_init_from_the_installed_package_runs_reruns_one_stage_and_is_then_done(installed, tmp_path):
    home = tmp_path / "home"
    env = {"HOME": str(home), "PATH": f"{installed.parent}:{os.environ['PATH']}"}
    env_without = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "SNAKEMAKE_PROFILE")}
    env = {**env_without, **env}
    out = run([str(installed), "-m", "waypost.cli", "init", "fits"], cwd=tmp_path, env=env)
    assert "next: cd fits" in out.stdout
    pipeline = tmp_path / "fits"
    snakemake = [str(installed), "-m", "snakemake", "--profile", "local"]

    first = run(snakemake, cwd=pipeline, env=env)
    assert "6 of 6 steps (100%) done" in first.stderr
    summary = pipeline / "results/_all/first/summarize/summary.md"
    assert "| small |" in summary.read_text() and "| large |" in summary.read_text()

    # Delete one stage's output: exactly that stage reruns.
    (pipeline / "results/large/first/generate/data.csv").unlink()
    fit_before = (pipeline / "results/large/first/fit/model.json").stat().st_mtime_ns
    assert planned_jobs(snakemake, pipeline, env) == {"generate"}
    run(snakemake, cwd=pipeline, env=env)
    assert (pipeline / "results/large/first/generate/data.csv").exists()
    assert (pipeline / "results/large/first/fit/model.json").stat().st_mtime_ns == fit_before

    done = run([*snakemake, "-n"], cwd=pipeline, env=env)
    assert "Nothing to be done (all requested files are present and up to date)" in done.stdout
    status = run([str(installed), "-m", "waypost.cli", "status"], cwd=pipeline, env=env)
    assert "all datasets" in status.stdout and "missing" not in status.stdout.split("legend")[0]
    # The generic axis: the CLI speaks the workflow's word.
    one = run([str(installed), "-m", "waypost.cli", "status", "--dataset", "small", "--json"], cwd=pipeline, env=env)
    assert '"small"' in one.stdout and '"large"' not in one.stdout
    # The pipeline's own test passes too.
    own = run([str(installed), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=pipeline, env=env)
    assert "1 passed" in own.stdout


PAGES = """
import sys
from waypost.cli import findpage, statuspage
grid = {"root": "results", "stages": ["fit"], "experiments": {"x": {"d": {"fit": {
    "state": "FAILED", "attempts": 1, "path": "results/d/x/fit", "log": "fit.log", "reason": "exit 3", "history": []}}}}}
data = findpage.build([], root="/data/results", experiments={"x": ["d"]}, roots=["/data/results"])
sys.stdout.write(statuspage.render(grid) + findpage.render(data))
"""


def test_the_html_pages_render_from_the_installed_package_as_from_the_checkout(installed, tmp_path):
    """The pages' CSS and JavaScript are package data files: a wheel without
    them would fail here (or render pages without their script)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    from_wheel = subprocess.run([str(installed), "-c", PAGES], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert from_wheel.returncode == 0, from_wheel.stderr[-2000:]
    here = run([sys.executable, "-c", PAGES], cwd=tmp_path, env={"PYTHONPATH": str(REPO / "src")})
    assert from_wheel.stdout == here.stdout
    assert "document.addEventListener(\"toggle\"" in here.stdout and "JSON.parse(document.getElementById" in here.stdout


def test_init_refuses_a_directory_with_files(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    proc = run([sys.executable, "-m", "waypost.cli", "init", "taken", "--no-profiles"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "exists and is not an empty directory" in proc.stderr
    assert os.listdir(tmp_path / "taken") == ["notes.txt"]


# --- a small pipeline of one's own -------------------------------------------

SNAKEFILE = """
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)

rule make_data:
    output: data=wp.out("data.txt")
    params: n=wp.setting("n", 5)
    shell: "seq {params.n} > {output.data}"

rule square:
    input: data=wp.stage("make_data", "data.txt")
    output: squares=wp.out("squares.txt")
    shell: "awk '{{print $1 * $1}}' {input.data} > {output.squares}"
__MORE__
wp.finish()

rule all:
    default_target: True
    input: wp.targets
"""


def own_pipeline(tmp_path: Path, more: str = "", config: str = "experiments:\n  e1: {}\n") -> Path:
    (tmp_path / "workflow").mkdir(parents=True, exist_ok=True)
    (tmp_path / "workflow" / "Snakefile").write_text(SNAKEFILE.replace("__MORE__", more))
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "config.yaml").write_text(config)
    return tmp_path


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                str(REPO / "profiles" / "local"), *args], cwd=workdir, check=check)


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_small_pipeline_without_schema_or_workers(tmp_path):
    own_pipeline(tmp_path)
    snakemake(tmp_path)
    assert (tmp_path / "results/_all/e1/square/squares.txt").read_text().split() == ["1", "4", "9", "16", "25"]
    assert "Nothing to be done" in snakemake(tmp_path, "-n").stdout


def test_a_copied_rule_with_a_stale_stage_name_cannot_touch_the_other_stage(tmp_path):
    """The slip of the issue: rule make_data copied into a new rule, its
    names left as they were. The copy writes into its own stage directory;
    make_data's directory and manifest are untouched."""
    own_pipeline(tmp_path)
    snakemake(tmp_path)
    before = digest(tmp_path / "results/_all/e1/make_data")
    copied = '''
rule cube:
    input: data=wp.stage("make_data", "data.txt")
    output: data=wp.out("data.txt")
    params: n=wp.setting("n", 5)
    shell: "seq {params.n} > {output.data}"
'''
    own_pipeline(tmp_path, copied)
    snakemake(tmp_path)
    assert digest(tmp_path / "results/_all/e1/make_data") == before
    assert (tmp_path / "results/_all/e1/cube/data.txt").exists()
    assert (tmp_path / "results/_all/e1/cube/_manifest.json").exists()


@pytest.mark.parametrize("more, expected", [
    ('''
rule sneaky:
    input: data=wp.stage("make_data", "data.txt")
    output: data=wp.out("data.txt"), other="results/_all/{experiment}/make_data/data.txt"
    shell: "true"
''', "rule sneaky: every output of a stage rule is wp.out(...)"),
    ('''
rule typo:
    input: data=wp.stage("make_dat", "data.txt")
    output: data=wp.out("x.txt")
    shell: "cp {input.data} {output.data}"
''', "rule typo: no stage 'make_dat'"),
    ('''
rule python_block:
    output: data=wp.out("x.txt")
    run:
        open(output.data, "w").close()
''', "rule python_block: a stage rule runs a shell: command"),
    ('''
bad = wp.setting("n")
''', "wp.setting() is used in a rule's input, output or params"),
    ('''
rule cube:
    input: data=wp.stage("make_data", "data.txt")
    output: cubes=wp.out("cubes.txt")
    params: power=wp.setting("power")
    shell: "awk '{{print $1 ^ {params.power}}}' {input.data} > {output.cubes}"
''', "config/config.yaml: stages.cube has no setting 'power' for stage cube, whose rule asks for it "
     "(wp.setting('power')): set it in the config's stages.cube (or an experiment's), or give the rule a default"),
    # A helper's mistake names the Snakefile's line (the rule's output: is line 17 or 16).
    ('''
rule outside:
    input: data=wp.stage("make_data", "data.txt")
    output: data=wp.out("../data.txt")
    shell: "cp {input.data} {output.data}"
''', "workflow/Snakefile, line 17: rule outside: wp.out('../data.txt'): expected a file name inside the stage's "
     "directory"),
    ('''
rule no_dims:
    output: data=wp.out("x.txt", instances=wp.dims())
    shell: "touch {output.data}"
''', "workflow/Snakefile, line 16: rule no_dims: wp.dims(): name at least one dimension"),
    ('''
rule bad_parts:
    output: data=wp.out("x.txt", instances=wp.parts("make_data", "/parts/{part}.txt"))
    shell: "touch {output.data}"
''', "workflow/Snakefile, line 16: rule bad_parts: wp.parts('make_data', '/parts/{part}.txt'): expected a path"),
    ('''
rule bad_per:
    output: data=wp.out("x.txt", instances=wp.grid.per())
    shell: "touch {output.data}"
''', "workflow/Snakefile, line 16: rule bad_per: wp.grid.per(): expected the names of some of the points' "
     "parameters"),
])
def test_a_stage_rule_written_wrong_stops_before_any_job(tmp_path, more, expected):
    own_pipeline(tmp_path, more)
    proc = snakemake(tmp_path, check=False)
    assert proc.returncode != 0 and expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and 'File "' not in proc.stderr, proc.stderr
    assert not (tmp_path / "results").exists()


def test_a_helper_s_mistake_in_an_input_function_is_reported_for_its_job(tmp_path):
    """Called from a function Snakemake calls for a job (not as it reads the
    Snakefile), a helper's error is the job's, in Snakemake's own report."""
    own_pipeline(tmp_path)
    snakefile = tmp_path / "workflow" / "Snakefile"
    snakefile.write_text(snakefile.read_text() + '''
rule late:
    input: lambda wildcards: wp.path_of("nosuch", "x.txt", "e1")
    output: "late.txt"
    shell: "touch {output}"
''')
    proc = snakemake(tmp_path, "late.txt", check=False)
    assert proc.returncode != 0, proc.stderr
    assert "InputFunctionException in rule late" in proc.stderr, proc.stderr
    assert "no stage 'nosuch'" in proc.stderr and not (tmp_path / "late.txt").exists()


def test_a_setting_only_some_experiments_have_is_named_for_a_job_that_lacks_it(tmp_path):
    cube = '''
rule cube:
    input: data=wp.stage("make_data", "data.txt")
    output: cubes=wp.out("cubes.txt")
    params: power=wp.setting("power")
    shell: "awk '{{print $1 ^ {params.power}}}' {input.data} > {output.cubes}"
'''
    own_pipeline(tmp_path, cube, config="experiments:\n  e1: {stages: {cube: {power: 3}}}\n  e2: {}\n")
    proc = snakemake(tmp_path, check=False)
    assert proc.returncode != 0, proc.stderr
    assert "config/config.yaml: experiments.e2 has no setting 'power' for stage cube" in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("results/*/*/cube/cubes.txt"))
    # With the setting for both, both run with their own value.
    (tmp_path / "config" / "config.yaml").write_text(
        "experiments:\n  e1: {stages: {cube: {power: 3}}}\n  e2: {}\nstages:\n  cube: {power: 2}\n")
    snakemake(tmp_path)
    assert (tmp_path / "results/_all/e1/cube/cubes.txt").read_text().split()[-1] == "125"
    assert (tmp_path / "results/_all/e2/cube/cubes.txt").read_text().split()[-1] == "25"


@pytest.mark.parametrize("piece, expected", [
    ("config file", "config/config.yaml: config file not found"),
    ("experiments", "'experiments' is required but missing"),
    ("finish", "never called wp.finish()"),
    ("workers for a cluster pool", "pool 'onprem' is not in"),
    ("axis values", "'points' is required but missing"),
    ("unknown stage", "stages.sqaure: unknown stage 'sqaure' (expected one of the workflow's stages: make_data, square)"),
    ("axis word", "workflow/Snakefile, line 3: Pipeline(axis='bad word'): expected a word of letters"),
])
def test_each_missing_piece_is_one_clear_error(tmp_path, piece, expected):
    own_pipeline(tmp_path)
    snakefile = tmp_path / "workflow" / "Snakefile"
    extra = []
    if piece == "config file":
        (tmp_path / "config" / "config.yaml").unlink()
    elif piece == "experiments":
        (tmp_path / "config" / "config.yaml").write_text("root: results\n")
    elif piece == "finish":
        snakefile.write_text(snakefile.read_text().replace("wp.finish()", ""))
    elif piece == "workers for a cluster pool":
        extra = ["--config", "pool=onprem"]
    elif piece == "axis values":
        snakefile.write_text(snakefile.read_text().replace("Pipeline(config, workflow)",
                                                           'Pipeline(config, workflow, axis="point")'))
    elif piece == "axis word":
        snakefile.write_text(snakefile.read_text().replace("Pipeline(config, workflow)",
                                                           'Pipeline(config, workflow, axis="bad word")'))
    elif piece == "unknown stage":
        (tmp_path / "config" / "config.yaml").write_text("experiments:\n  e1: {}\nstages:\n  sqaure: {}\n")
    proc = snakemake(tmp_path, *extra, check=False)
    assert proc.returncode != 0 and expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr and 'File "' not in proc.stderr
    assert not (tmp_path / "results").exists()
    if piece == "workers for a cluster pool":
        assert "add config/workers.yaml" in proc.stderr


def test_the_workflow_schema_declares_only_its_own_settings(tmp_path):
    own_pipeline(tmp_path, config="experiments:\n  e1: {}\nstages:\n  make_data: {n: many}\n")
    schemas = tmp_path / "workflow" / "schemas"
    schemas.mkdir()
    (schemas / "config.schema.yaml").write_text(
        "properties:\n  stages:\n    properties:\n      make_data:\n        properties:\n"
        "          n: {type: integer, minimum: 1, default: 5}\n")
    proc = snakemake(tmp_path, check=False)
    assert "config/config.yaml: stages.make_data.n: expected integer" in proc.stderr, proc.stderr
    # Engine keys still work on a stage the schema declares, and its default fills in.
    (tmp_path / "config" / "config.yaml").write_text(
        "experiments:\n  e1: {}\nstages:\n  make_data: {policy: {max_attempts: 2}}\n")
    snakemake(tmp_path)
    assert (tmp_path / "results/_all/e1/make_data/data.txt").read_text().split()[-1] == "5"
    # A workflow schema that redefines an engine key is refused, by name.
    (schemas / "config.schema.yaml").write_text("properties:\n  root: {type: integer}\n")
    proc = snakemake(tmp_path, check=False)
    assert "properties.root: the key is waypost's own" in proc.stderr
    shutil.rmtree(tmp_path / "results")
