"""examples/translation, run as a user runs it: an FTT-shaped pipeline whose
splits are checkpoints (how many parts follows the data), translated part ×
teacher, the ensemble's best per part, collected, filtered, a student trained
and exported, a report per experiment. Locally (all SUCCESS, a report that
says what the stages made, nothing to do the second time, more corpus data
makes more parts and redoes the collectors, nothing else) and on the Slurm
cluster, packed (one job array per rule's ready jobs)."""

from __future__ import annotations

import collections
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import LOCAL_PROFILE, REPO, finish, read_manifest

from waypost.model import events

EXAMPLE = REPO / "examples" / "translation"
PER_PAIR = ["clean_corpus", "train_backward", "split_mono", "collect_mono", "split_corpus", "collect_corpus",
            "score_filter", "align", "train_student", "finetune", "evaluate", "export"]


def copy_example(target: Path) -> Path:
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("results", ".snakemake", "events.jsonl"))
    return target


def run(work: Path, *args: str, profile: Path = LOCAL_PROFILE, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--profile", str(profile), *args,
                           *events.snakemake_args(str(work / "events.jsonl"))],
                          cwd=work, capture_output=True, text=True, timeout=timeout)


def ran(work: Path) -> dict[str, int]:
    """Jobs the last run started, per rule (the ones checkpoints added too)."""
    path = work / "events.jsonl"
    found = collections.Counter(e["rule"] for e in events.jobs(events.read(str(path))))
    path.unlink(missing_ok=True)
    return dict(found)


