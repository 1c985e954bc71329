"""Plain Snakemake idioms work unchanged in a waypost Snakefile, side by
side with plain Snakemake: the Snakefile's globals in a shell command (and in
a policy's restart command), and a Snakefile that reads its config while it
is loaded, under every waypost command that reads the workflow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

# Globals, one of them defined only after the rules (Snakemake formats a
# command when its job runs), one quoted with :q, and some with the names
# of the helpers a step's run function uses (they must not shadow the
# Snakefile's): each is what plain Snakemake puts in the command.
PREAMBLE = 'colour = "teal"\nshade = "deep sea"\nstep = "mine"\nrunner = "yours"\nmirror = "glass"\n'
LATE = 'finale = "coda"\n'
COMMAND = ("echo {colour} {shade:q} {step} {runner} {mirror} {finale} {params.size} "
           "{wildcards.instance} {rule} > {output}")


def _snakefile(waypost: bool) -> str:
    if waypost:
        return ("from waypost.snakemake import Pipeline\nwp = Pipeline(config, workflow)\n" + PREAMBLE
                + "\nrule paint:\n    output: wp.out('out.txt', instances=['i7'])\n    params: size=4\n"
                f"    shell: {json.dumps(COMMAND)}\n\nwp.finish()\n\n"
                "rule all:\n    default_target: True\n    input: wp.targets\n\n" + LATE)
    return (PREAMBLE + "\nrule all:\n    input: 'plain/i7/out.txt'\n\n"
            "rule paint:\n    output: 'plain/{instance}/out.txt'\n    params: size=4\n"
            f"    shell: {json.dumps(COMMAND)}\n\n" + LATE)


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    from conftest import LOCAL_PROFILE
    profile = ["--profile", str(LOCAL_PROFILE)] if (workdir / "config").exists() else []
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--cores", "1",
                           *profile, *args], cwd=workdir, capture_output=True, text=True, timeout=300)


def _pipeline(workdir: Path, snakefile: str, config: dict | None) -> Path:
    (workdir / "workflow").mkdir(parents=True)
    (workdir / "workflow" / "Snakefile").write_text(snakefile)
    if config is not None:
        (workdir / "config").mkdir()
        (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return workdir


def test_snakefile_globals_in_a_shell_command_are_as_in_plain_snakemake(tmp_path):
    plain = _pipeline(tmp_path / "plain", _snakefile(False), None)
    wp = _pipeline(tmp_path / "wp", _snakefile(True), {"root": "results", "experiments": {"e1": {}}})
    ran_plain, ran_wp = _snakemake(plain), _snakemake(wp)
    assert ran_plain.returncode == 0, ran_plain.stderr[-3000:]
    assert ran_wp.returncode == 0, ran_wp.stderr[-3000:]
    expected = (plain / "plain" / "i7" / "out.txt").read_text()
    assert expected == "teal deep sea mine yours glass coda 4 i7 paint\n"
    stage = wp / "results" / "_all" / "e1" / "paint" / "i7"
    assert (stage / "out.txt").read_text() == expected
    assert json.loads((stage / "_manifest.json").read_text())["state"] == "SUCCESS"


def test_a_name_no_one_defined_fails_as_in_plain_snakemake(tmp_path):
    """An unknown name is still the rule's error, as Snakemake says it."""
    bad = COMMAND.replace("{colour}", "{nowhere_defined}")
    plain = _pipeline(tmp_path / "plain", _snakefile(False).replace(COMMAND, bad), None)
    wp = _pipeline(tmp_path / "wp", _snakefile(True).replace(COMMAND, bad),
                   {"root": "results", "experiments": {"e1": {}}})
    ran_plain, ran_wp = _snakemake(plain), _snakemake(wp)
    assert ran_plain.returncode != 0 and ran_wp.returncode != 0
    assert "The name 'nowhere_defined' is unknown in this context" in ran_plain.stderr
    assert "The name 'nowhere_defined' is unknown in this context" in ran_wp.stderr, ran_wp.stderr[-3000:]


RESUMING = '''from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)
motto = "carry on"

rule resume:
    output: wp.out("out.txt")
    shell: "exit 100"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def test_a_restart_command_sees_the_snakefiles_globals(tmp_path):
    policy = {"max_attempts": 2, "restart": "echo {motto:q} {step} > {output}",
              "cues": [{"action": "restart", "when": "cmd.exit == 100"}]}
    wp = _pipeline(tmp_path, RESUMING.replace('motto = "carry on"', 'motto = "carry on"\nstep = "second"'),
                   {"root": "results", "experiments": {"e1": {}}, "stages": {"resume": {"policy": policy}}})
    ran = _snakemake(wp)
    assert ran.returncode == 0, ran.stderr[-3000:]
    stage = wp / "results" / "_all" / "e1" / "resume"
    assert (stage / "out.txt").read_text() == "carry on second\n"
    attempts = json.loads((stage / "_manifest.json").read_text())["attempts"]
    assert [(a["action"], a["state"]) for a in attempts] == [("cmd", "FAILED"), ("restart", "SUCCESS")], attempts


# A Snakefile that reads its config while Snakemake loads it: before
# ``Pipeline`` (the config its ``configfile:`` loaded) and after (as waypost
# prepared it), at the top level, as many real Snakefiles do.
READS_CONFIG = '''configfile: "config/config.yaml"
assert config["experiments"]["north"]["sizes"], "the config names no sizes"
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)
SIZES = config["experiments"]["north"]["sizes"]
LABEL = config["label"]

rule measure:
    output: wp.out("sizes.txt")
    params: sizes=SIZES
    shell: "echo {params.sizes} {LABEL} > {output}"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''
READS_CONFIG_SCHEMA = {"properties": {"label": {"type": "string"}, "experiments": {"additionalProperties": {
    "properties": {"sizes": {"type": "array", "items": {"type": "integer"}}}}}}}


def _reads_config(workdir: Path) -> Path:
    _pipeline(workdir, READS_CONFIG, {"root": "results", "label": "tidal",
                                       "experiments": {"north": {"sizes": [3, 5]}}})
    (workdir / "workflow" / "schemas").mkdir()
    (workdir / "workflow" / "schemas" / "config.schema.yaml").write_text(yaml.safe_dump(READS_CONFIG_SCHEMA))
    return workdir


def _waypost(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    command, *rest = args
    return subprocess.run([sys.executable, "-m", "waypost.cli", command, "--config", "config/config.yaml",
                           "--workflow", "workflow", *rest], cwd=workdir, capture_output=True, text=True,
                          timeout=300)


def test_a_snakefile_that_reads_its_config_when_loaded_works_with_every_command(tmp_path):
    work = _reads_config(tmp_path)
    for command in ("plan", "status", "run", "status", "plan"):
        done = _waypost(work, command)
        assert done.returncode == 0, f"waypost {command}:\n{done.stdout}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr
        (work / ".waypost" / "stages.json").unlink(missing_ok=True)   # each command reads the rules again
    stage = work / "results" / "_all" / "north" / "measure"
    assert (stage / "sizes.txt").read_text() == "3 5 tidal\n"


def test_a_config_that_cant_be_loaded_is_one_line_naming_the_file(tmp_path):
    work = _reads_config(tmp_path)
    (work / "config" / "config.yaml").write_text("root: results\nexperiments: {north: [\n")
    for command in ("plan", "status", "run"):
        done = _waypost(work, command)
        text = done.stdout + done.stderr
        assert done.returncode != 0
        assert "Traceback" not in text, text
        assert "config/config.yaml" in text, text
