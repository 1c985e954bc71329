"""`waypost import maestro|merlin`: real sample specs of Maestro and Merlin
(tests/data/specs, as upstream ships them) written as pipelines and run for
real, side by side with what the spec means: the same steps, the same
number of jobs of each, the same commands, the same funnels, and Merlin's
exit-code protocol attempt by attempt."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.conftest import planned, snakemake

SPECS = Path(__file__).resolve().parent / "data" / "specs"

#: A stand-in for `curl -L -o FILE URL` (no network in tests): a tarball of
#: a LULESH whose Makefile (with the lines the spec's sed edits) builds a
#: script that prints its size and iterations.
FAKE_CURL = r"""#!/bin/bash
out=""; while [ $# -gt 0 ]; do case "$1" in -o) out=$2; shift 2;; *) shift;; esac; done
src=$(mktemp -d)
cat > $src/Makefile <<'MK'
CXX = $(MPICXX)
CXXFLAGS = -g -O3 -fopenmp
lulesh2.0:
	printf '#!/bin/bash\necho "size $$2 iterations $$4"\n' > lulesh2.0 && chmod +x lulesh2.0
clean:
	rm -f lulesh2.0
MK
tar -cf "$out" -C $src .
"""


def wp_import(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", "import", *args], cwd=work, capture_output=True,
                          text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def run(work: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return snakemake(work, *args, snakefile=work / "workflow" / "Snakefile", configfile="config/config.yaml",
                     **kwargs)


def jobs_of(work: Path) -> dict[str, int]:
    return planned(work, snakefile=work / "workflow" / "Snakefile", configfile="config/config.yaml")


def spec_copy(tmp_path: Path, kind: str, *names: str) -> Path:
    for name in names:
        shutil.copy(SPECS / kind / name, tmp_path / name)
    return tmp_path


def manifest(stage_dir: Path) -> dict:
    return json.loads((stage_dir / "_manifest.json").read_text())


def test_maestro_lulesh_sample_runs_as_written(tmp_path):
    """Maestro's lulesh_sample1_unix.yaml, unchanged: each step runs as many
    times as Maestro expands it (a step per combination of the parameters it
    names: 9 runs of 9 (SIZE, ITERATIONS), 3 funnels per SIZE, 9 per TRIAL,
    one over all), in its own directory, with its labels."""
    work = spec_copy(tmp_path, "maestro", "lulesh_sample1_unix.yaml")
    out = wp_import(work, "maestro", "lulesh_sample1_unix.yaml").stdout
    assert "6 rule(s) (get_lulesh, make_lulesh, run_lulesh, post_process_lulesh, post_process_lulesh_trials, " \
           "post_process_lulesh_size), 9 point(s)" in out
    assert jobs_of(work) == {"get_lulesh": 1, "make_lulesh": 1, "run_lulesh": 9, "post_process_lulesh": 1,
                             "post_process_lulesh_trials": 9, "post_process_lulesh_size": 3}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text(FAKE_CURL)
    (bin_dir / "curl").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run(work, "--cores", "2", env=env)
    study = work / "sample_output" / "lulesh" / "_all" / "lulesh_sample1"
    runs = sorted(p.name for p in (study / "run_lulesh").iterdir() if not p.name.startswith("."))
    assert runs == [f"SIZE.{s}-ITER.{i}" for s in (10, 20, 30) for i in (10, 20, 30)]
    # $(outfile), a label of labels, names the log in the point's own directory
    assert (study / "run_lulesh" / "SIZE.20-ITER.30" / "SIZE.20.ITER.30.log").read_text() == "size 20 iterations 30\n"
    # the funnel per SIZE lists its run's directory ($(run-lulesh.workspace)) and greps its size's points
    size20 = (study / "post_process_lulesh_size" / "SIZE.20" / "out.log").read_text().splitlines()
    assert size20[1:] == ["SIZE = 20", str((study / "run_lulesh").resolve()), "SIZE.20-ITER.10", "SIZE.20-ITER.20",
                          "SIZE.20-ITER.30"]
    assert (study / "post_process_lulesh_trials" / "TRIAL.4").is_dir()
    again = run(work, "--cores", "2", env=env)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_maestro_pgen_points_replace_the_parameters(tmp_path):
    """--pgen runs the spec's parameter generator (Maestro's interface,
    with --pargs): its points and labels, as a table the config reads."""
    work = spec_copy(tmp_path, "maestro", "lulesh_sample1_unix.yaml", "lulesh_custom_gen.py")
    out = wp_import(work, "maestro", "lulesh_sample1_unix.yaml", "--pgen", "lulesh_custom_gen.py").stdout
    assert "replaced by the points of lulesh_custom_gen.py" in out
    rows = (work / "config" / "points.csv").read_text().splitlines()
    assert rows[:3] == ["TRIAL,SIZE,ITERATIONS", "1,10,10", "2,10,20"] and len(rows) == 10
    config = yaml.safe_load((work / "config" / "config.yaml").read_text())
    assert config["experiments"]["lulesh_sample1"] == {
        "table": "points.csv", "labels": {"TRIAL": "TRIAL.%%", "SIZE": "SIZE.%%", "ITERATIONS": "ITERATIONS.%%"}}
    assert jobs_of(work)["post_process_lulesh_size"] == 3


def test_a_pgen_reads_a_mapping_variable_as_the_yaml_holds_it(tmp_path):
    """A pgen's env.find(NAME).value is the spec's variable as its YAML
    holds it (Maestro's multidimensional-sampling generators read a mapping
    there), and its points run with those values."""
    (tmp_path / "spec.yaml").write_text(textwrap.dedent("""\
        description: {name: sampled, description: points from a dictionary}
        env:
          variables:
            OUTPUT_PATH: ./output
            SAMPLING: {parameters: {X1: [1, 2], X2: [3, 4]}, constants: {X3: 9}}
        study:
          - name: sample
            description: write the point
            run: {cmd: 'echo "$(X1) $(X2) $(X3)" > out.txt'}
        """))
    (tmp_path / "gen.py").write_text(textwrap.dedent("""\
        import itertools
        from maestrowf.datastructures.core import ParameterGenerator

        def get_custom_generator(env, **kwargs):
            sampling = env.find("SAMPLING").value
            names = list(sampling["parameters"])
            rows = list(itertools.product(*sampling["parameters"].values()))
            gen = ParameterGenerator()
            for i, name in enumerate(names):
                gen.add_parameter(name, [row[i] for row in rows], name + ".%%")
            for name, value in sampling["constants"].items():
                gen.add_parameter(name, [value] * len(rows), name + ".%%")
            return gen
        """))
    wp_import(tmp_path, "maestro", "spec.yaml", "--pgen", "gen.py")
    assert (tmp_path / "config" / "points.csv").read_text().splitlines() == [
        "X1,X2,X3", "1,3,9", "1,4,9", "2,3,9", "2,4,9"]
    run(tmp_path, "--cores", "2")
    written = sorted(p.read_text().strip() for p in (tmp_path / "output").rglob("out.txt"))
    assert written == ["1 3 9", "1 4 9", "2 3 9", "2 4 9"]


def test_maestro_restart_after_a_timeout_and_placements(tmp_path):
    """A step's walltime is its runtime; its restart: runs after a timeout
    in the same directory; $(WORKSPACE), $(SPECROOT), variables naming
    variables, nodes/procs as a worker class, $(LAUNCHER) as the
    Snakefile's name."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "solve.sh").write_text("echo solved $1 > $2\n")
    (tmp_path / "study.yaml").write_text(textwrap.dedent("""\
        description: {name: slow, description: a step that times out and restarts}
        env:
          variables:
            TOOLS: $(SPECROOT)/tools
            SOLVER: $(TOOLS)/solve.sh
        study:
          - name: solve
            description: times out once, then restarts from its checkpoint
            run:
              cmd: |
                echo started > $(WORKSPACE)/checkpoint
                sleep 60
              restart: |
                $(LAUNCHER) bash $(SOLVER) $(N) result.txt
                cat checkpoint >> result.txt
              walltime: "00:00:02"
              nodes: 1
              procs: 2
        global.parameters:
          N: {values: [1, 2], label: N.%%}
        """))
    out = wp_import(tmp_path, "maestro", "study.yaml").stdout
    assert "$(LAUNCHER): the Snakefile's LAUNCHER, empty" in out
    workers = yaml.safe_load((tmp_path / "config" / "workers.yaml").read_text())
    assert workers["pools"]["onprem"]["classes"]["n1-p2"]["extra"] == "--nodes=1 --ntasks=2"
    assert workers["pools"]["local"]["classes"]["n1-p2"]["cpus"] == 2
    assert 'resources: worker="n1-p2"' in (tmp_path / "workflow" / "Snakefile").read_text()
    run(tmp_path, "--cores", "2")
    point = tmp_path / "studies" / "_all" / "slow" / "solve" / "N.2"
    assert (point / "result.txt").read_text() == "solved 2\nstarted\n"
    attempts = manifest(point)["attempts"]
    assert [(a["action"], a["state"]) for a in attempts] == [("cmd", "TIMEOUT"), ("restart", "SUCCESS")]


