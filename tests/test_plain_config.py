"""A pipeline's config stays its own, and the ``waypost`` commands read the
workflow as ``snakemake`` reads it (issue 54, points 5 and 6): the same
working directory, profiles (global and workflow, with their ``config:``)
and the ``configfile:`` the Snakefile names; no waypost key is needed, the
pipeline's own keys and schema are never waypost's, and the ``config`` a
rule sees is plain Snakemake's, byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

WAYPOST_LINES = ("from waypost.snakemake import Pipeline", "wp = Pipeline(config, workflow)", "wp.finish()")

# A Snakefile in its own layout that reads a data file (relative to the
# working directory, as the RNA-seq workflow reads its cells.tsv) and one
# of its config's keys while it loads, and a rule that writes its config out.
SNAKEFILE = """\
configfile: "config.yaml"
{import_line}
{pipeline_line}

CELLS = [line.split()[0] for line in open("cells.tsv")]
DEPS = config["deps"]

rule all:
    input: expand("out/{{cell}}.txt", cell=CELLS), "out/config.json"

rule make:
    output: "out/{{cell}}.txt"
    shell: "echo {{wildcards.cell}} {DEPS} > {{output}}"

rule dump:
    output: "out/config.json"
    run:
        import json
        with open(output[0], "w") as f:
            json.dump(config, f, sort_keys=True, default=str)

{finish_line}
"""


def _pipeline(directory: Path, config: str, with_waypost: bool = True) -> Path:
    directory.mkdir(parents=True)
    lines = WAYPOST_LINES if with_waypost else ("", "", "")
    (directory / "Snakefile").write_text(SNAKEFILE.format(
        import_line=lines[0], pipeline_line=lines[1], finish_line=lines[2], DEPS="{DEPS}"))
    (directory / "cells.tsv").write_text("c1\t10\nc2\t20\n")
    (directory / "config.yaml").write_text(config)
    return directory


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "-c1", *args], cwd=workdir,
                          capture_output=True, text=True, timeout=300)


def _waypost(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waypost.cli", *args], cwd=workdir, capture_output=True,
                          text=True, timeout=300)


def _ran(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_no_waypost_key_records_every_job_and_the_commands_need_no_config_option(tmp_path):
    wp = _pipeline(tmp_path / "wp", "deps: /opt/deps\nexperiment: mine\n")
    _ran(_snakemake(wp))
    records = wp / ".waypost" / "records" / "_all" / "default"
    assert sorted(p.parent.relative_to(records).as_posix() for p in records.rglob("_manifest.json")) == \
        ["dump", "make/c1", "make/c2"]
    # The commands read the workflow afresh (no recorded reading, the config
    # just edited): in the working directory, where cells.tsv is, and with
    # the config file its configfile: names, without --config.
    (wp / ".waypost" / "stages.json").unlink()
    (wp / "config.yaml").write_text("deps: /opt/deps\nexperiment: mine\n# edited\n")
    status = _ran(_waypost(wp, "status"))
    assert "experiment default  (root .waypost/records)" in status and "done 2" in status
    _ran(_waypost(wp, "rerun", "make", "--instance", "c1"))
    assert not (wp / "out" / "c1.txt").exists() and (records / "make" / "c1" / ".attempts" / "1").is_dir()
    (wp / "out" / "c1.txt").write_text("by hand\n")
    (wp / "Snakefile").touch()
    _ran(_waypost(wp, "adopt", "make", "--experiment", "default", "--wildcards", "cell=c1"))
    assert "adopted" in _ran(_waypost(wp, "status")).lower()
    assert "snakemake exited 0" in _ran(_waypost(wp, "cron"))


def test_the_workflow_profiles_config_gives_waypost_its_root_and_the_pipeline_its_keys(tmp_path):
    """The translation pipeline's root= and deps= come from its workflow
    profile's ``config:``: the commands see them as the run does."""
    wp = _pipeline(tmp_path / "wp", "experiment: mine\n")
    (wp / "profiles" / "default").mkdir(parents=True)
    (wp / "profiles" / "default" / "config.yaml").write_text(
        'config:\n  - deps=/opt/deps\n  - root=/data/pipeline\n  - \'waypost={"root": "recs"}\'\n')
    _ran(_snakemake(wp))
    assert (wp / "recs" / "_all" / "default" / "make" / "c1" / "_manifest.json").is_file()
    assert (wp / "out" / "c1.txt").read_text() == "c1 /opt/deps\n"
    (wp / ".waypost" / "stages.json").unlink()
    status = _ran(_waypost(wp, "status"))
    assert "(root recs)" in status and "done 2" in status, status
    plan = _ran(_waypost(wp, "plan"))
    assert "nothing to do" in plan, plan


@pytest.mark.parametrize("waypost_keys, experiment", [("waypost:\n  experiments: {trial: {}}\n", "trial"),
                                                      ("", "default")])
