"""`waypost cron` and the reliability suite: locked runs, recovery from kills,
untrustworthy manifests set aside, bad input refused, and a soak test."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import LOCAL_PROFILE, REPO, SMALL_CONFIG, SNAKEFILE, planned, read_manifest, snakemake, write_config

from waypost import stores
from waypost.model import events, manifest

SOAK = REPO / "tests" / "soak"


def cron(workdir: Path, *extra: str, snakefile: Path = SNAKEFILE, workflow: Path = REPO / "workflow",
         env: dict | None = None, wait: bool = True):
    cmd = [sys.executable, "-m", "waypost.cli", "cron", "--config", str(workdir / "config.yaml"),
           "--workflow", str(workflow), "--profile", str(LOCAL_PROFILE), "--", "-s", str(snakefile), *extra]
    if not wait:
        return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


def records(workdir: Path) -> list[dict]:
    log = workdir / ".waypost" / "cron.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_cron_runs_records_and_is_idempotent(tmp_path):
    write_config(tmp_path, SMALL_CONFIG)
    first = cron(tmp_path)
    assert first.returncode == 0, first.stderr
    (record,) = records(tmp_path)
    assert record["jobs"] == 29 and record["succeeded"] == 29 and record["by_state"] == {"SUCCESS": 29}
    assert Path(tmp_path / record["log"]).exists()
    # What Snakemake reported of its jobs, beside the log: every job it started, none failed.
    reported = events.read(str(tmp_path / record["events"]))
    assert len(events.jobs(reported)) == 29 and not events.errors(reported) and record["job_errors"] == 0
    second = cron(tmp_path)
    assert second.returncode == 0 and "0 stage(s) ran" in second.stdout
    assert records(tmp_path)[-1]["nothing_to_do"] is True
    assert records(tmp_path)[-1]["log"] is None  # idle runs leave no log file behind
    assert records(tmp_path)[-1]["events"] is None
    assert sorted(p.name for p in (tmp_path / ".waypost" / "runs").iterdir()) == sorted([
        Path(record["log"]).name, Path(record["events"]).name])


def test_two_crons_at_the_same_moment_exactly_one_runs(tmp_path):
    write_config(tmp_path, SMALL_CONFIG)
    runs = [cron(tmp_path, wait=False) for _ in range(2)]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert sum("another run" in out for out, _ in outputs) == 1
    assert len(records(tmp_path)) == 1


def test_cron_recovers_after_snakemake_is_sigkilled(tmp_path):
    config = json.loads(json.dumps(SMALL_CONFIG))
    config["stages"]["fetch_corpus"]["sentences"] = 3000
    config["stages"]["train_backward"]["epochs"] = 300
    write_config(tmp_path, config)
    run = cron(tmp_path, wait=False)
    stage = tmp_path / "results/en-xa/exp1/train_backward"
    deadline = time.time() + 300
    while not list((stage / "checkpoints").glob("epoch-*.json")) and time.time() < deadline:
        time.sleep(0.2)
    # The main Snakemake process (cron's child) dies; the step dies with its runner.
    main = subprocess.run(["pgrep", "-P", str(run.pid), "-f", "snakemake"], capture_output=True, text=True)
    os.kill(int(main.stdout.split()[0]), signal.SIGKILL)
    run.communicate(timeout=120)
    assert (tmp_path / ".snakemake" / "locks").exists() and os.listdir(tmp_path / ".snakemake" / "locks")

    # The killed Snakemake's job goes on by itself; cron runs until all is done,
    # never running a second attempt of it at the same time.
    outputs = []
    for _ in range(12):
        again = cron(tmp_path)
        assert again.returncode == 0, again.stderr
        outputs.append(again.stdout)
        if records(tmp_path)[-1]["nothing_to_do"]:
            break
        time.sleep(3)
    assert records(tmp_path)[-1]["nothing_to_do"], outputs
    assert "cleared a Snakemake lock" in outputs[0]
    record = read_manifest(stage)
    assert record["state"] == "SUCCESS"
    spans = sorted((a["start"], a["end"]) for a in record["attempts"])
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), "attempts overlapped"
    assert planned(tmp_path) == {}


def test_untrustworthy_manifests_are_set_aside_and_redone(finished_run, tmp_path):
    import shutil
    work = tmp_path / "run"
    shutil.copytree(finished_run, work, symlinks=True)
    vocab = work / "results/en-xa/exp1/train_vocab"
    (vocab / "_manifest.json").write_text((vocab / "_manifest.json").read_text()[:100])  # truncated
    clean = work / "results/en-xb/exp1/clean_corpus/clean.tsv"
    data = bytearray(clean.read_bytes())
    data[10] ^= 1  # same size, other content
    clean.write_bytes(bytes(data))
    mono = work / "results/en-xa/exp1/translate_mono"
    (mono / "backtranslated.tsv").unlink()
    out = cron(work)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("set aside") == 3
    assert "does not match its checksum" in out.stdout and "unreadable manifest" in out.stdout
    for stage in (vocab, clean.parent, mono):
        assert read_manifest(stage)["state"] == "SUCCESS"
        assert (stage / ".attempts" / "1").is_dir(), f"{stage}: old files archived, not deleted"
    assert (clean.parent / ".attempts/1/clean.tsv").read_bytes() == bytes(data)
    assert records(work)[-1]["jobs"] == 3


@pytest.mark.parametrize("name", ["en;rm -rf x", "$(touch pwned)", "../escape", "/abs", "en xa", "`id`"])
def test_names_with_shell_or_path_tricks_are_refused(tmp_path, name):
    config = json.loads(json.dumps(SMALL_CONFIG))
    config["experiments"]["exp1"]["pairs"] = ["en-xa", name]
    write_config(tmp_path, config)
    out = cron(tmp_path)
    assert out.returncode == 2 and "is not a valid name" in out.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "pwned").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".waypost", "config.yaml"]


def test_yaml_error_is_one_clear_line_and_nothing_runs(tmp_path):
    (tmp_path / "config.yaml").write_text("experiments:\n  exp1: {pairs: [en-xa]\n")
    out = cron(tmp_path)
    assert out.returncode == 2 and "config.yaml:3:1: invalid YAML" in out.stderr
    assert not (tmp_path / "results").exists()


def test_disk_full_fails_cleanly_and_marks_nothing_done(tmp_path, small_disk):
    config = json.loads(json.dumps(SMALL_CONFIG))
    config["root"] = str(small_disk)
    write_config(tmp_path, config)
    proc = snakemake(tmp_path, check=False)
    assert proc.returncode != 0  # something ran out of space
    said = proc.stdout + proc.stderr
    # said by a step, or by a runner in its one line (lower case), never in a traceback through waypost
    assert "no space left on device" in said.lower()
    assert not re.search(r'File "[^"]*/waypost/(stores/)?\w+\.py", line', said), said
    done = failed = 0
    for stage_dir in (Path(d) for d in stores.store_for(str(small_disk)).manifest_dirs()):
        try:
            data = manifest.read(str(stage_dir))
        except manifest.ManifestError:
            continue  # a manifest cut short by the full disk is never trusted
        if data["state"] == "SUCCESS":
            done += 1
            assert manifest.verify_outputs(str(stage_dir), data) == [], stage_dir
        else:
            failed += 1
    assert done >= 1  # the run got somewhere before the disk filled


def _parse(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def soak_crons(workdir: Path, config: str, most: int = 8) -> int:
    """`waypost cron` over the soak workflow with this config until a run has
    nothing to do (at most ``most`` runs, each seeded apart); how many ran."""
    (workdir / "config.yaml").write_text(config)
    for runs in range(1, most + 1):
        out = cron(workdir, snakefile=SOAK / "workflow" / "Snakefile", workflow=SOAK / "workflow",
                   env={"SOAK_RUN": str(runs)})
        assert out.returncode == 0, out.stderr
        if records(workdir)[-1]["nothing_to_do"]:
            return runs
    raise AssertionError(f"did not converge in {most} runs")


@pytest.mark.soak
def test_soak_random_failures_converge_with_invariants(tmp_path):
    runs = soak_crons(tmp_path, (SOAK / "config" / "config.yaml").read_text())

    root = tmp_path / "results"
    injected: dict[str, int] = {}
    attempts = 0
    for stage_dir in root.rglob("_manifest.json"):
        if ".attempts" in stage_dir.parts:
            continue
        d = stage_dir.parent
        data = manifest.read(str(d))
        assert data["state"] == "SUCCESS", d  # converged: everything done
        assert manifest.verify_outputs(str(d), data) == [], d
        spans = []
        for a in data["attempts"]:
            attempts += 1
            if a["state"] != "SUCCESS":
                injected[a["state"]] = injected.get(a["state"], 0) + 1
            if a.get("workspace") not in (None, "."):
                assert (d / a["workspace"]).is_dir(), f"{d}: archived attempt {a['number']} lost"
            if a.get("start") and a.get("end"):
                spans.append((_parse(a["start"]), _parse(a["end"])))
        spans.sort()
        for (_, e1), (s2, _) in itertools.pairwise(spans):
            assert s2 >= e1, f"{d}: two attempts overlapped"
    stages = sum(1 for p in root.rglob("_manifest.json") if ".attempts" not in p.parts)
    assert stages == 201  # 100 work + 100 check + 1 gather
    print(f"\nsoak: {stages} stages, {attempts} attempts, injected failures by end state {injected}, "
          f"{runs} cron runs to converge, 0 invariant violations")
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    (REPO / "test-artifacts" / "soak.json").write_text(json.dumps(
        {"stages": stages, "attempts": attempts, "failures": injected, "runs": runs}, indent=1))
