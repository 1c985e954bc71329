"""The reference pipeline end to end, and file-state semantics (presence and
mtime), with real snakemake runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SMALL_CONFIG, planned, read_manifest, snakemake, waypost, write_config
from snakemake.exceptions import WorkflowError

from waypost.model.manifest import RUN_ID_ENV
from waypost.planning.wiring.snake import run_identity

PAIRS = ("en-xa", "en-xb")
MODELS = ("backward", "teacher-0", "teacher-1", "student")
PER_PAIR_STAGES = ("fetch_corpus", "clean_corpus", "train_vocab", "train_backward", "translate_mono",
                   "translate_corpus", "train_student", "export")


def stage(workdir: Path, pair: str, name: str, instance: str | None = None, experiment: str = "exp1") -> Path:
    path = workdir / "results" / pair / experiment / name
    return path / instance if instance else path


def manifests(workdir: Path) -> dict[str, dict]:
    return {str(p.parent.relative_to(workdir)): json.loads(p.read_text())
            for p in (workdir / "results").rglob("_manifest.json") if ".attempts" not in p.parts}


class Workflow:
    """What ``run_identity`` uses of Snakemake's workflow object."""
    def __init__(self, remote: bool):
        self.remote_exec, self.envvars = remote, set()

    def register_envvars(self, *names):
        self.envvars.update(names)


def test_jobs_get_the_run_id_of_their_run(monkeypatch, tmp_path):
    monkeypatch.setenv(RUN_ID_ENV, "left-over")
    # The main process makes it (never trusting its environment) and exports
    # it to its jobs, through Snakemake's envvars for remote ones;
    main = Workflow(remote=False)
    run_id = run_identity(main)
    assert run_id not in ("", "left-over") and os.environ[RUN_ID_ENV] == run_id
    assert main.envvars == {RUN_ID_ENV}
    # a cluster job takes it from its environment;
    assert run_identity(Workflow(remote=True)) == run_id
    # one whose executor did not pass it on stops with a clear error.
    monkeypatch.delenv(RUN_ID_ENV)
    with pytest.raises(WorkflowError, match=f"did not inherit {RUN_ID_ENV}"):
        run_identity(Workflow(remote=True))


def test_full_run_produces_report_and_manifests(finished_run):
    work = finished_run
    report = (work / "results/_all/exp1/report/report.md").read_text()
    for pair in PAIRS:
        for model in MODELS:
            assert any(pair in line and model in line for line in report.splitlines()), (pair, model, report)
    html = (work / "results/_all/exp1/report/report.html").read_text()
    assert "<table" in html and "http" not in html.split("<body", 1)[1]  # self-contained

    found = manifests(work)
    # each stage's code version: the one the run recorded for it (see test_drift)
    code = json.loads((work / ".waypost" / "stages.json").read_text())["code"]
    # 11 stages per pair (2 teachers, 4 evaluations) + the report
    assert len(found) == 2 * (len(PER_PAIR_STAGES) + 2 + 4) + 1
    for where, data in found.items():
        assert data["state"] == "SUCCESS", where
        assert data["schema"] == 1 and data["waypost_version"]
        assert data["config_hash"] and data["code_version"] == code[Path(where).parts[3]]
        attempt = data["attempts"][-1]
        assert attempt["exit_code"] == 0 and attempt["host"] and attempt["start"] <= attempt["end"]
        for out in data["outputs"]:
            blob = (work / where / out["path"]).read_bytes()
            assert hashlib.sha256(blob).hexdigest() == out["sha256"] and len(blob) == out["size"]
    student = read_manifest(stage(work, "en-xa", "train_student"))
    sources = {Path(i["path"]).parent.name: i for i in student["inputs"]}
    assert sources["translate_corpus"]["state"] == "SUCCESS"
    assert sources["translate_corpus"]["manifest"].endswith("translate_corpus/_manifest.json")
    assert student["settings"]["epochs"] == SMALL_CONFIG["stages"]["train_student"]["epochs"]

    metrics = json.loads((stage(work, "en-xa", "evaluate", "student") / "metrics.json").read_text())
    assert 0 < metrics["bleu"] < 100 and 0 < metrics["chrf"] < 100


