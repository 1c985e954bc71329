"""Everything ever made is findable: archived runs in the catalog and in
`waypost status --attempts`, reuse from an archive (with the source's
time), the inputs of each manifest and `waypost find --lineage`."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path

from conftest import SMALL_CONFIG, read_manifest, snakemake, waypost, write_config

from waypost.ops import catalog
from waypost.state import reuse
from waypost.stores import gcs, walk

TEACHERS = Path("results/en-xa/exp1/train_teacher")


def rerun_teachers_twice(workdir: Path) -> None:
    """Two reruns of en-xa's teachers, each redone: .attempts/1 and /2 of each."""
    for _ in range(2):
        out = waypost(workdir, "rerun", "train_teacher", "--experiment", "exp1", "--pair", "en-xa").stdout
        assert "2 stage(s) will be redone" in out
        snakemake(workdir, "--until", "train_teacher")


def test_find_lists_current_and_archived_teachers_and_status_their_runs(run_copy):
    rerun_teachers_twice(run_copy)
    rows = json.loads(waypost(run_copy, "find", "--stage", "train_teacher", "--pair", "en-xa", "--json").stdout)
    found = {(r["location"], r["archive"]) for r in rows}
    expected = {(str(run_copy / TEACHERS / i / archive) if archive else str(run_copy / TEACHERS / i), archive)
                for i in "01" for archive in (None, ".attempts/1", ".attempts/2")}
    assert found == expected
    assert all(r["archived"] == (r["archive"] is not None) and r["state"] == "SUCCESS" for r in rows)
    first = read_manifest(run_copy / TEACHERS / "0" / ".attempts" / "1")
    assert next(r for r in rows if r["location"].endswith("0/.attempts/1"))["created"] == first["created"]
    current = json.loads(waypost(run_copy, "find", "--stage", "train_teacher", "--pair", "en-xa", "--no-archived",
                                 "--json").stdout)
    assert sorted(r["location"] for r in current) == [str(run_copy / TEACHERS / i) for i in "01"]
    text = waypost(run_copy, "find", "--stage", "train_teacher", "--pair", "en-xa", "--width", "250").stdout
    assert "6 stage(s) found" in text and text.count("done (archived .attempts/2)") == 2

    # status --attempts --all-attempts: the current manifest's attempts, then each earlier run
    out = waypost(run_copy, "status", "--attempts", "train_teacher", "--pair", "en-xa", "--all-attempts").stdout
    made = first["created"][:16].replace("T", " ")
    assert f"archived .attempts/1: SUCCESS, 1 attempt, made {made}" in out
    assert out.count("archived .attempts/2: SUCCESS, 1 attempt") == 2
    grid = json.loads(waypost(run_copy, "status", "--attempts", "train_teacher", "--pair", "en-xa", "--json").stdout)
    cell = grid["experiments"]["exp1"]["en-xa"]["train_teacher"]["instances"]["0"]
    assert [(a["archive"], a["state"], a["attempts"]) for a in cell["archives"]] == [
        (".attempts/1", "SUCCESS", 1), (".attempts/2", "SUCCESS", 1)]
    assert cell["archives"][0]["created"] == first["created"] and len(cell["history"]) == 1
    # plain status reads no archive
    plain = json.loads(waypost(run_copy, "status", "--json").stdout)
    assert "archives" not in plain["experiments"]["exp1"]["en-xa"]["train_teacher"]["instances"]["0"]
    # a stage's page (status --html) lists them too
    waypost(run_copy, "status", "--html", "page.html")
    page = (run_copy / "page.html").read_text()
    assert page.count('<li class="archive" data-archive=".attempts/1">.attempts/1: SUCCESS, 1 attempt(s), made') == 2


