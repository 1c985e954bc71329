"""Snakemake checkpoints as stages, and fan-out over named dimensions.

A checkpoint stage's output decides how many parts there are
(``wp.parts``); the parts' stage and what gathers it follow the data: more
data makes more parts, less makes fewer, and the same data redoes nothing.
A stage's instances may have named dimensions (``wp.dims``), gathered along
one (``wp.each(..., over=...)``) or all of them. Real Snakemake runs of the
test's own workflows; plans from the events Snakemake reports."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import read_manifest, write_config
from test_series import _job_stats, reported, tiny_pipeline

from waypost.model import events

# A survey: `chunk` cuts each site's readings into chunks of 3 lines (how
# many follows the data); `measure` runs once per chunk; `tally` gathers them.
SURVEY = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow, axis="site")


checkpoint chunk:
    input: readings="readings/{site}.txt"
    output: chunks=directory(wp.out("chunks"))
    shell: "mkdir -p {output.chunks} && split -l 3 -d -a 3 --additional-suffix=.csv {input.readings} {output.chunks}/c"


rule measure:
    input: chunk=wp.stage("chunk", "chunks/c{n}.csv")
    output: sum=wp.out("sum.txt", instances=wp.parts("chunk", "chunks/c{n}.csv"))
    shell: "paste -sd+ {input.chunk} | bc > {output.sum}"


rule tally:
    input: sums=wp.each("measure", "sum.txt")
    output: total=wp.out("total.txt")
    shell: "awk -v site={wildcards.site} '{{s += $1}} END {{print s; print site}}' {input.sums} > {output.total}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def survey(tmp_path: Path, policy: str = "presence"):
    run = tiny_pipeline(tmp_path, SURVEY, {"root": "out", "rerun_policy": policy,
                                           "experiments": {"may": {"sites": ["north", "south"]}}})
    (tmp_path / "readings").mkdir()
    return run


def readings(tmp_path: Path, site: str, values: list[int]) -> None:
    (tmp_path / "readings" / f"{site}.txt").write_text("".join(f"{v}\n" for v in values))


def ran(tmp_path: Path) -> dict[str, int]:
    """Jobs a real run started, per rule (the ones a checkpoint added too;
    not ``all``), from the events it reported to ``events.jsonl``."""
    path = tmp_path / "events.jsonl"
    found = collections.Counter(e["rule"] for e in events.jobs(events.read(str(path))))
    path.unlink(missing_ok=True)
    return dict(found)


def attempts(stage_dir: Path) -> int:
    return len(read_manifest(stage_dir)["attempts"])


def redo_chunk(tmp_path: Path, site: str) -> None:
    """New readings for a site reach its checkpoint: in presence mode a
    done stage is done, so it is redone on purpose (`waypost rerun`)."""
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", "rerun", "chunk", "--site", site,
                           "--config", "config/config.yaml", "--workflow", "workflow"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("policy", ["presence", "mtime"])
def test_a_checkpoint_decides_the_parts_then_more_data_then_less(tmp_path: Path, policy: str):
    run = survey(tmp_path, policy)
    readings(tmp_path, "north", [1, 2, 3, 4, 5, 6, 7])    # chunks 000 001 002
    readings(tmp_path, "south", [10, 20])                 # chunk 000
    out = tmp_path / "out"

    # A dry run plans the checkpoints and what gathers the parts (their
    # number is known once the checkpoints ran), and changes nothing.
    dry = run("-n", *reported(tmp_path))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert _job_stats(tmp_path / "events.jsonl") == {"chunk": 2, "tally": 2}
    assert not out.exists()

    first = run(*reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert ran(tmp_path) == {"chunk": 2, "measure": 4, "tally": 2}
    assert sorted(p.name for p in (out / "north/may/measure").iterdir()) == ["000", "001", "002"]
    assert (out / "north/may/tally/total.txt").read_text() == "28\nnorth\n"
    assert (out / "south/may/tally/total.txt").read_text() == "30\nsouth\n"
    # a part's manifest names the checkpoint stage that made its input
    part_input = read_manifest(out / "north/may/measure/001")["inputs"][0]
    assert part_input["manifest"] == "out/north/may/chunk/_manifest.json" and part_input["sha256"]
    assert "Nothing to be done" in run("-n").stdout + run("-n").stderr

    # The same data again: the checkpoint is redone and nothing made from it.
    if policy == "presence":
        redo_chunk(tmp_path, "north")
    else:
        readings(tmp_path, "north", [1, 2, 3, 4, 5, 6, 7])   # rewritten, newer, the same
    same = run(*reported(tmp_path))
    assert same.returncode == 0, same.stderr[-3000:]
    assert ran(tmp_path) == ({"chunk": 1} if policy == "presence" else {})
    assert [attempts(out / "north/may/measure" / n) for n in ("000", "001", "002")] == [1, 1, 1]
    assert attempts(out / "north/may/tally") == 1

    # More data: one more part, and the last part has more in it: those
    # two are done, the others are not redone, the tally is redone.
    readings(tmp_path, "north", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])   # chunks 000 .. 003
    if policy == "presence":
        redo_chunk(tmp_path, "north")
    more = run(*reported(tmp_path))
    assert more.returncode == 0, more.stderr[-3000:]
    assert ran(tmp_path) == {"chunk": 1, "measure": 2, "tally": 1}
    assert [attempts(out / "north/may/measure" / n) for n in ("000", "001", "002", "003")] == [1, 1, 2, 1]
    assert (out / "north/may/tally/total.txt").read_text() == "66\nnorth\n"
    assert "may/north/tally: made from 3 inputs, now 4 (1 new, 0 gone): redone" in more.stderr
    if policy == "presence":
        assert "may/north/measure/002: made from may/north/chunk's chunks/c002.csv, which changed: redone" \
            in more.stderr
    assert (out / "south/may/tally/total.txt").read_text() == "30\nsouth\n"
    assert attempts(out / "south/may/tally") == 1

    # Less data: fewer parts; the part whose data changed and the tally are
    # redone; the parts that are gone are left where they are (not gathered).
    readings(tmp_path, "north", [1, 2, 3, 4])   # chunks 000 001
    if policy == "presence":
        redo_chunk(tmp_path, "north")
    less = run(*reported(tmp_path))
    assert less.returncode == 0, less.stderr[-3000:]
    assert ran(tmp_path) == {"chunk": 1, "measure": 1, "tally": 1}
    assert (out / "north/may/tally/total.txt").read_text() == "10\nnorth\n"
    assert len(read_manifest(out / "north/may/tally")["inputs"]) == 2
    assert "may/north/tally: made from 4 inputs, now 2 (0 new, 2 gone): redone" in less.stderr
    assert (out / "north/may/measure/003/sum.txt").exists()
    final = run("-n")
    assert "Nothing to be done" in final.stdout + final.stderr, final.stdout + final.stderr


def test_a_checkpoint_output_placed_by_hand_is_done_and_its_parts_run(tmp_path: Path):
    run = survey(tmp_path)
    readings(tmp_path, "south", [10, 20])
    placed = tmp_path / "out/north/may/chunk/chunks"   # no manifest: adopted, as any stage's files
    placed.mkdir(parents=True)
    (placed / "c000.csv").write_text("5\n")
    (placed / "c001.csv").write_text("6\n")
    first = run(*reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert ran(tmp_path) == {"chunk": 1, "measure": 3, "tally": 2}   # south's chunk; north's two parts
    assert (tmp_path / "out/north/may/tally/total.txt").read_text() == "11\nnorth\n"
    # Its parts have no checksums to compare with: done is done (presence).
    (placed / "c001.csv").write_text("7\n")
    again = run("-n")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]


def test_a_per_instance_override_reaches_the_parts_it_names(tmp_path: Path):
    # The parts are found as the checkpoint runs: an override that names
    # some of them (a name, a pattern) applies to those once they are.
    snakefile = SURVEY.replace('    shell: "paste -sd+ {input.chunk} | bc > {output.sum}"',
                               '    params: scale=wp.setting("scale")\n'
                               '    shell: "echo \\"($(paste -sd+ {input.chunk})) * {params.scale}\\" | bc > {output.sum}"')
    assert "params: scale" in snakefile
    run = tiny_pipeline(tmp_path, snakefile, {"root": "out", "experiments": {"may": {
        "sites": ["north"], "per_instance": {"00[1]": {"measure": {"scale": 10}}, "002": {"measure": {"scale": 100}}}}}})
    (tmp_path / "workflow" / "schemas").mkdir()
    (tmp_path / "workflow" / "schemas" / "config.schema.yaml").write_text(yaml.safe_dump({"properties": {"stages": {
        "properties": {"measure": {"properties": {"scale": {"type": "integer", "default": 1}}}}}}}))
    (tmp_path / "readings").mkdir()
    readings(tmp_path, "north", [1, 2, 3, 4, 5, 6, 7])   # chunks 000 (6) 001 (15) 002 (7)
    proc = run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    sums = [(tmp_path / "out/north/may/measure" / n / "sum.txt").read_text() for n in ("000", "001", "002")]
    assert sums == ["6\n", "150\n", "700\n"]


# Ensembles of teachers translate each part of a corpus a checkpoint cut:
# part × teacher, gathered per teacher, per part and all together.
GRID = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow, axis="corpus", axis_key="corpora")


def judges(experiment, corpus):
    return [f"j{i}" for i in range(config["experiments"][experiment]["judges"])]


rule train:
    output: model=wp.out("model.txt", instances=judges)
    shell: "echo {wildcards.instance} > {output.model}"


checkpoint cut:
    input: text="texts/{corpus}.txt"
    output: pieces=directory(wp.out("pieces"))
    shell: "mkdir -p {output.pieces} && split -l 1 -d --additional-suffix=.txt {input.text} {output.pieces}/"


rule score:
    input: piece=wp.stage("cut", "pieces/{piece}.txt"), model=wp.stage("train", "model.txt", instance="{judge}")
    output: score=wp.out("score.txt", instances=wp.dims(piece=wp.parts("cut", "pieces/{piece}.txt"), judge=judges))
    params: judge=wp.dim("judge")
    shell: "echo $(cat {input.piece}):{params.judge}:$(cat {input.model}) > {output.score}"


rule by_judge:
    input: scores=wp.each("score", "score.txt", over="piece")
    output: out=wp.out("scores.txt", instances=judges)
    shell: "cat {input.scores} > {output.out}"


rule by_piece:
    input: scores=wp.each("score", "score.txt", over="judge")
    output: out=wp.out("scores.txt", instances=wp.parts("cut", "pieces/{piece}.txt"))
    shell: "cat {input.scores} > {output.out}"


rule board:
    input: scores=wp.each("score", "score.txt")
    output: out=wp.out("board.txt")
    shell: "cat {input.scores} > {output.out}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def grid(tmp_path: Path, judges: int):
    run = tiny_pipeline(tmp_path, GRID, {"root": "out", "experiments": {"e": {"corpora": ["news"], "judges": judges}}})
    schemas = tmp_path / "workflow" / "schemas"
    schemas.mkdir(exist_ok=True)
    (schemas / "config.schema.yaml").write_text(yaml.safe_dump({"properties": {"experiments": {
        "additionalProperties": {"properties": {"judges": {"type": "integer", "minimum": 1}}}}}}))
    (tmp_path / "texts").mkdir(exist_ok=True)
    (tmp_path / "texts" / "news.txt").write_text("a\nb\nc\n")
    return run


def test_a_two_dimensional_fanout_is_gathered_along_each_dimension_and_both(tmp_path: Path):
    run = grid(tmp_path, judges=2)
    first = run(*reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert ran(tmp_path) == {"train": 2, "cut": 1, "score": 6, "by_judge": 2, "by_piece": 3, "board": 1}
    out = tmp_path / "out/news/e"
    # one instance per piece and judge, named by their values in the order written
    assert sorted(p.name for p in (out / "score").iterdir()) == ["00-j0", "00-j1", "01-j0", "01-j1", "02-j0", "02-j1"]
    assert (out / "score/01-j1/score.txt").read_text() == "b:j1:j1\n"
    assert (out / "by_judge/j0/scores.txt").read_text() == "a:j0:j0\nb:j0:j0\nc:j0:j0\n"
    assert (out / "by_piece/02/scores.txt").read_text() == "c:j0:j0\nc:j1:j1\n"
    assert (out / "board/board.txt").read_text().splitlines() == [
        "a:j0:j0", "a:j1:j1", "b:j0:j0", "b:j1:j1", "c:j0:j0", "c:j1:j1"]

    # One more judge: its model and its scores of every piece are made; what
    # gathers along the pieces is made for it alone, what gathers along the
    # judges (each piece) and over both is redone; the other judges' are left.
    write_config(tmp_path, {"root": "out", "experiments": {"e": {"corpora": ["news"], "judges": 3}}},
                 name="config/config.yaml")
    dry = run("-n", *reported(tmp_path))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert _job_stats(tmp_path / "events.jsonl") == {"train": 1, "score": 3, "by_judge": 1, "by_piece": 3,
                                                      "board": 1}
    second = run()
    assert second.returncode == 0, second.stderr[-3000:]
    assert (out / "by_piece/00/scores.txt").read_text() == "a:j0:j0\na:j1:j1\na:j2:j2\n"
    assert (out / "by_judge/j2/scores.txt").read_text() == "a:j2:j2\nb:j2:j2\nc:j2:j2\n"
    assert attempts(out / "by_judge/j0") == 1
    assert len(read_manifest(out / "board")["inputs"]) == 9
    final = run("-n")
    assert "Nothing to be done" in final.stdout + final.stderr


@pytest.mark.parametrize(("change", "expected"), [
    (("checkpoint cut:", "rule cut:"), "rule score: wp.parts('cut', 'pieces/{piece}.txt'): rule cut is not a "
                                       "checkpoint (write `checkpoint cut:`"),
    (('over="piece"', 'over="page"'), "rule by_judge: wp.each('score', ..., over='page'): stage score has no "
                                      "dimension 'page' (its dimensions: piece, judge)"),
    (('"pieces/{piece}.txt"), judge', '"pieces/*.txt"), judge'),
     "rule score: wp.parts('cut', 'pieces/*.txt'): expected a path in the stage's directory whose last part "
     "holds one {name}"),
    (('instance="{judge}"', 'instance="{teacher}"'),
     "rule score: wp.stage('train', 'model.txt'): no dimension 'teacher' (rule score's instances have: piece, judge)"),
])
def test_fanout_mistakes_are_one_clear_error(tmp_path: Path, change, expected):
    run = grid(tmp_path, judges=1)
    snakefile = tmp_path / "workflow" / "Snakefile"
    assert change[0] in snakefile.read_text()
    snakefile.write_text(snakefile.read_text().replace(*change))
    proc = run()
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and 'File "' not in proc.stderr, proc.stderr[-3000:]


def test_a_part_that_cannot_name_an_instance_is_named_with_its_file(tmp_path: Path):
    run = grid(tmp_path, judges=1)
    (tmp_path / "workflow" / "Snakefile").write_text(GRID.replace(
        "{output.pieces}/\"", "{output.pieces}/ && touch '{output.pieces}/bad name.txt'\""))
    proc = run()
    assert proc.returncode != 0
    assert ("out/news/e/cut/pieces/bad name.txt: wp.parts('cut', 'pieces/{piece}.txt'): {piece} is 'bad name', "
            "which can't name an instance") in proc.stderr, proc.stderr[-3000:]


@pytest.fixture(params=["gs", "mounted"])
def elsewhere(request, tmp_path):
    """A root in a bucket (through its API) or on a mounted bucket: (root,
    the Snakemake flags it needs, a function reading a file under it)."""
    from conftest import gcs_flags, gcs_fs, gcs_key
    if request.param == "gs":
        root = f"{request.getfixturevalue('bucket')}/results"
        return root, gcs_flags(root), lambda rel: gcs_fs().cat_file(f"{gcs_key(root)}/{rel}").decode()
    _, path = request.getfixturevalue("mount_root")
    root = str(path / "results")
    return root, (), lambda rel: (path / "results" / rel).read_text()


def test_checkpoint_parts_follow_the_data_in_a_bucket_and_on_a_mount(tmp_path: Path, elsewhere):
    import json
    root, flags, read = elsewhere
    # The readings come from outside the root (a download, say): the
    # checkpoint reads them by their path.
    snakefile = SURVEY.replace('    input: readings="readings/{site}.txt"\n', "").replace(
        "{input.readings}", f"{tmp_path}/readings/{{wildcards.site}}.txt")
    run = tiny_pipeline(tmp_path, snakefile, {"root": root, "experiments": {"may": {"sites": ["north"]}}})
    (tmp_path / "readings").mkdir()
    readings(tmp_path, "north", [1, 2, 3, 4, 5, 6, 7])

    dry = run("-n", *flags, *reported(tmp_path))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert _job_stats(tmp_path / "events.jsonl") == {"chunk": 1, "tally": 1}
    first = run(*flags, *reported(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert ran(tmp_path) == {"chunk": 1, "measure": 3, "tally": 1}
    assert read("north/may/tally/total.txt") == "28\nnorth\n"
    part = json.loads(read("north/may/measure/002/_manifest.json"))["inputs"][0]
    assert part["manifest"] == f"{root}/north/may/chunk/_manifest.json" and part["sha256"]
    again = run("-n", *flags)
    assert "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]

    redo_chunk(tmp_path, "north")   # the same data: only the checkpoint runs
    same = run(*flags, *reported(tmp_path))
    assert same.returncode == 0, same.stderr[-3000:]
    assert ran(tmp_path) == {"chunk": 1}

    readings(tmp_path, "north", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])   # more: a changed part and a new one
    redo_chunk(tmp_path, "north")
    more = run(*flags, *reported(tmp_path))
    assert more.returncode == 0, more.stderr[-3000:]
    assert ran(tmp_path) == {"chunk": 1, "measure": 2, "tally": 1}
    assert read("north/may/tally/total.txt") == "66\nnorth\n"
    assert len(json.loads(read("north/may/measure/001/_manifest.json"))["attempts"]) == 1

    readings(tmp_path, "north", [1, 2])   # less: one part
    redo_chunk(tmp_path, "north")
    less = run(*flags, *reported(tmp_path))
    assert less.returncode == 0, less.stderr[-3000:]
    assert ran(tmp_path) == {"chunk": 1, "measure": 1, "tally": 1}
    assert read("north/may/tally/total.txt") == "3\nnorth\n"


def test_checkpoint_parts_run_packed_on_slurm(slurm_cluster, tmp_path: Path):
    # The checkpoint, its parts and the tally are stage jobs of a packed
    # class: the parts the checkpoint found are submitted together, as one
    # job array, once it ended.
    import time

    from conftest import REPO, finish
    from test_slurm_jobs import FAST, sacct
    snakefile = SURVEY.replace('    output: chunks=', '    resources: worker="small"\n    output: chunks=').replace(
        '    output: sum=', '    resources: worker="small"\n    output: sum=').replace(
        '    output: total=', '    resources: worker="small"\n    output: total=')
    run = tiny_pipeline(tmp_path, snakefile, {"root": "results", "pool": "onprem",
                                              "experiments": {"may": {"sites": ["north"]}}})
    (tmp_path / "config" / "workers.yaml").write_text(yaml.safe_dump({"pools": {"onprem": {
        "executor": "slurm", "classes": {"small": {"partition": "cpu", "cpus": 1, "mem_mb": 200, "runtime": 10,
                                                   "pack": 8}}}}}))
    (tmp_path / "readings").mkdir()
    readings(tmp_path, "north", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])   # chunks 000 .. 003
    since = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                             str(REPO / "profiles" / "onprem"), *FAST, *reported(tmp_path)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    code, out = finish(proc, timeout=300)
    assert code == 0, out[-5000:]
    assert ran(tmp_path) == {"chunk": 1, "measure": 4, "tally": 1}
    assert (tmp_path / "results/north/may/tally/total.txt").read_text() == "55\nnorth\n"
    parts = {read_manifest(tmp_path / "results/north/may/measure" / n)["attempts"][0]["scheduler_job_id"]
             for n in ("000", "001", "002", "003")}
    jobs = {r["JobIDRaw"]: r for r in sacct("JobIDRaw", "JobID", "State", since=since, workdir=tmp_path, jobs=6)}
    assert {jobs[j]["State"] for j in parts} == {"COMPLETED"}
    assert len({jobs[j]["JobID"].split("_")[0] for j in parts}) == 1, jobs   # one array: the four parts
    again = run("-n")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]


def test_the_steering_commands_name_parts_like_any_instance(tmp_path: Path):
    """Parts a checkpoint found are instances to status, rerun and find:
    filtered by name or pattern, redone one at a time."""
    run = survey(tmp_path)
    readings(tmp_path, "north", [1, 2, 3, 4, 5, 6, 7])   # chunks 000 001 002
    readings(tmp_path, "south", [10, 20])                # chunk 000
    assert run().returncode == 0

    def waypost(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "waypost.cli", args[0], "--config", "config/config.yaml",
                               "--workflow", "workflow", *args[1:]], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
    shown = waypost("status", "--json", "--instance", "00[12]")
    assert shown.returncode == 0, shown.stderr
    cells = json.loads(shown.stdout)["experiments"]["may"]["north"]["measure"]
    assert sorted(cells["instances"]) == ["001", "002"], cells
    out = tmp_path / "out"

    def made() -> list[str]:
        return [read_manifest(out / "north/may/measure" / n)["created"] for n in ("000", "001", "002")]
    before = made()
    rerun = waypost("rerun", "measure", "--site", "north", "--instance", "001")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert (out / "north/may/measure/001/.attempts/1/_manifest.json").exists()
    again = run(*reported(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert ran(tmp_path) == {"measure": 1}   # presence mode: the tally, of the same set, is kept
    after = made()
    assert (after[0], after[2]) == (before[0], before[2]) and after[1] > before[1]
    downstream = waypost("rerun", "measure", "--site", "north", "--instance", "002", "--downstream")
    assert downstream.returncode == 0, downstream.stdout + downstream.stderr
    assert run(*reported(tmp_path)).returncode == 0
    assert ran(tmp_path) == {"measure": 1, "tally": 1}
    assert (out / "north/may/tally/.attempts/1").is_dir() and not (out / "south/may/tally/.attempts").exists()
    unknown = waypost("rerun", "measure", "--site", "north", "--instance", "009")
    assert unknown.returncode != 0 and "009" in unknown.stdout + unknown.stderr
