"""The pipeline runs, a deleted output reruns exactly its stage, and a
finished pipeline has nothing to do. Run with `pytest` from the pipeline's
directory."""
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def snakemake(workdir, *args):
    return subprocess.run([sys.executable, "-m", "snakemake", "--profile", "local", *args],
                          cwd=workdir, capture_output=True, text=True)


def planned_jobs(workdir):
    """The rules a dry run would run (not ``all``), as Snakemake reports
    them to waypost's logger plugin (``--logger waypost``)."""
    from waypost.model import events
    path = workdir / ".waypost" / "planned-events.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    snakemake(workdir, "-n", *events.snakemake_args(str(path)))
    return set(events.counts(events.read(str(path))))


def test_runs_reruns_one_stage_and_is_then_done(tmp_path):
    work = tmp_path / "pipeline"
    shutil.copytree(HERE, work, ignore=shutil.ignore_patterns("results", ".snakemake", ".waypost", "tests"))
    first = snakemake(work)
    assert first.returncode == 0, first.stderr
    summary = work / "results/_all/first/summarize/summary.md"
    assert "| small |" in summary.read_text() and "| large |" in summary.read_text()

    (work / "results/small/first/fit/model.json").unlink()
    assert planned_jobs(work) == {"fit"}   # exactly that stage
    again = snakemake(work)
    assert again.returncode == 0, again.stderr
    assert (work / "results/small/first/fit/model.json").exists()

    done = snakemake(work, "-n")
    assert "Nothing to be done" in done.stdout + done.stderr