def test_a_rule_writing_its_config_out_writes_what_plain_snakemake_writes(tmp_path, waypost_keys, experiment):
    config = "deps: /opt/deps\nexperiment: mine\nthreshold: 0.5\n" + waypost_keys
    runs = {}
    for name, with_waypost in (("plain", False), ("wp", True)):
        workdir = _pipeline(tmp_path / name, config, with_waypost)
        _ran(_snakemake(workdir, "--config", "threshold=0.7", "extra={a: 1}"))
        runs[name] = (workdir / "out" / "config.json").read_bytes()
    assert runs["wp"] == runs["plain"]
    assert json.loads(runs["plain"])["threshold"] == 0.7
    assert (tmp_path / "wp" / ".waypost" / "records" / "_all" / experiment / "dump" / "_manifest.json").is_file()


def test_the_pipelines_own_key_near_a_waypost_key_is_kept_and_only_said(tmp_path):
    """A config with waypost's keys at its top level (as the reference
    pipeline's) may hold the pipeline's own ``experiment:``: it is not
    refused as a typo of ``experiments``, only said."""
    wp = _pipeline(tmp_path / "wp", "deps: /opt/deps\nexperiment: mine\nexperiments: {baseline: {}}\nroot: rec\n")
    said = _ran(_snakemake(wp))
    assert "waypost: config.yaml: experiment: taken as the pipeline's own key, not waypost's 'experiments'" in said
    assert "Traceback" not in said
    assert (wp / "rec" / "_all" / "baseline" / "make" / "c1" / "_manifest.json").is_file()


@pytest.mark.parametrize("config", ["deps: /opt/deps\nwaypost: {workers: workers.yaml, pool: mine}\n",
                                    "deps: /opt/deps\nexperiments: {e: {}}\nworkers: workers.yaml\npool: mine\n"])
def test_a_config_in_a_subdirectory_finds_its_workers_file_beside_it(tmp_path, config):
    wp = _pipeline(tmp_path / "wp", "")
    (wp / "Snakefile").write_text((wp / "Snakefile").read_text().replace('configfile: "config.yaml"',
                                                                          'configfile: "conf/config.yaml"'))
    (wp / "conf").mkdir()
    (wp / "conf" / "config.yaml").write_text(config)
    (wp / "conf" / "workers.yaml").write_text(
        "pools:\n  mine:\n    executor: local\n    classes:\n      cpu: {cpus: 1, mem_mb: 500, runtime: 5}\n")
    _ran(_snakemake(wp, "-n"))
    table = _waypost(wp, "workers", "--json")
    _ran(table)
    assert set(json.loads(table.stdout)["classes"]) == {"cpu"}, table.stdout


def test_two_configs_naming_one_experiment_dont_overwrite_each_others_records(tmp_path):
    wp = _pipeline(tmp_path / "wp", "deps: /opt/deps\n")
    _ran(_snakemake(wp))
    (wp / "other.yaml").write_text("deps: /opt/other\n")
    refused = _snakemake(wp, "--configfile", "other.yaml", "--forceall")
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert ("experiment 'default' under .waypost/records has records made with config.yaml, and this run "
            "reads other.yaml: give this config an experiment of its own") in said, said
    assert (wp / "out" / "c1.txt").read_text() == "c1 /opt/deps\n"
    (wp / "other.yaml").write_text("deps: /opt/other\nwaypost: {experiments: {other: {}}}\n")
    _ran(_snakemake(wp, "--configfile", "other.yaml", "--forceall"))
    assert (wp / ".waypost" / "records" / "_all" / "other" / "make" / "c1" / "_manifest.json").is_file()


@pytest.mark.parametrize("with_waypost", [False, True])
def test_the_pipelines_own_schema_is_its_own(tmp_path, with_waypost):
    """The RNA-seq workflow's schema (workflow/schemas/config.schema.yaml)
    lists some of its keys, not all, and the Snakefile validates its config
    with it: its other keys pass, its wrong values are refused by its own
    validation, as in plain Snakemake."""
    wp = _pipeline(tmp_path / "wp", "deps: /opt/deps\nsamples: 3\nunlisted: yes\nexperiments: {e: {}}\n",
                   with_waypost)
    (wp / "schemas").mkdir()
    (wp / "schemas" / "config.schema.yaml").write_text(
        '$schema: "https://json-schema.org/draft/2020-12/schema"\n'
        "properties:\n  samples: {type: integer}\n  deps: {type: string}\nrequired: [samples]\n")
    text = (wp / "Snakefile").read_text()
    (wp / "Snakefile").write_text(text.replace('configfile: "config.yaml"\n', 'configfile: "config.yaml"\n'
                                  'from snakemake.utils import validate\nvalidate(config, "schemas/config.schema.yaml")\n'))
    _ran(_snakemake(wp, "-n"))
    (wp / "config.yaml").write_text("deps: /opt/deps\nsamples: many\nexperiments: {e: {}}\n")
    refused = _snakemake(wp, "-n")
    assert refused.returncode != 0 and "'many' is not of type 'integer'" in refused.stdout + refused.stderr