def test_merlin_restart_example_follows_its_exit_codes(tmp_path):
    """Merlin's restart example, unchanged, with its samples given as a
    CSV (--samples, Merlin's --samplesfile): $(MERLIN_RESTART) runs the
    command again in place, $(MERLIN_RETRY) too, a restart: block when the
    step has one; the funnel over every sample's steps (`runs*`) runs once."""
    work = spec_copy(tmp_path, "merlin", "restart.yaml")
    (work / "samples.csv").write_text("0.1,0.2\n0.3,0.4\n0.5,0.6\n")
    out = wp_import(work, "merlin", "restart.yaml", "--samples", "samples.csv").stdout
    assert "merlin.resources.workers and the steps' task_queue: Celery's workers and queues are not needed" in out
    assert jobs_of(work) == {"build": 1, "runs": 3, "runs_rt": 3, "runs_rs": 3, "data": 1}
    run(work, "--cores", "2")
    study = work / "studies" / "_all" / "restart"
    for stage, actions in (("runs", ["cmd", "restart"]), ("runs_rt", ["cmd", "rerun"]),
                           ("runs_rs", ["cmd", "restart"])):
        points = sorted(p for p in (study / stage).iterdir() if not p.name.startswith("."))
        assert len(points) == 3
        for point in points:
            attempts = manifest(point)["attempts"]
            assert [a["action"] for a in attempts] == actions, (point, attempts)
            assert [a["state"] for a in attempts] == ["FAILED", "SUCCESS"]
            assert attempts[0]["exit_code"] == (104 if stage == "runs_rt" else 100)
    log = (study / "runs_rs" / "sample1-V1.0.3-V2.0.4" / "_logs" / "attempt-2.log").read_text()
    assert f"{(study / 'build').resolve()}/mpi_hello 0.3 0.4" in log
    assert (study / "data" / "step.done").exists()


