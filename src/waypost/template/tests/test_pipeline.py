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


def planned_jobs(dry_run_output):
    """The rules a dry run would run, from its job stats table."""
    stats = dry_run_output.split("Job stats:")[1].split("total")[0]
    return {line.split()[0] for line in stats.splitlines()[3:] if line.strip()}


def test_runs_reruns_one_stage_and_is_then_done(tmp_path):
    work = tmp_path / "pipeline"
    shutil.copytree(HERE, work, ignore=shutil.ignore_patterns("results", ".snakemake", ".waypost", "tests"))
    first = snakemake(work)
    assert first.returncode == 0, first.stderr
    summary = work / "results/_all/first/summarize/summary.md"
    assert "| small |" in summary.read_text() and "| large |" in summary.read_text()

    (work / "results/small/first/fit/model.json").unlink()
    plan = snakemake(work, "-n")
    assert planned_jobs(plan.stdout) == {"fit", "all"}   # exactly that stage
    again = snakemake(work)
    assert again.returncode == 0, again.stderr
    assert (work / "results/small/first/fit/model.json").exists()

    done = snakemake(work, "-n")
    assert "Nothing to be done" in done.stdout + done.stderr