def test_a_finished_pipeline_has_nothing_to_do_in_both_modes(run_copy):
    """`snakemake -n` says "Nothing to be done" (what users and scripts look
    for), in presence and in mtime mode, and a real run starts no job."""
    assert planned(run_copy) == {}
    assert planned(run_copy, "--config", "rerun_policy=mtime") == {}
    for mode in ("presence", "mtime"):
        real = snakemake(run_copy, "--config", f"rerun_policy={mode}")
        assert "Nothing to be done (all requested files are present and up to date)" in real.stdout + real.stderr
        assert "localrule" not in real.stdout + real.stderr


def test_presence_ignores_newer_inputs(run_copy):
    # Touch every file so that upstream files are newer than their outputs.
    future = time.time() + 3600
    for path in sorted((run_copy / "results").rglob("*")):
        if path.is_file() and "fetch_corpus" in path.parts:
            os.utime(path, (future, future))
    assert planned(run_copy) == {}


def test_presence_ignores_changed_params_and_code(run_copy, tmp_path):
    config = json.loads(json.dumps(SMALL_CONFIG))
    config["stages"]["train_student"]["epochs"] = 7
    config["stages"]["clean_corpus"] = {"max_ratio": 1.5}
    write_config(run_copy, config)
    assert planned(run_copy) == {}
    # A copy of the workflow whose rule code changed too.
    repo = Path(__file__).resolve().parent.parent
    copy = tmp_path / "repo"
    for part in ("workflow", "rules", "scripts", "config"):
        shutil.copytree(repo / part, copy / part)
    smk = copy / "rules" / "student.smk"
    smk.write_text(smk.read_text().replace("--epochs {params.epochs}", "--epochs {params.epochs} --seed 0", 1))
    assert planned(run_copy, snakefile=copy / "workflow" / "Snakefile") == {}


def test_presence_deleting_an_output_reruns_exactly_that_job(run_copy):
    before = manifests(run_copy)
    (stage(run_copy, "en-xa", "train_student") / "model.json").unlink()
    assert planned(run_copy) == {"train_student": 1}
    snakemake(run_copy)
    after = manifests(run_copy)
    changed = sorted(k for k in after if after[k]["created"] != before[k]["created"])
    assert changed == ["results/en-xa/exp1/train_student"]
    student = after["results/en-xa/exp1/train_student"]
    assert [a["number"] for a in student["attempts"]] == [1, 2]
    # The earlier workspace was archived, not deleted.
    archived = stage(run_copy, "en-xa", "train_student") / ".attempts" / "1"
    assert (archived / "_manifest.json").exists() and (archived / "checkpoints").is_dir()
    assert student["attempts"][0]["workspace"] == ".attempts/1"
    assert (stage(run_copy, "en-xa", "train_student") / student["attempts"][0]["log"]).exists()


def test_presence_missing_intermediate_is_rebuilt_only_itself(run_copy):
    shutil.rmtree(stage(run_copy, "en-xb", "clean_corpus"))
    assert planned(run_copy) == {"clean_corpus": 1}


def _all_inputs(workdir: Path, *args: str) -> set[str]:
    """The inputs of the dry run's ``rule all`` job (its default targets)."""
    out = snakemake(workdir, "-n", *args).stdout
    block = out.split("\nrule all:\n", 1)[1] if "\nrule all:\n" in out else out.split("localrule all:\n", 1)[1]
    line = next(line for line in block.splitlines() if line.strip().startswith("input:"))
    return set(line.split(":", 1)[1].replace(",", " ").split())


