"""A ``run:`` job under waypost: its block runs in a fork of the job's own
Snakemake process (the step runner forked from it, each attempt a fork of
that), not in a second Snakemake process; what the block sees, how it ends
and what a time limit does to it, side by side with plain Snakemake and
with the second process (``WAYPOST_STEP_SERVER=off``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml

MARK = "# waypost"
BLOCKS = textwrap.dedent("""\
    import json, os, sys
    from waypost.snakemake import Pipeline  # waypost
    wp = Pipeline(config, workflow)  # waypost

    rule all:
        input: expand("seen/{item}.json", item=["x", "y"])

    rule look:
        output: "seen/{item}.json"
        threads: 2
        params: tag="t-{item}"
        run:
            print("looking at", wildcards.item)
            shell("echo from-shell $OMP_NUM_THREADS > seen/{wildcards.item}.shell")
            seen = {"item": wildcards.item, "tag": params.tag, "threads": threads,
                    "omp": os.environ.get("OMP_NUM_THREADS"), "mine": os.environ.get("MINE"),
                    "cwd": os.getcwd(), "second_process": "WAYPOST_RUN_BLOCK" in os.environ}
            with open(output[0], "w") as f:
                json.dump(seen, f)

    rule quits:
        output: "quits.txt"
        run:
            print("leaving with 3")
            sys.exit(3)

    rule waits:
        output: "waits.txt"
        run:
            shell("sleep 600 & echo $! > waits.pid; wait")

    wp.finish()  # waypost
    """)


def _workdir(path: Path, with_waypost: bool, **config) -> Path:
    path.mkdir(parents=True)
    keep = (lambda line: True) if with_waypost else (lambda line: not line.rstrip().endswith(MARK))
    (path / "Snakefile").write_text("".join(line for line in BLOCKS.splitlines(keepends=True) if keep(line)))
    waypost_keys = {"root": "records", "experiments": {"trial": {}}} if with_waypost else {}
    (path / "config.yaml").write_text(yaml.safe_dump({**waypost_keys, **config}))
    return path


def _snakemake(workdir: Path, *targets: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config.yaml",
                           "--", *targets], cwd=workdir, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MINE": "mine", **(env or {})})


def _record(workdir: Path, rule: str, job: str = "") -> dict:
    path = workdir / "records" / "_all" / "trial" / rule / job / "_manifest.json"
    return json.loads(path.read_text())


def test_a_run_block_sees_what_plain_snakemake_gives_it_without_a_second_snakemake_process(tmp_path):
    seen = {}
    for name, with_waypost, env in (("plain", False, {}), ("wp", True, {}),
                                    ("wp-off", True, {"WAYPOST_STEP_SERVER": "off"})):
        workdir = _workdir(tmp_path / name, with_waypost)
        run = _snakemake(workdir, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        seen[name] = {item: json.loads((workdir / "seen" / f"{item}.json").read_text()) for item in ("x", "y")}
        for item in ("x", "y"):
            assert (workdir / "seen" / f"{item}.shell").read_text() == "from-shell 2\n"   # (shell's threads)
            seen[name][item]["cwd"] = os.path.relpath(seen[name][item]["cwd"], workdir)
    assert seen["plain"]["x"] == {"item": "x", "tag": "t-x", "threads": 2, "omp": None, "mine": "mine", "cwd": ".",
                                  "second_process": False}
    assert seen["wp"] == seen["plain"]
    for item in ("x", "y"):   # (the second process is started by ``shell``, whose math-library threads it sees)
        assert seen["wp-off"][item] == {**seen["plain"][item], "second_process": True, "omp": "1"}
    for name in ("wp", "wp-off"):
        log = (tmp_path / name / "records" / "_all" / "trial" / "look" / "x" / "_logs" / "attempt-1.log").read_text()
        assert "looking at x" in log
        assert _record(tmp_path / name, "look", "x")["state"] == "SUCCESS"
    again = _snakemake(tmp_path / "wp")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_run_block_that_exits_with_a_status_fails_with_it_and_says_so(tmp_path):
    workdir = _workdir(tmp_path / "wp", True)
    run = _snakemake(workdir, "quits.txt")
    assert run.returncode == 1
    assert "leaving with 3" in run.stderr
    assert "the run: block of rule quits" in run.stderr and "returned non-zero exit status 3" in run.stderr
    assert "Traceback (most recent call last)" not in run.stderr, run.stderr[-3000:]
    record = _record(workdir, "quits")
    assert record["state"] == "FAILED"
    assert record["attempts"][-1]["exit_code"] == 3


def test_a_run_block_past_its_time_limit_is_stopped_with_what_it_started(tmp_path):
    workdir = _workdir(tmp_path / "wp", True, stages={"waits": {"policy": {"runtime": 0.03}}})
    started = time.monotonic()
    run = _snakemake(workdir, "waits.txt")
    assert run.returncode == 1
    assert time.monotonic() - started < 120
    assert _record(workdir, "waits")["state"] == "TIMEOUT"
    sleeper = int((workdir / "waits.pid").read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{sleeper}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{sleeper}").exists() or \
        Path(f"/proc/{sleeper}/stat").read_text().split(")")[1].split()[0] == "Z", "the block's command outlived it"
