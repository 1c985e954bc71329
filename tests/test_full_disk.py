"""A root on a filesystem that fills up (issue 38): a real, small tmpfs,
filled by the step after it wrote its outputs (or before the run), so that
one of the runner's own records (the attempt's script, its log, the running
marker, the manifest) meets ENOSPC. The runner ends with one line naming
the file and the filesystem, no traceback; the stage does not look done;
once space is freed the next run finishes everything."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import planned, snakemake, write_config

# The step: its outputs (``parts`` small files: a manifest that needs a page
# more than the marker does), then, when $FILL_LEAVE is set, a filler file at
# $FILL_AT that leaves that many pages free ($FILL_SAY: a line for the log after).
FILL = r'''
import os, sys
stage, parts = sys.argv[1], int(sys.argv[2])
for i in range(parts):
    with open(os.path.join(stage, f"part-{i:02d}.txt"), "w") as f:
        f.write(f"part {i}\n")
if "FILL_LEAVE" in os.environ:
    fd = os.open(os.path.join(os.environ["FILL_AT"], "filler"), os.O_WRONLY | os.O_CREAT, 0o644)
    page, size = b"\0" * 4096, 0
    while True:
        try:
            size += os.write(fd, page)
        except OSError:
            break
    os.ftruncate(fd, max(0, size - 4096 * int(os.environ["FILL_LEAVE"])))
    os.close(fd)
    if os.environ.get("FILL_SAY"):
        print("parts written, the disk filled", flush=True)
'''

SNAKEFILE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)
PARTS = 30

rule shard:
    output: parts=[wp.out(f"part-{i:02d}.txt") for i in range(PARTS)]
    shell: "python %s/fill.py $WAYPOST_STAGE_DIR %d" % (workflow.basedir, PARTS)

rule merge:
    input: rules.shard.output.parts
    output: out=wp.out("merged.txt")
    shell: "cat {input} > {output.out}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def workflow_on(work: Path, disk: Path) -> Path:
    (work / "workflow").mkdir()
    (work / "workflow" / "Snakefile").write_text(SNAKEFILE)
    (work / "workflow" / "fill.py").write_text(FILL)
    write_config(work, {"root": str(disk / "runs"), "experiments": {"x9": {}}})
    return disk / "runs" / "_all" / "x9"


def run(work: Path, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return snakemake(work, snakefile=work / "workflow" / "Snakefile", check=check, env=env)


def states(work: Path) -> dict[str, str]:
    """stage → state, as ``waypost status`` (the lifecycle reader) says."""
    proc = subprocess.run([sys.executable, "-m", "waypost.cli", "status", "--config", "config.yaml", "--workflow",
                           "workflow", "--json"], cwd=work, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)["experiments"]["x9"]["_all"]
    return {stage: cell["state"] for stage, cell in found.items()}


def fill_now(disk: Path, leave: int) -> None:
    """Fill ``disk`` from the test (between runs), leaving ``leave`` pages."""
    subprocess.run([sys.executable, "-c", FILL, str(disk), "0"], check=True,
                   env={**os.environ, "FILL_AT": str(disk), "FILL_LEAVE": str(leave)})


# A traceback's frame in one of waypost's modules (not a step's script).
WAYPOST_FRAME = re.compile(r'File "[^"]*/waypost/(stores/)?\w+\.py", line')

# What fills the disk, and the record that meets ENOSPC first.
CASES = {
    # the step fills it all, then says something: its log can't grow
    "log": ({"FILL_LEAVE": "0", "FILL_SAY": "1"}, None, "_logs/attempt-1.log"),
    # a silent step fills it all: its (empty) log is there, the marker can't be rewritten
    "marker": ({"FILL_LEAVE": "0"}, None, "_running.json"),
    # a page left: the marker (one page) is rewritten, the manifest (two) can't be written
    "manifest": ({"FILL_LEAVE": "1"}, None, "_manifest.json"),
    # full before the run: the attempt's script can't be written, the step never runs
    "before": ({}, 0, "_logs/attempt-1.sh"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_full_disk_under_the_records_gives_one_line_and_the_next_run_finishes(small_disk, tmp_path, case):
    fill, before, record = CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    experiment = workflow_on(work, small_disk)
    if before is not None:
        fill_now(small_disk, before)
    failed = run(work, env={"FILL_AT": str(small_disk), **fill}, check=False)
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0, said

    stage = experiment / "shard"
    lines = [line for line in said.splitlines() if "no space left on device" in line]
    pattern = (rf"waypost: x9/shard: no space left on device writing {re.escape(str(stage / record))} "
               rf"\({re.escape(str(small_disk))}: \d+ bytes free\): not recorded; free space and run again")
    assert len(lines) == 1 and re.fullmatch(pattern, lines[0]), said
    assert not WAYPOST_FRAME.search(said), said   # no traceback through waypost

    # Nothing looks done: no SUCCESS manifest, the planner redoes the stage.
    manifest = stage / "_manifest.json"
    assert not manifest.exists() or json.loads(manifest.read_text())["state"] != "SUCCESS"
    assert states(work)["shard"] != "SUCCESS"
    assert states(work).get("merge") != "SUCCESS"
    assert planned(work, snakefile=work / "workflow" / "Snakefile") == {"shard": 1, "merge": 1}

    (small_disk / "filler").unlink()
    run(work)
    assert states(work) == {"shard": "SUCCESS", "merge": "SUCCESS"}
    assert planned(work, snakefile=work / "workflow" / "Snakefile") == {}