MERLIN_PROTOCOL = """\
description: {name: protocol, description: every exit code}
env:
  variables: {N_SAMPLES: 4}
study:
  - name: solve
    run:
      cmd: |
        echo "$(X)" > value.txt
        case $(X) in
          soft) exit $(MERLIN_SOFT_FAIL) ;;
          plain) exit 3 ;;
          hard) sleep 1; exit $(MERLIN_HARD_FAIL) ;;
        esac
        exit $(MERLIN_SUCCESS)
      max_retries: 2
  - name: gather
    run:
      cmd: cat $(solve.workspace)/$(MERLIN_GLOB_PATH)/value.txt | sort > all.txt
      depends: [solve_*]
merlin:
  samples:
    generate:
      cmd: printf "ok\\nsoft\\nplain\\n" > $(MERLIN_INFO)/samples.csv
    file: $(MERLIN_INFO)/samples.csv
    column_labels: [X]
"""


def test_merlin_soft_failures_go_on_and_a_hard_failure_stops_the_run(tmp_path):
    """A soft failure, or any other status, ends that sample's step and the
    study goes on (the funnel runs over it); $(MERLIN_HARD_FAIL) stops the
    run: no new job starts. The samples come from the spec's generate
    command, which the import runs as Merlin does."""
    (tmp_path / "protocol.yaml").write_text(MERLIN_PROTOCOL)
    out = wp_import(tmp_path, "merlin", "protocol.yaml").stdout
    assert "merlin.samples.generate.cmd: printf" in out and "3 point(s)" in out
    assert "$(MERLIN_GLOB_PATH) is *" in out
    run(tmp_path, "--cores", "1")   # (the funnel accepts failed parents: the run goes on)
    study = tmp_path / "studies" / "_all" / "protocol"
    assert (study / "gather" / "all.txt").read_text() == "ok\nplain\nsoft\n"
    states = {p.name: manifest(p)["attempts"][-1]["state"] for p in (study / "solve").iterdir()
              if not p.name.startswith(".")}
    assert states == {"sample0-Xok": "SUCCESS", "sample1-Xsoft": "FAILED", "sample2-Xplain": "FAILED"}

    # a hard failure: the run starts nothing after it
    shutil.rmtree(tmp_path / "studies")
    (tmp_path / "config" / "points.csv").write_text("sample,X\n0,hard\n1,ok\n")
    proc = run(tmp_path, "--cores", "1", check=False)
    assert proc.returncode != 0
    assert not (study / "gather").exists()
    hard = manifest(study / "solve" / "sample0-Xhard")
    assert hard["stopped_run"]


