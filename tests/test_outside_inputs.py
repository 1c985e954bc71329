"""Inputs outside the results root (a table in the workflow directory, a
reference file and a big file on another disk, a directory of shards) are
fingerprinted when their stage runs, and ``waypost plan`` names an edit of
one since: the file, what changed, the stages made from its old version
(and from those downstream, and reused copies), and the ``waypost rerun``
that redoes them. A touch without a change is no edit. Presence mode keeps
the stages: the next run does nothing."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LOCAL_PROFILE, read_manifest
from test_series import tiny_pipeline

from waypost.model import fingerprints

LEDGER = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


def grades(experiment):
    return ["coarse", "fine"]


rule ingest:
    input: rates="inputs/rates.tsv", atlas="{atlas}", blob="{blob}", shards="inputs/shards"
    output: table=wp.out("table.txt")
    shell: "cat {{input.rates}} {{input.atlas}} > {{output.table}}; wc -c < {{input.blob}} >> {{output.table}}; "
           "cat {{input.shards}}/* >> {{output.table}}"


rule grade:
    input: table=wp.stage("ingest", "table.txt")
    output: g=wp.out("g.txt", instances=grades)
    shell: "echo {{wildcards.instance}} | cat - {{input.table}} > {{output.g}}"


rule summary:
    input: gs=wp.each("grade", "g.txt"), rates="inputs/rates.tsv"
    output: s=wp.out("summary.txt")
    shell: "cat {{input.gs}} > {{output.s}}"


rule banner:
    output: b=wp.out("banner.txt")
    shell: "echo unrelated > {{output.b}}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''

# A bit over the checksum limit: fingerprinted by size and time alone.
BLOB_SIZE = fingerprints.CHECKSUM_LIMIT + 4096


def make_study(work: Path, elsewhere: Path, mode: str = "presence"):
    """The workflow in ``work`` (its table and shards there too) reading an
    atlas and a big blob in ``elsewhere`` (absolute paths), run once; in
    presence mode a second experiment reuses its ingest."""
    elsewhere.mkdir(parents=True, exist_ok=True)
    (elsewhere / "atlas.txt").write_text("north 4\nsouth 9\n")
    with open(elsewhere / "blob.bin", "wb") as f:
        f.truncate(BLOB_SIZE)
    (work / "inputs" / "shards").mkdir(parents=True)
    (work / "inputs" / "rates.tsv").write_text("alpha\t0.25\nbeta\t0.50\n")
    for name in ("s1", "s2"):
        (work / "inputs" / "shards" / name).write_text(f"shard {name}\n")
    run = tiny_pipeline(work, LEDGER.format(atlas=elsewhere / "atlas.txt", blob=elsewhere / "blob.bin"),
                        {"root": "results", "rerun_policy": mode,
                         "experiments": {"north": {}, **({"south": {"reuse": {"ingest": "north"}}}
                                                         if mode == "presence" else {})}})
    done = run()
    assert done.returncode == 0, done.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("outside")
    make_study(base / "work", base / "disk")
    return base / "work"


@pytest.fixture
def study_copy(study, tmp_path) -> Path:
    """A private copy of the finished study (the files' times kept): its own
    table and shards to edit (the atlas and blob stay shared: not edited)."""
    target = tmp_path / "work"
    shutil.copytree(study, target, symlinks=True, copy_function=shutil.copy2)
    return target


def plan(work: Path, *args: str, code: int = 0) -> str:
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", "plan", "--profile", str(LOCAL_PROFILE),
                           "--width", "250", *args], cwd=work, capture_output=True, text=True, timeout=180)
    assert proc.returncode == code, proc.stdout + proc.stderr
    return proc.stdout


def drift_of(work: Path) -> dict:
    """``plan --json``'s drift: (experiment, stage, instance) → what."""
    data = json.loads(plan(work, "--json"))
    return {(r["experiment"], r["stage"], r["instance"]): r["what"] for r in data["drift"]}, data


def test_the_manifest_records_each_outside_inputs_fingerprint(study):
    inputs = {i["path"]: i for i in read_manifest(study / "results/_all/north/ingest")["inputs"]}
    rates, shards = inputs["inputs/rates.tsv"], inputs["inputs/shards"]
    atlas = next(i for p, i in inputs.items() if p.endswith("atlas.txt"))
    blob = next(i for p, i in inputs.items() if p.endswith("blob.bin"))
    assert os.path.isabs(atlas["path"]) and rates["state"] == "ADOPTED" and rates["manifest"] is None
    st = os.stat(study / "inputs/rates.tsv")
    assert rates["fingerprint"] == {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                    "sha256": fingerprints.manifest.sha256_file(str(study / "inputs/rates.tsv"))}
    assert atlas["fingerprint"]["size"] == 16 and len(atlas["fingerprint"]["sha256"]) == 64
    # over the limit: size and time only
    assert blob["fingerprint"]["size"] == BLOB_SIZE and blob["fingerprint"]["sha256"] is None
    assert shards["fingerprint"]["files"] == 2 and shards["fingerprint"]["size"] == 18
    assert shards["fingerprint"]["sha256"]
    # an input from the root keeps its producer's manifest, no fingerprint
    (table,) = read_manifest(study / "results/_all/north/grade/fine")["inputs"]
    assert table["manifest"].endswith("north/ingest/_manifest.json") and table["sha256"]
    assert "fingerprint" not in table
    assert "no drift: every done stage" in plan(study)


def test_a_touch_without_a_change_is_no_drift(study_copy):
    later = os.stat(study_copy / "inputs/rates.tsv").st_mtime_ns + 7_000_000_000
    for path in (study_copy / "inputs/rates.tsv", study_copy / "inputs/shards/s1"):
        os.utime(path, ns=(later, later))
    text = plan(study_copy)
    assert "no drift: every done stage" in text and "edited" not in text, text


def test_an_edit_names_the_file_and_every_stage_made_from_it(study_copy):
    (study_copy / "inputs/rates.tsv").write_text("alpha\t0.25\nbeta\t0.75\n")       # the same size
    (study_copy / "inputs/shards/s2").write_text("shard two, longer\n")
    text = plan(study_copy)
    assert "next run: nothing to do" in text, text                   # presence mode keeps them
    rows = [line for line in text.split("done, but made with", 1)[1].splitlines() if line.startswith("│")]
    ingest = next(r for r in rows if "│ ingest" in r)
    assert "north" in ingest and "input edited since: inputs/rates.tsv (content changed)" in ingest, text
    assert "input edited since: inputs/shards (content changed: 18 → 27 bytes)" in text, text
    assert any("grade [coarse, fine] ×2" in r and "made from an edited input: inputs/rates.tsv (through ingest)"
               in r for r in rows), text
    assert "banner" not in text, text
    line = next(line for line in text.splitlines() if line.startswith("inputs/rates.tsv:"))
    # summary reads it too: north's is made from north's ingest (whose rerun is all it takes), south's is
    # not (this copy's south/ingest is a reused copy of the first study's)
    assert "content changed; 3 stages were (north/ingest, north/summary, south/summary) made from it, and 3 " \
           "stage(s) downstream of them: `waypost rerun ingest --downstream --experiment north` and `waypost " \
           "rerun summary --downstream --experiment south` redo them" in line, line

    drift, data = drift_of(study_copy)
    # (south's ingest is a copy of the first study's north/ingest: this copy's
    # table is not what it was made from)
    assert set(drift) == {("north", s, i) for s, i in (("ingest", None), ("grade", "coarse"), ("grade", "fine"),
                                                        ("summary", None))} | {("south", "summary", None)}
    (north,) = [r for r in data["drift"] if r["experiment"] == "north" and r["stage"] == "ingest"]
    assert north["rerun"] == "waypost rerun ingest --downstream --experiment north"
    summary = next(r for r in data["drift"] if r["stage"] == "summary" and r["experiment"] == "north")
    assert "rerun" not in summary and summary["what"] == [
        "input edited since: inputs/rates.tsv (content changed)",
        "made from an edited input: inputs/rates.tsv (through ingest)",
        "made from an edited input: inputs/shards (through ingest)"]
    assert {e["path"]: e["change"] for e in north["edited_inputs"]} == {
        "inputs/rates.tsv": "content changed", "inputs/shards": "content changed: 18 → 27 bytes"}
    assert any(e.startswith("inputs/rates.tsv: content changed") for e in data["input_edits"])
    plan(study_copy, "--check", code=1)                            # drift is a problem found, for scripts

    # What it says to do redoes them all, and then nothing has drifted.
    commands = sorted({r["rerun"] for r in data["drift"] if r.get("rerun")})
    assert commands == ["waypost rerun ingest --downstream --experiment north",
                        "waypost rerun summary --downstream --experiment south"]
    redone = 0
    for command in commands:
        rerun = subprocess.run([sys.executable, "-m", "waypost.cli", *shlex.split(command)[1:]], cwd=study_copy,
                               capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        redone += int(rerun.stdout.splitlines()[-1].split()[0])
    assert redone == 5
    run = tiny_pipeline(study_copy, (study_copy / "workflow/Snakefile").read_text())
    again = run()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "beta\t0.75" in (study_copy / "results/_all/north/summary/summary.txt").read_text()
    assert "no drift: every done stage" in plan(study_copy)


def test_a_deleted_input_and_a_big_one_edited_in_place(tmp_path):
    make_study(tmp_path / "work", tmp_path / "disk")
    (tmp_path / "disk" / "atlas.txt").unlink()
    with open(tmp_path / "disk" / "blob.bin", "r+b") as f:      # the same size, other bytes, a later time
        f.write(b"edited")
    drift, data = drift_of(tmp_path / "work")
    what = drift[("north", "ingest", None)]
    assert f"input edited since: {tmp_path / 'disk' / 'atlas.txt'} (missing now)" in what, what
    assert f"input edited since: {tmp_path / 'disk' / 'blob.bin'} (the same size, another time; over the 64 MiB " \
           "checksum limit, contents not compared)" in what, what
    assert ("north", "summary", None) in drift and ("north", "banner", None) not in drift
    # south reused north's ingest: that copy, and what was made from it, were made from them too
    assert drift[("south", "ingest", None)] == [
        f"made from an edited input: {tmp_path / 'disk' / 'atlas.txt'} (through ingest)",
        f"made from an edited input: {tmp_path / 'disk' / 'blob.bin'} (through ingest)"]
    assert {(e, s) for e, s, _ in drift} == {(e, s) for e in ("north", "south") for s in ("ingest", "grade", "summary")}
    assert any("north/ingest was made from it, and 7 stage(s) downstream of it" in line and "`waypost rerun ingest --downstream --experiment north`" in line
               for line in data["input_edits"]), data["input_edits"]


def test_mtime_mode_redoes_a_newer_input_and_plan_agrees(tmp_path):
    run = make_study(tmp_path / "work", tmp_path / "disk", mode="mtime")
    rates = tmp_path / "work" / "inputs" / "rates.tsv"
    rates.write_text("alpha\t0.30\nbeta\t0.50\n")
    text = plan(tmp_path / "work")
    # Snakemake redoes it (newer), and drift says why in the meantime
    assert "ingest" in text.split("done, but made with", 1)[0] and "inputs/rates.tsv (content changed)" in text
    assert "(mtime mode: the next run does when it is newer than their outputs)" in text, text
    assert run().returncode == 0
    assert "no drift: every done stage" in plan(tmp_path / "work")


def test_fingerprints_compare_size_and_time_then_contents(tmp_path):
    table, shards = tmp_path / "table.csv", tmp_path / "shards"
    table.write_text("x,1\ny,2\n")
    shards.mkdir()
    (shards / "a").write_text("one\n")
    recorded_table, recorded_shards = fingerprints.take(str(table)), fingerprints.take(str(shards))
    assert recorded_shards["files"] == 1 and recorded_shards["sha256"]

    def change(path, recorded):   # a new comparer each time: plan compares once per run
        return fingerprints.Comparer().change(str(path), recorded)

    later = table.stat().st_mtime_ns + 5_000_000_000
    os.utime(table, ns=(later, later))
    assert change(table, recorded_table) is None                         # touched, not changed
    table.write_text("x,1\ny,3\n")
    assert change(table, recorded_table) == "content changed"
    table.write_text("x,1\n")
    assert change(table, recorded_table) == "content changed: 8 → 4 bytes"
    (shards / "b").write_text("two\n")
    assert change(shards, recorded_shards) == "content changed: 1 → 2 files"
    table.unlink()
    assert change(table, recorded_table) == "missing now"
    assert fingerprints.outside("inputs/t.csv", "results") and not fingerprints.outside("results/a/b", "results")
    assert not fingerprints.outside("gs://b/k", "results") and fingerprints.outside("/data/t.csv", "gs://b/root")


def test_a_directory_input_is_fingerprinted_over_its_first_files(tmp_path):
    many = tmp_path / "many"
    many.mkdir()
    for i in range(fingerprints.DIRECTORY_FILES + 5):
        (many / f"f{i:05d}").write_text("x")
    assert fingerprints.take(str(many))["files"] == fingerprints.DIRECTORY_FILES


def test_an_input_edited_while_the_step_ran_is_recorded_as_it_was_before(tmp_path):
    from test_runner import run_step
    source, stage = tmp_path / "outside" / "levels.txt", tmp_path / "results/p/e/s"
    source.parent.mkdir()
    source.write_text("level 1\n")
    before = source.stat()
    out = stage / "out.txt"
    proc = run_step(stage, f"cat {source} > {out}; sleep 0.05; echo 'level 22' > {source}", outputs=[out],
                    inputs=[source])
    assert proc.returncode == 0, proc.stderr
    (item,) = read_manifest(stage)["inputs"]
    assert item["fingerprint"] == {"size": before.st_size, "mtime_ns": before.st_mtime_ns, "sha256": None}
    assert fingerprints.Comparer().change(str(source), item["fingerprint"]) == "content changed: 8 → 9 bytes"