def test_lineage_walks_back_to_the_first_stage_through_archived_inputs(run_copy):
    rerun_teachers_twice(run_copy)   # the student was made from the teachers now in .attempts/1
    student = run_copy / "results/en-xa/exp1/train_student"
    tree = json.loads(waypost(run_copy, "find", "--lineage", str(student), "--json").stdout)
    assert tree["location"] == str(student) and tree["stage"] == "train_student" and not tree["archived"]

    nodes = []

    def walk(node, depth):
        nodes.append((depth, node))
        for child in node["inputs"]:
            walk(child, depth + 1)
    walk(tree, 0)
    assert not [n for _, n in nodes if n.get("missing")]
    assert {n["stage"] for _, n in nodes} == {"train_student", "translate_corpus", "translate_mono", "train_vocab",
                                              "train_teacher", "train_backward", "clean_corpus", "fetch_corpus"}
    teachers = {n["location"] for _, n in nodes if n["stage"] == "train_teacher"}
    assert teachers == {str(run_copy / TEACHERS / i / ".attempts" / "1") for i in "01"}
    assert all(n["archive"] == ".attempts/1" for _, n in nodes if n["stage"] == "train_teacher")
    assert all(not n["inputs"] for _, n in nodes if n["stage"] == "fetch_corpus")
    corpus = next(n for _, n in nodes if n["stage"] == "translate_corpus")
    assert corpus["via"] == "input" and corpus["path"] == str(student.parent / "translate_corpus" / "distilled.tsv")

    # the catalog keeps each manifest's inputs, with absolute paths
    rows = json.loads(waypost(run_copy, "find", "--stage", "train_student", "--pair", "en-xa", "--json").stdout)
    assert {i["manifest"] for i in rows[0]["inputs"]} == {
        str(student.parent / s / "_manifest.json") for s in ("translate_corpus", "translate_mono", "train_vocab")}
    assert {i["state"] for i in rows[0]["inputs"]} == {"SUCCESS"}

    text = waypost(run_copy, "find", "--lineage", "results/en-xa/exp1/train_student").stdout
    lines = text.splitlines()
    assert lines[0].startswith("en-xa/exp1/train_student: done, made ")
    assert any(line.startswith("    en-xa/exp1/train_teacher/0: done (archived .attempts/1), made ") for line in lines)
    assert any(line.strip().startswith("en-xa/exp1/fetch_corpus: done") for line in lines)

    missing = waypost(run_copy, "find", "--lineage", "results/en-xa/nosuch/train_student", check=False)
    assert missing.returncode == 1 and "not in the catalog" in missing.stdout


def test_reuse_an_archived_teacher_shows_the_sources_time(run_copy, tmp_path):
    waypost(run_copy, "rerun", "train_teacher", "--experiment", "exp1", "--pair", "en-xa")
    archived = run_copy / TEACHERS / "0" / ".attempts" / "1"
    assert reuse.source_problem(str(archived)) is None
    config = copy.deepcopy(SMALL_CONFIG)
    config["catalog"] = [str(run_copy / "results")]
    source = str(run_copy / TEACHERS) + "/{instance}/.attempts/1"
    config["experiments"] = {"mine": {"pairs": ["en-xa"], "teachers": 2, "reuse": {"train_teacher": {"en-xa": source}}}}
    write_config(tmp_path, config)
    snakemake(tmp_path, "--until", "train_teacher")
    for i in "01":
        record = read_manifest(tmp_path / "results/en-xa/mine/train_teacher" / i)
        origin = read_manifest(run_copy / TEACHERS / i / ".attempts" / "1")
        assert record["reused_from"] == str(run_copy / TEACHERS / i / ".attempts" / "1")
        assert record["source_created"] == origin["created"] < record["created"]
    rows = json.loads(waypost(tmp_path, "find", "--experiment", "mine", "--json").stdout)
    assert {(r["reused_from"], r["source_created"]) for r in rows} == {
        (str(run_copy / TEACHERS / i / ".attempts" / "1"), read_manifest(run_copy / TEACHERS / i / ".attempts" / "1")
         ["created"]) for i in "01"}
    text = waypost(tmp_path, "find", "--experiment", "mine", "--width", "250").stdout
    made = read_manifest(archived)["created"][:16].replace("T", " ")
    assert f"{made} (reused)" in text
    # lineage crosses the reuse into the other root, and on back to fetch_corpus
    tree = json.loads(waypost(tmp_path, "find", "--lineage", "results/en-xa/mine/train_teacher/0", "--json").stdout)
    (source_node,) = tree["inputs"]
    assert source_node["via"] == "reuse" and source_node["location"] == str(archived) and source_node["archived"]
    assert {c["stage"] for c in source_node["inputs"]} == {"clean_corpus", "translate_mono", "train_vocab"}


def test_an_old_cache_file_is_rebuilt_not_misread(run_copy, tmp_path):
    db = tmp_path / "old.sqlite"
    old = sqlite3.connect(db)   # the layout before archives, inputs and source times
    old.executescript("CREATE TABLE manifests (location TEXT PRIMARY KEY, root TEXT NOT NULL, stamp TEXT NOT NULL,"
                      " experiment TEXT, pair TEXT, stage TEXT, instance TEXT, state TEXT, created TEXT,"
                      " attempts INTEGER, config_hash TEXT, code_version TEXT, reused_from TEXT, adopted INTEGER,"
                      " provisional INTEGER, settings TEXT);"
                      "CREATE TABLE roots (root TEXT PRIMARY KEY, refreshed REAL, manifests INTEGER);")
    root = str(run_copy / "results")
    location = str(run_copy / "results/en-xa/exp1/train_student")
    stamp = walk._stamp((run_copy / "results/en-xa/exp1/train_student/_manifest.json").stat())
    old.execute("INSERT INTO manifests VALUES (?, ?, ?, 'exp1', 'en-xa', 'train_student', NULL, 'SUCCESS', "
                "'2026-01-01', 1, 'x', 'y', NULL, 0, 0, '{}')", (location, root, stamp))
    old.commit()
    old.close()
    cat = catalog.Catalog(str(db))
    cat.refresh(root)
    row = cat.get(location)
    assert len(row["inputs"]) == 3 and row["created"] != "2026-01-01" and row["archived"] is False
    assert cat.count() == 29