def test_a_step_named_as_the_snakefiles_own_names_is_renamed(tmp_path):
    """A step called `all` or `config`, a variable called `workflow`: the
    Snakefile keeps its own names, and the study still runs."""
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""\
        description: {name: names}
        env: {variables: {workflow: flows, OUTPUT_PATH: out}}
        study:
          - {name: all, run: {cmd: "echo $(workflow) > w.txt"}}
          - {name: config, run: {cmd: "cat $(all.workspace)/w.txt > c.txt", depends: [all]}}
        """))
    out = wp_import(tmp_path, "maestro", "s.yaml").stdout
    assert "2 rule(s) (step_all, step_config)" in out
    run(tmp_path, "--cores", "1")
    assert (tmp_path / "out" / "_all" / "names" / "step_config" / "c.txt").read_text() == "flows\n"


def test_merlin_feature_demo_plans_as_merlin_expands_it(tmp_path):
    """feature_demo: per-sample steps (they name a sample's column) and the
    steps after them once (Merlin doesn't inherit samples); a step in
    python runs through its interpreter."""
    work = spec_copy(tmp_path, "merlin", "feature_demo.yaml")
    (work / "samples.tab").write_text("0.1 0.2\n0.3 0.4\n")
    wp_import(work, "merlin", "feature_demo.yaml", "--samples", "samples.tab")
    assert jobs_of(work) == {"hello": 2, "collect": 1, "translate": 1, "learn": 1, "make_new_samples": 1,
                             "predict": 1, "verify": 1, "python3_hello": 1, "python2_hello": 1}
    snakefile = (work / "workflow" / "Snakefile").read_text()
    assert "/usr/bin/env python3 <<'WAYPOST_STEP' && touch {output.done}" in snakefile
    assert 'HELLO = f"{SCRIPTS}/hello_world.py"' in snakefile
    run(work, "--cores", "1", "studies/_all/feature_demo/python3_hello/X2.0.5/step.done")
    log = work / "studies" / "_all" / "feature_demo" / "python3_hello" / "X2.0.5" / "_logs" / "attempt-1.log"
    assert log.read_text() == "OMG is this in python?\nVariable X2 is 0.5\n"


@pytest.mark.parametrize("case, expected", [
    ("missing", "nope.yaml: can't be read"),
    ("unknown-parent", "study[1] (b): depends: 'c' is not a step of the study (its steps: a, b)"),
    ("lengths", "global.parameters: every parameter has one value per point (lists of one length); these are: "
                "P 2, Q 1"),
    ("not-a-spec", "expected a Maestro spec: a mapping with a `study:` list of steps"),
    ("exists", "workflow/Snakefile: exists; nothing was written"),
    ("same-rule", "study[1] (a_b): the step 'a_b' and 'a-b' both as rule a_b: name steps apart"),
])
def test_a_spec_that_cant_be_imported_is_one_line_and_writes_nothing(tmp_path, case, expected):
    spec = {"description": {"name": "s"},
            "study": [{"name": "a", "run": {"cmd": "echo $(P) $(Q)"}},
                      {"name": "b", "run": {"cmd": "echo", "depends": ["c" if case == "unknown-parent" else "a"]}}],
            "global.parameters": {"P": {"values": [1, 2], "label": "P.%%"},
                                  "Q": {"values": [1] if case == "lengths" else [1, 2], "label": "Q.%%"}}}
    if case == "not-a-spec":
        spec = {"description": {"name": "s"}}
    if case == "same-rule":
        spec["study"] = [{"name": "a-b", "run": {"cmd": "echo"}}, {"name": "a_b", "run": {"cmd": "echo"}}]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    if case == "exists":
        (tmp_path / "workflow").mkdir()
        (tmp_path / "workflow" / "Snakefile").write_text("# mine\n")
    proc = wp_import(tmp_path, "maestro", "nope.yaml" if case == "missing" else "s.yaml", check=False)
    assert proc.returncode == 2
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "config").exists()
    if case == "exists":
        assert (tmp_path / "workflow" / "Snakefile").read_text() == "# mine\n"