def test_the_default_targets_are_the_jobs_to_do_that_no_job_to_do_reads(tmp_path, run_copy):
    """`rule all` asks for what the plain workflow's would: the last
    outputs, the jobs to do bringing in what they read; `--batch` still
    splits a list (of every output), and a deleted intermediate is its own
    target."""
    write_config(tmp_path, SMALL_CONFIG)
    graph = json.loads((run_copy / ".waypost" / "stages.json").read_text())
    read = {parent for parents in graph["parents"].values() for parent in parents}
    leaves = [name for name in graph["stages"] if name not in read]
    targets = _all_inputs(tmp_path)
    assert targets and {Path(t).parts[3] for t in targets} == set(leaves), (leaves, targets)
    everything, first = planned(tmp_path), planned(tmp_path, "--batch", "all=1/2")   # (over every output)
    assert 0 < sum(first.values()) < sum(everything.values()) and set(first) <= set(everything)

    shutil.rmtree(stage(run_copy, "en-xb", "clean_corpus"))
    assert {Path(t).parts[1:4] for t in _all_inputs(run_copy)} == {("en-xb", "exp1", "clean_corpus")}


def test_a_stage_reading_nothing_left_unfinished_is_redone_when_its_file_is_asked_for(run_copy):
    """A stage whose rule reads nothing has an input function only while one
    of its jobs is to be forced: it is redone by the default run and when
    its file is the target, in both modes; the others are not."""
    fetch = stage(run_copy, "en-xa", "fetch_corpus")
    asked = str((fetch / "train.tsv").relative_to(run_copy))
    assert planned(run_copy, asked) == {}
    due = time.time() - 60
    (fetch / "_unfinished").touch()
    os.utime(fetch / "_unfinished", (due, due))   # a series whose next one is due
    for mode in ("presence", "mtime"):
        assert planned(run_copy, asked, "--config", f"rerun_policy={mode}") == {"fetch_corpus": 1}, mode
    assert planned(run_copy) == {"fetch_corpus": 1}
    other = str((stage(run_copy, "en-xb", "fetch_corpus") / "train.tsv").relative_to(run_copy))
    assert planned(run_copy, other) == {}


def test_a_stage_gone_from_every_pair_is_redone_alone_in_presence_mode(run_copy):
    """Where nothing of a stage is on disk, its rule keeps the inputs it
    wrote (no input function: planned as plain Snakemake plans it); the
    stages that read it are done and stay done in presence mode, and in
    mtime mode Snakemake reruns them, as it does for any remade input."""
    for pair in PAIRS:
        shutil.rmtree(stage(run_copy, pair, "translate_corpus"))
    assert planned(run_copy) == {"translate_corpus": 2}
    mtime = planned(run_copy, "--config", "rerun_policy=mtime")
    assert mtime["translate_corpus"] == 2 and mtime.get("train_student") == 2, mtime
    proc = snakemake(run_copy)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert planned(run_copy) == {}
    for pair in PAIRS:
        assert (stage(run_copy, pair, "translate_corpus") / "_manifest.json").exists()


def test_mtime_mode_deletion_reruns_downstream(run_copy):
    config = json.loads(json.dumps(SMALL_CONFIG))
    config["rerun_policy"] = "mtime"
    write_config(run_copy, config)
    (stage(run_copy, "en-xa", "train_student") / "model.json").unlink()
    assert planned(run_copy) == {"train_student": 1, "evaluate": 1, "export": 1, "report": 1}


PLAIN_CHAIN = """
rule all:
    input: "c.txt"
rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "cat {input} > {output}"
rule c:
    input: "b.txt"
    output: "c.txt"
    shell: "cat {input} > {output}"
"""