def test_archived_manifests_in_a_bucket(run_copy, bucket):
    waypost(run_copy, "rerun", "train_teacher", "--experiment", "exp1", "--pair", "en-xa")
    remote = f"{bucket}/shared"
    fs, path = gcs.filesystem(remote)
    fs.put(str(run_copy / "results"), path, recursive=True)
    cat = catalog.Catalog(":memory:")
    assert cat.refresh(remote).read == 29
    rows = cat.find(stage="train_teacher", pair="en-xa")
    assert sorted((r["location"], r["archive"]) for r in rows) == [
        (f"{remote}/en-xa/exp1/train_teacher/{i}/.attempts/1", ".attempts/1") for i in "01"]
    assert not cat.find(stage="train_teacher", pair="en-xa", archived=False)
    student = cat.find(stage="train_student", pair="en-xa")[0]
    # copied in by hand from a local run: its inputs stay as that run wrote them
    assert student["inputs"][0]["manifest"] == "results/en-xa/exp1/translate_corpus/_manifest.json"


def test_adopt_archives_the_manifest_it_replaces(run_copy):
    """Nothing a user had is replaced without an archive (issue 38): adopt
    over a stage waypost made (--force), over one adopted before, or over a
    failed one, moves its manifest and logs to .attempts/<n> first, says so,
    and status, find and the catalog show the earlier run."""
    student = run_copy / "results/en-xb/exp1/train_student"
    made = read_manifest(student)
    (student / "model.json").write_text('{"trained": "on the cluster by hand"}\n')
    proc = waypost(run_copy, "adopt", "train_student", "--experiment", "exp1", "--pair", "en-xb", check=False)
    assert proc.returncode == 1 and "already a SUCCESS stage" in proc.stderr
    assert not (student / ".attempts").exists()   # refused: nothing moved

    out = waypost(run_copy, "adopt", "train_student", "--experiment", "exp1", "--pair", "en-xb", "--force",
                  "--note", "the hand-trained model").stdout
    assert f"the earlier manifest (SUCCESS, made {made['created'][:16].replace('T', ' ')}) and its logs archived " \
           f"in {Path('results/en-xb/exp1/train_student/.attempts/1')}" in out
    assert read_manifest(student / ".attempts/1") == made
    assert (student / ".attempts/1/_logs/attempt-1.log").is_file()
    assert read_manifest(student)["adopted"] and (student / "model.json").read_text().startswith('{"trained"')

    # adopted again (the model replaced once more): the adopted manifest is archived in turn
    (student / "model.json").write_text('{"trained": "again"}\n')
    out = waypost(run_copy, "adopt", "train_student", "--experiment", "exp1", "--pair", "en-xb").stdout
    assert "the earlier manifest (SUCCESS, adopted, made " in out and ".attempts/2" in out
    assert read_manifest(student / ".attempts/2")["note"] == "the hand-trained model"

    shown = waypost(run_copy, "status", "--attempts", "train_student", "--experiment", "exp1", "--pair", "en-xb",
                    "--all-attempts").stdout
    assert f"archived .attempts/1: SUCCESS, 1 attempt, made {made['created'][:16].replace('T', ' ')}" in shown
    assert "archived .attempts/2: SUCCESS, 0 attempts" in shown
    rows = json.loads(waypost(run_copy, "find", "--stage", "train_student", "--pair", "en-xb", "--experiment",
                              "exp1", "--json").stdout)
    assert sorted((r["archive"], r["adopted"]) for r in rows if r["archive"]) == [(".attempts/1", False),
                                                                                  (".attempts/2", True)]

    # over a stage that failed: no --force needed, and its record is kept all the same
    export = run_copy / "results/en-xb/exp1/export"
    failed = {**read_manifest(export), "state": "FAILED"}
    (export / "_manifest.json").write_text(json.dumps(failed))
    out = waypost(run_copy, "adopt", "export", "--experiment", "exp1", "--pair", "en-xb").stdout
    assert "the earlier manifest (FAILED, made " in out and ".attempts/1" in out
    assert read_manifest(export / ".attempts/1") == failed
