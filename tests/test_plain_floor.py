"""Plain Snakemake is the floor: a Snakefile with waypost's lines added
never moves a file its job did not write, and a job run again starts where
plain Snakemake starts it (its declared outputs removed, what else it wrote
in place, so a trainer resumes from its checkpoints). Each side by side
with the same Snakefile without waypost's lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LOCAL_PROFILE

WAYPOST_LINES = ("from waypost.snakemake import Pipeline\nwp = Pipeline(config, workflow)\n", "\nwp.finish()\n")


def workflow(tmp_path: Path, name: str, rules: str, files: dict[str, str], waypost: bool) -> Path:
    """A work directory with a Snakefile of ``rules`` (with or without
    waypost's lines), a config and ``files``."""
    workdir = tmp_path / name
    workdir.mkdir()
    head, tail = WAYPOST_LINES if waypost else ("", "")
    (workdir / "Snakefile").write_text('configfile: "config.yaml"\n' + head + rules + tail)
    (workdir / "config.yaml").write_text("root: results\nexperiments: {e1: {}}\n" if waypost else "x: 1\n")
    for path, text in files.items():
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_text(text)
    return workdir


def run(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--profile", str(LOCAL_PROFILE), "-c1", *args],
                          cwd=workdir, capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc


def waypost(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", *args, "--config", "config.yaml"],
                          cwd=workdir, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def files(workdir: Path) -> dict[str, str]:
    """The work directory's files (not Snakemake's, nor the records) and their text."""
    found = {}
    for path in sorted(workdir.rglob("*")):
        rel = path.relative_to(workdir)
        if path.is_file() and rel.parts[0] not in (".snakemake", "results", ".waypost") \
                and rel.name != "config.yaml" and rel.name != "Snakefile":
            found[str(rel)] = path.read_text()
    return found


MAKE = """
rule make:
    input: "data.in"
    output: "result.txt"
    shell: "cat {input} > {output}; echo made > side.txt"
"""


@pytest.mark.parametrize("waypost_lines", [False, True], ids=["plain", "waypost"])
def test_a_rule_writing_into_the_working_directory_moves_nothing_it_did_not_write(tmp_path, waypost_lines):
    workdir = workflow(tmp_path, "w", MAKE, {"data.in": "hello\n", "notes.txt": "mine\n"}, waypost_lines)
    snakefile = (workdir / "Snakefile").read_text()
    run(workdir)
    assert files(workdir) == {"data.in": "hello\n", "notes.txt": "mine\n", "result.txt": "hello\n",
                              "side.txt": "made\n"}
    assert (workdir / "Snakefile").read_text() == snakefile and (workdir / "config.yaml").exists()
    if not waypost_lines:
        return
    record = workdir / "results/_all/e1/make"
    assert not (record / ".attempts").exists()
    manifest = json.loads((record / "_manifest.json").read_text())
    # Its side file is what appeared while it ran: not the Snakefile, the config, the input, the notes.
    assert [o["path"] for o in manifest["outputs"] if o.get("side")] == ["side.txt"]
    assert manifest["attempts"][0]["wrote"] == ["side.txt"]

    # Asked for again: it runs in place, as plain Snakemake runs it.
    (workdir / "result.txt").unlink()
    run(workdir)
    assert files(workdir)["result.txt"] == "hello\n" and not (record / ".attempts").exists()

    # `waypost rerun` archives what the job wrote, and only that.
    waypost(workdir, "rerun", "make")
    archived = record / ".attempts/1"
    assert sorted(p.name for p in archived.iterdir() if p.is_file()) == ["_manifest.json", "result.txt", "side.txt"]
    assert files(workdir) == {"data.in": "hello\n", "notes.txt": "mine\n"}
    assert (workdir / "Snakefile").read_text() == snakefile


# A trainer that resumes from the checkpoint it keeps beside its model, in a
# directory only its job writes; with a STOP file it dies by SIGKILL mid-way.
TRAIN = r"""
rule train:
    input: "corpus.txt"
    output: "models/{lang}/model.bin"
    shell:
        "n=$(cat models/{wildcards.lang}/ckpt 2>/dev/null || echo 0); n=$((n + 1)); "
        "echo $n > models/{wildcards.lang}/ckpt; "
        "if [ -e STOP ]; then kill -9 $$; fi; "
        "echo trained from checkpoint $n > {output}"
"""


@pytest.mark.parametrize("waypost_lines", [False, True], ids=["plain", "waypost"])
def test_a_deleted_model_and_a_killed_trainer_resume_from_the_checkpoints_as_in_plain_snakemake(
        tmp_path, waypost_lines):
    workdir = workflow(tmp_path, "w", TRAIN, {"corpus.txt": "text\n"}, waypost_lines)
    model = workdir / "models/de/model.bin"
    run(workdir, "models/de/model.bin")
    assert model.read_text() == "trained from checkpoint 1\n"

    # The model deleted and asked for again: the trainer resumes from its checkpoint.
    model.unlink()
    run(workdir, "models/de/model.bin")
    assert model.read_text() == "trained from checkpoint 2\n"

    # Only the trainer killed (SIGKILL): the next run resumes it in place too.
    model.unlink()
    (workdir / "STOP").touch()
    assert run(workdir, "models/de/model.bin", check=False).returncode != 0
    assert not model.exists() and (workdir / "models/de/ckpt").read_text() == "3\n"
    (workdir / "STOP").unlink()
    run(workdir, "models/de/model.bin")
    assert model.read_text() == "trained from checkpoint 4\n"
    assert files(workdir) == {"corpus.txt": "text\n", "models/de/ckpt": "4\n",
                              "models/de/model.bin": "trained from checkpoint 4\n"}
    if waypost_lines:
        record = workdir / "results/_all/e1/train/de"
        assert not (record / ".attempts").exists()
        manifest = json.loads((record / "_manifest.json").read_text())
        assert [(a["series"], a["action"], a["state"]) for a in manifest["attempts"]] == [
            (1, "cmd", "SUCCESS"), (2, "cmd", "SUCCESS"), (3, "cmd", "HWFAILURE"), (4, "restart", "SUCCESS")]
        assert [o["path"] for o in manifest["outputs"]] == ["model.bin", "ckpt"]


FAILS_ONCE = r"""
rule make:
    input: "data.in"
    output: "out/result.txt"
    shell:
        "if [ -e out/partial.txt ]; then echo found > out/found.txt; fi; echo partial > out/partial.txt; "
        "test -e seen || {{ touch seen; exit 1; }}; cat {input} > {output}"
"""


def test_a_clean_rerun_removes_only_what_the_job_wrote(tmp_path):
    workdir = workflow(tmp_path, "w", FAILS_ONCE, {"data.in": "x\n", "out/readme.txt": "by hand\n"}, True)
    (workdir / "config.yaml").write_text(
        "root: results\nexperiments: {e1: {}}\npolicy: {max_attempts: 2, rerun: clean, "
        "cues: [{action: rerun, when: cmd.FAILED}]}\n")
    run(workdir)
    manifest = json.loads((workdir / "results/_all/e1/make/_manifest.json").read_text())
    assert [(a["action"], a["state"]) for a in manifest["attempts"]] == [("cmd", "FAILED"), ("rerun", "SUCCESS")]
    # The clean rerun removed what the failed attempt wrote, never the file made by hand.
    assert files(workdir) == {"data.in": "x\n", "seen": "", "out/readme.txt": "by hand\n",
                              "out/partial.txt": "partial\n", "out/result.txt": "x\n"}
    assert [o["path"] for o in manifest["outputs"] if o.get("side")] == ["partial.txt"]


RETRIED = """
rule flaky:
    output: "out.txt"
    retries: 2
    resources: fails=lambda wildcards, attempt: attempt < 3
    shell: "echo try >> tries.log; test {resources.fails} = False; echo ok > {output}"
"""


def test_a_rules_own_retries_run_the_failed_job_again_as_in_plain_snakemake(tmp_path):
    """``retries: 2``: Snakemake runs a failed job twice more; each is one
    more attempt of the job's series (not refused as a series the policy
    ended)."""
    plain = workflow(tmp_path, "plain", RETRIED, {}, waypost=False)
    wp = workflow(tmp_path, "wp", RETRIED, {}, waypost=True)
    run(plain)
    run(wp)
    assert files(wp) == files(plain) == {"out.txt": "ok\n", "tries.log": "try\ntry\ntry\n"}
    record = json.loads((wp / "results/_all/e1/flaky/_manifest.json").read_text())
    assert record["state"] == "SUCCESS"
    assert [(a["series"], a["state"]) for a in record["attempts"]] == [(1, "FAILED"), (1, "FAILED"), (1, "SUCCESS")]


COUNTED = """
import os
def counted(wildcards):
    with open("calls.log", "a") as log:
        log.write(wildcards.i + "\\n")
    return 2

rule all:
    input: expand("out/{i}.txt", i=range(3))

rule scaled:
    output: "out/{i}.txt"
    params: scale=counted
    script: "scale.py"
"""


def test_a_script_rules_params_function_is_called_as_often_as_in_plain_snakemake(tmp_path):
    """Waypost's record of a ``script:`` job's code (its rerun triggers)
    once asked the job for its params while they were being expanded:
    the params function ran again and again, to Python's recursion limit."""
    calls = {}
    for waypost_lines in (False, True):
        workdir = workflow(tmp_path, f"w{waypost_lines}", COUNTED, {
            "scale.py": "open(snakemake.output[0], 'w').write(str(snakemake.params.scale))\n"}, waypost_lines)
        run(workdir)
        assert (workdir / "out/2.txt").read_text() == "2"
        calls[waypost_lines] = len((workdir / "calls.log").read_text().split())
    assert calls[True] <= calls[False] + 3, calls   # (one more expansion a job at most: its record's triggers)