def plain_jobs(workdir: Path, *args: str) -> set[str]:
    """The rules plain Snakemake's dry run (mtime trigger) would run."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-c1", "--rerun-triggers", "mtime", *args],
                          cwd=workdir, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return {line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith(("rule ", "localrule "))} - {"all"}


def touch_later(path: Path) -> None:
    later = path.stat().st_mtime + 60
    os.utime(path, (later, later))


def test_mtime_mode_reruns_on_a_newer_input_as_snakemake_does(run_copy, tmp_path):
    """What docs/concepts.md says of mtime mode, side by side with plain
    Snakemake 9: an input newer than its outputs reruns what uses it, unless
    it is at most --max-checksum-file-size (1 MB) and its checksum is the
    one Snakemake recorded when the job ran: a touched, unchanged small
    file reruns nothing; a touched one over the limit, or a changed one,
    reruns what follows it."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "Snakefile").write_text(PLAIN_CHAIN)
    (plain / "a.txt").write_text("x\n")
    subprocess.run([sys.executable, "-m", "snakemake", "-c1", "-q"], cwd=plain, check=True, capture_output=True)
    config = json.loads(json.dumps(SMALL_CONFIG))
    config["rerun_policy"] = "mtime"
    write_config(run_copy, config)
    assert planned(run_copy) == {} and plain_jobs(plain) == set()
    corpus = stage(run_copy, "en-xa", "clean_corpus")
    output = corpus / read_manifest(corpus)["outputs"][0]["path"]

    # Touched, the same bytes: nothing (Snakemake compares the checksum it recorded).
    touch_later(plain / "a.txt")
    touch_later(output)
    assert plain_jobs(plain) == set()
    assert planned(run_copy) == {}

    # The same touch with a checksum limit below the file's size: what follows reruns.
    limit = ("--max-checksum-file-size", "1")
    assert plain_jobs(plain, *limit) == {"b", "c"}
    follows = planned(run_copy, *limit)
    assert "clean_corpus" not in follows and follows.get("train_student") == 1, follows

    # Changed bytes: what follows reruns, as for the touch over the limit.
    (plain / "a.txt").write_text("y\n")
    output.write_bytes(output.read_bytes() + b"\n")
    touch_later(output)
    assert plain_jobs(plain) == {"b", "c"}
    assert planned(run_copy) == follows


def test_adding_files_by_hand_makes_a_stage_done(run_copy):
    config = json.loads(json.dumps(SMALL_CONFIG))
    config["experiments"]["exp2"] = {"pairs": ["en-xa"], "teachers": 2}
    write_config(run_copy, config)
    # Copy exp1's finished teachers (just the model files) into exp2 by hand.
    for i in ("0", "1"):
        target = stage(run_copy, "en-xa", "train_teacher", i, experiment="exp2")
        target.mkdir(parents=True)
        shutil.copy2(stage(run_copy, "en-xa", "train_teacher", i) / "model.json", target / "model.json")
    jobs = planned(run_copy)
    assert "train_teacher" not in jobs
    assert jobs["train_student"] == 1 and jobs["fetch_corpus"] == 1
    snakemake(run_copy)
    teacher = stage(run_copy, "en-xa", "train_teacher", "0", experiment="exp2")
    assert not (teacher / "_manifest.json").exists()
    distilled = read_manifest(stage(run_copy, "en-xa", "translate_corpus", experiment="exp2"))
    assert {i["state"] for i in distilled["inputs"] if "train_teacher" in i["path"]} == {"ADOPTED"}

    grid = json.loads(waypost(run_copy, "status", "--json").stdout)
    cell = grid["experiments"]["exp2"]["en-xa"]["train_teacher"]
    assert cell["state"] == "adopted"
    assert grid["experiments"]["exp2"]["en-xa"]["train_student"]["state"] == "SUCCESS"


def test_status_grid(run_copy):
    (stage(run_copy, "en-xb", "export") / "package.tar.gz").unlink()
    grid = json.loads(waypost(run_copy, "status", "--json").stdout)
    rows = grid["experiments"]["exp1"]
    assert rows["en-xa"]["export"]["state"] == "SUCCESS"
    assert rows["en-xb"]["export"]["state"] == "missing"
    assert rows["en-xa"]["train_teacher"]["state"] == "SUCCESS"
    assert set(rows["en-xa"]["train_teacher"]["instances"]) == {"0", "1"}
    assert rows["_all"]["report"]["state"] == "SUCCESS"
    text = waypost(run_copy, "status").stdout
    assert "en-xa" in text and "legend" in text and "missing" in text