def waypost(work: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", *args], cwd=work, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def config(work: Path) -> dict:
    return yaml.safe_load((work / "config" / "config.yaml").read_text())


def teachers(work: Path, experiment: str, pair: str) -> int:
    n = config(work)["experiments"][experiment]["teachers"]
    return n[pair] if isinstance(n, dict) else n


def stage(work: Path, experiment: str, pair: str, name: str) -> Path:
    return work / "results" / pair / experiment / name


def part_files(directory: Path) -> list[Path]:
    """A split's parts (not Snakemake's marker of a directory() output)."""
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def count_lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def expected_jobs(work: Path) -> dict[str, int]:
    """What a run from nothing makes, from the data and the config: the
    splits' lines per part decide the parts, the config the teachers."""
    settings = config(work)["stages"]
    jobs: collections.Counter = collections.Counter()
    for experiment, spec in config(work)["experiments"].items():
        jobs["report"] += 1
        for pair in spec["pairs"]:
            corpus = math.ceil(count_lines(stage(work, experiment, pair, "clean_corpus") / "corpus.tsv")
                               / settings["split_corpus"]["lines"])
            mono = math.ceil(count_lines(work / "data" / pair / "mono.txt") / settings["split_mono"]["lines"])
            for name in PER_PAIR:
                jobs[name] += 1
            jobs["translate_mono"] += mono
            jobs["train_teacher"] += teachers(work, experiment, pair)
            jobs["translate_corpus"] += corpus * teachers(work, experiment, pair)
            jobs["extract_best"] += corpus
    return dict(jobs)


def report_rows(work: Path, experiment: str) -> dict[str, dict]:
    text = (work / "results" / "_all" / experiment / "report" / "report.md").read_text()
    assert text.startswith(f"# Experiment {experiment}\n"), text
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
        pair = cells.pop("pair")
        rows[pair] = {k: float(v) for k, v in cells.items()}
    return rows


def check_report(work: Path) -> None:
    """Each experiment's report says what its stages made, pair by pair."""
    for experiment, spec in config(work)["experiments"].items():
        rows = report_rows(work, experiment)
        assert sorted(rows) == sorted(spec["pairs"])
        for pair, row in rows.items():
            parts = len(part_files(stage(work, experiment, pair, "split_corpus") / "parts"))
            mono = len(part_files(stage(work, experiment, pair, "split_mono") / "parts"))
            assert (row["teachers"], row["corpus parts"], row["mono parts"]) == (
                teachers(work, experiment, pair), parts, mono)
            assert row["translations"] == parts * row["teachers"]
            assert row["distilled"] == count_lines(stage(work, experiment, pair, "clean_corpus") / "corpus.tsv")
            kept = count_lines(stage(work, experiment, pair, "score_filter") / "corpus.tsv")
            assert row["kept"] == kept and 0 < kept < row["distilled"], row   # the filter drops some lines
            assert 0 < row["student"] <= row["finetuned"] <= 100 and 0 < row["best teacher"] <= 100, row


def all_manifests(work: Path) -> dict[str, dict]:
    return {str(p.parent.relative_to(work / "results")): read_manifest(p.parent)
            for p in (work / "results").rglob("_manifest.json") if ".attempts" not in p.parts}


@pytest.fixture(scope="module")
def translated(tmp_path_factory) -> Path:
    """The example, run once from nothing with the local profile."""
    work = copy_example(tmp_path_factory.mktemp("translation") / "translation")
    started = time.monotonic()
    proc = run(work)
    assert proc.returncode == 0, proc.stderr[-5000:]
    (work / "seconds").write_text(f"{time.monotonic() - started:.1f}")
    return work


def test_the_example_runs_locally_and_reports_each_experiment(translated):
    work = translated
    assert ran(work) == expected_jobs(work)
    records = all_manifests(work)
    assert {r["state"] for r in records.values()} == {"SUCCESS"} and len(records) == sum(expected_jobs(work).values())
    # part × teacher: one instance per part the checkpoint found and teacher of the pair
    parts = [p.stem for p in part_files(stage(work, "wide", "en-de", "split_corpus") / "parts")]
    assert len(parts) > 1
    assert sorted(p.name for p in stage(work, "wide", "en-de", "translate_corpus").iterdir()) == sorted(
        f"{part}-t{i}" for part in parts for i in range(3))
    # the ensemble's best of a part reads that part's translation by each teacher
    inputs = [i["path"] for i in read_manifest(stage(work, "wide", "en-de", "extract_best") / parts[0])["inputs"]]
    assert sorted(Path(i).parent.name for i in inputs) == [f"{parts[0]}-t{i}" for i in range(3)]
    check_report(work)
    assert float((work / "seconds").read_text()) < 60


def test_a_second_run_has_nothing_to_do(translated):
    proc = run(translated, "-n")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    ran(translated)
    again = run(translated)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ran(translated) == {}


def test_more_corpus_data_makes_more_parts_and_redoes_the_collectors(translated, tmp_path):
    work = tmp_path / "translation"
    shutil.copytree(translated, work, symlinks=True, copy_function=shutil.copy2)
    (work / "events.jsonl").unlink(missing_ok=True)
    subprocess.run([sys.executable, "scripts/make_data.py", "--lines", "90", "--pair", "en-de"], cwd=work, check=True)
    # presence mode: a done stage is done; the new data reaches the pipeline
    # when the stages that read it are redone
    waypost(work, "rerun", "clean_corpus", "--pair", "en-de")
    waypost(work, "rerun", "split_corpus", "--pair", "en-de")
    proc = run(work)
    assert proc.returncode == 0, proc.stderr[-5000:]
    changed = {}
    for experiment in ("base", "wide"):
        split = stage(work, experiment, "en-de", "split_corpus")
        before = {p.stem: p.read_text() for p in part_files(split / ".attempts/1/parts")}
        after = {p.stem: p.read_text() for p in part_files(split / "parts")}
        assert len(after) > len(before) and not set(before) - set(after)
        changed[experiment] = sorted(p for p in after if before.get(p) != after[p])
        same = sorted(set(before) - set(changed[experiment]))
        assert same, "no part is the same as before"
        for part in same:   # the same parts are not redone
            assert len(read_manifest(stage(work, experiment, "en-de", "extract_best") / part)["attempts"]) == 1
        assert (f"{experiment}/en-de/collect_corpus: made from {len(before)} inputs, now {len(after)} "
                f"({len(after) - len(before)} new, 0 gone): redone") in proc.stderr
    assert ran(work) == {"clean_corpus": 2, "split_corpus": 2, "collect_corpus": 2,
                         "extract_best": sum(len(c) for c in changed.values()),
                         "translate_corpus": sum(len(c) * teachers(work, e, "en-de") for e, c in changed.items())}
    assert len(read_manifest(stage(work, "base", "en-fr", "collect_corpus"))["attempts"]) == 1

    # What was made from the collected corpus is done (presence mode): redo it on purpose.
    out = waypost(work, "rerun", "score_filter", "--pair", "en-de", "--downstream")
    assert "14 stage(s) will be redone" in out
    proc = run(work)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert ran(work) == {name: 2 for name in ("score_filter", "align", "train_student", "finetune", "evaluate",
                                              "export", "report")}
    check_report(work)
    proc = run(work, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_the_example_runs_packed_on_slurm(slurm_cluster, tmp_path):
    from test_slurm_jobs import FAST, sacct
    work = copy_example(tmp_path / "translation")
    since = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--profile", str(REPO / "profiles" / "onprem"), *FAST,
                             *events.snakemake_args(str(work / "events.jsonl"))], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    code, out = finish(proc, timeout=400)
    assert code == 0, out[-5000:]
    assert ran(work) == expected_jobs(work)
    records = all_manifests(work)
    assert {r["state"] for r in records.values()} == {"SUCCESS"}, out[-5000:]
    check_report(work)
    # Packed: the ready jobs of a rule went as job arrays; the parts a
    # checkpoint found together once it ended, so fewer arrays than parts.
    jobs = {r["JobIDRaw"]: r for r in sacct("JobIDRaw", "JobID", "State", since=since, workdir=work,
                                            jobs=len(records))}
    by_stage = collections.defaultdict(list)
    for record in records.values():
        job = jobs[record["attempts"][-1]["scheduler_job_id"]]
        assert job["State"] == "COMPLETED", job
        by_stage[record["stage"]].append(re.sub(r"_\d+$", "", job["JobID"]))
    submissions = {stage_name: len(set(arrays)) for stage_name, arrays in by_stage.items()}
    assert sum(submissions.values()) < 0.75 * len(records), submissions
    assert submissions["translate_corpus"] < len(by_stage["translate_corpus"]) / 2, submissions
    again = run(work, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]


# -- docs/fanout.md, run as written (as the tutorial is: tests/test_tutorial.py) --

FANOUT = REPO / "docs" / "fanout.md"


def page() -> list:
    from test_tutorial import sections
    found = sections(FANOUT.read_text())
    assert sum(len(s.steps) for s in found) > 15, "the fan-out page has lost its commands"
    return found


def test_the_fanout_page_shows_the_example_as_it_is():
    snakefile = (EXAMPLE / "workflow" / "Snakefile").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", FANOUT.read_text(), re.S | re.M)
    assert len(blocks) >= 3
    for block in blocks:
        assert block in snakefile, f"docs/fanout.md shows rules that examples/translation does not have:\n{block}"


@pytest.fixture(scope="module")
def fanout_page_here(tmp_path_factory) -> Path:
    """The page's sections that need nothing but this machine, run once in
    a fresh copy of the example (as a reader's checkout has it)."""
    from test_tutorial import Reader, reader_env
    base = tmp_path_factory.mktemp("fanout-page")
    (base / "home").mkdir()
    copy_example(base / "examples" / "translation")
    reader = Reader(base, reader_env(base / "home"))
    for section in page():
        if section.needs is None:
            reader.run(section)
    (base / "cwd").write_text(str(reader.cwd.relative_to(base)))
    return base


def test_the_fanout_page_runs_as_written_on_this_machine(fanout_page_here):
    work = fanout_page_here / "examples" / "translation"
    assert (fanout_page_here / "cwd").read_text() == "examples/translation"
    # the page ends with en-de's corpus back to its first parts, collected
    # again (what was made from it is not redone: presence mode)
    for experiment in ("base", "wide"):
        for pair in ("en-de", "en-fr"):
            stats = json.loads((stage(work, experiment, pair, "collect_corpus") / "stats.json").read_text())
            assert stats["parts"] == len(part_files(stage(work, experiment, pair, "split_corpus") / "parts")) == 3
    assert report_rows(work, "wide")["en-de"]["corpus parts"] == 4


def test_the_fanout_page_on_slurm(fanout_page_here, tmp_path, slurm_cluster):
    from test_tutorial import Reader, reader_env
    target = tmp_path / "t"
    shutil.copytree(fanout_page_here, target, symlinks=True, copy_function=shutil.copy2)
    reader = Reader(target / (fanout_page_here / "cwd").read_text(), reader_env(target / "home"))
    ran_any = False
    for section in page():
        if section.needs == "slurm":
            reader.run(section)
            ran_any = True
    assert ran_any, "the fan-out page has no section that needs slurm"
    work = target / "examples" / "translation"
    slurm_ids = {read_manifest(p)["attempts"][-1].get("scheduler_job_id")
                 for p in (stage(work, "base", "en-fr", "translate_corpus")).iterdir()}
    assert None not in slurm_ids and len(slurm_ids) == 6
    assert read_manifest(work / "results/_all/base/report")["attempts"][-1].get("scheduler_job_id")
