"""Runs across time (issue 17): series of attempts are bounded and spaced
across runs, a new series begins as the policy says (from the checkpoints),
repeat failures behave like the first, and waypost's own markers count."""

from __future__ import annotations

import copy
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import LOCAL_PROFILE, REPO, SMALL_CONFIG, planned, read_manifest, snakemake, waypost, write_config
from test_cron import SOAK, cron, records, soak_crons

from waypost.model import events


def student_dir(work: Path, pair: str = "en-xb") -> Path:
    return work / "results" / pair / "exp1" / "train_student"


def always_timing_out(**policy) -> dict:
    """en-xb's student never finishes in time; the report funnels over it."""
    config = copy.deepcopy(SMALL_CONFIG)
    config["stages"]["report"] = {"policy": {"depends": "all_done"}}
    config["stages"]["train_student"]["policy"] = {
        "max_attempts": 2, "cues": [{"action": "restart", "when": "any(cmd.TIMEOUT, cmd.PREEMPTED)"}]}
    config["experiments"]["exp1"]["per_pair"] = {"en-xb": {"train_student": {
        "epochs": 1000, "policy": {"runtime": 0.005, "kill_grace": 1, **policy}}}}
    return config


def run_logs(work: Path) -> str:
    return "".join(p.read_text() for p in (work / ".waypost" / "runs").glob("*.log"))


def test_crons_over_a_stage_that_always_times_out_stop_at_the_cap_and_resume_from_checkpoints(tmp_path):
    write_config(tmp_path, always_timing_out(max_series=2))
    outs = [cron(tmp_path) for _ in range(3)]
    for out in outs:
        assert out.returncode == 0, out.stderr

    student = read_manifest(student_dir(tmp_path))
    # Two series of two attempts, then given up: the third cron started nothing.
    assert [(a["series"], a["action"], a["state"]) for a in student["attempts"]] == [
        (1, "cmd", "TIMEOUT"), (1, "restart", "TIMEOUT"), (2, "restart", "TIMEOUT"), (2, "restart", "TIMEOUT")]
    assert student["given_up"] is True and "given up after 2 series (max_series 2)" in student["reason"]
    # Series 2 began as the restart cue says over series 1's last attempt: in
    # place, from series 1's checkpoints (its log says so), nothing archived.
    second = student["attempts"][2]
    assert "cue 1 (restart when any(cmd.TIMEOUT, cmd.PREEMPTED)) on series 1's last attempt (TIMEOUT)" in second["why"]
    log = (student_dir(tmp_path) / second["log"]).read_text()
    assert "resuming from epoch" in log, log
    assert not (student_dir(tmp_path) / ".attempts").exists()

    # Repeat failures behave like the first: no false clock skew. Snakemake's
    # exit status says only what is true: en-xb's export could not be made
    # while its student was being tried (runs 1 and 2); once the student is
    # given up, neither is scheduled, and the run is clean.
    logs = run_logs(tmp_path)
    assert "clock skew" not in logs
    # The runner's lines name experiment/pair/stage[/instance]; cron ran the
    # Snakefile whose config it validated.
    assert "waypost: exp1/en-xb/train_student attempt 1 (cmd) ended TIMEOUT" in logs
    assert "waypost: exp1/en-xa/train_teacher/0 attempt 1 (cmd) ended SUCCESS" in logs
    command = records(tmp_path)[0]["command"]
    assert command[command.index("-s") + 1] == str(REPO / "workflow" / "Snakefile")
    failed_jobs = {e["rule"] for r in records(tmp_path) if r["events"]
                   for e in events.errors(events.read(str(tmp_path / r["events"])))}
    assert failed_jobs == {"export"}   # as Snakemake reported them (its job errors)
    assert [r["snakemake_exit"] for r in records(tmp_path)] == [1, 1, 0]
    # The funnel was redone over the latest state, and says given up.
    report = (tmp_path / "results/_all/exp1/report/report.md").read_text()
    row = next(line for line in report.splitlines() if "en-xb" in line and "student" in line)
    assert "train_student TIMEOUT (2 attempts, given up after 2 series)" in row, row
    # Cron names the stage, each run; the third run had nothing to do.
    assert "not successful this run: exp1/en-xb/evaluate/student SKIPPED, exp1/en-xb/export SKIPPED, " \
           "exp1/en-xb/train_student TIMEOUT" in outs[0].stdout
    assert "given up (1; no run starts them again until `waypost retry` or `waypost rerun`): " \
           "exp1/en-xb/train_student" in outs[1].stdout
    assert "exp1/en-xb/train_student" in outs[2].stdout
    assert records(tmp_path)[-1]["nothing_to_do"] is True
    assert records(tmp_path)[-1]["given_up"] == ["exp1/en-xb/train_student"]
    assert planned(tmp_path) == {}

    status = waypost(tmp_path, "status", "--pair", "en-xb").stdout
    assert "timeout, given up" in status
    grid = json.loads(waypost(tmp_path, "status", "--json").stdout)
    assert grid["experiments"]["exp1"]["en-xb"]["train_student"]["given_up"] is True

    # A person acts: `waypost retry` gives it a new count; the next cron
    # resumes it in place, from its checkpoints.
    out = waypost(tmp_path, "retry", "train_student", "--pair", "en-xb")
    assert "given up; gets a new count of series" in out.stdout
    assert planned(tmp_path) == {"train_student": 1, "evaluate": 1, "export": 1, "report": 1}
    assert cron(tmp_path).returncode == 0
    student = read_manifest(student_dir(tmp_path))
    third = [a for a in student["attempts"] if a["series"] == 3]
    assert [a["action"] for a in third] == ["restart", "restart"]
    assert not student.get("given_up") and student["series_base"] == 2
    assert "resuming from epoch" in (student_dir(tmp_path) / third[0]["log"]).read_text()


def test_series_backoff_spaces_series_and_retry_skips_it(tmp_path):
    write_config(tmp_path, always_timing_out(series_backoff=60))
    snakemake(tmp_path, check=False)   # en-xb's export can't be made: an error
    student = read_manifest(student_dir(tmp_path))
    assert student["state"] == "TIMEOUT" and student["next_series_after"]
    # Still in its backoff: nothing is scheduled, the funnel is not redone.
    assert planned(tmp_path) == {}
    attempts = waypost(tmp_path, "status", "--attempts", "train_student", "--pair", "en-xb").stdout
    assert "TIMEOUT" in attempts
    # A run started by hand on its job is refused with the reason, nothing changes.
    proc = snakemake(tmp_path, "--forcerun", "train_student", "--until", "train_student", check=False)
    assert "the next may start from" in proc.stderr
    assert read_manifest(student_dir(tmp_path))["attempts"] == student["attempts"]
    waypost(tmp_path, "retry", "train_student", "--pair", "en-xb")
    assert planned(tmp_path) == {"train_student": 1, "evaluate": 1, "export": 1, "report": 1}


def test_a_given_up_stage_no_funnel_accepts_is_not_scheduled_nor_what_needs_it(tmp_path):
    config = always_timing_out(max_series=1)
    del config["stages"]["report"]          # the report needs every pair: nothing tolerates the failure
    write_config(tmp_path, config)
    proc = snakemake(tmp_path, check=False)
    assert proc.returncode != 0
    student = read_manifest(student_dir(tmp_path))
    assert student["given_up"] and not (student_dir(tmp_path) / "model.json").exists()
    # Given up: no job for it, nor for what depends on it; one line says so.
    proc = snakemake(tmp_path, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert "on hold, not scheduled" in proc.stderr and "exp1/en-xb/train_student given up" in proc.stderr
    out = waypost(tmp_path, "retry", "train_student", "--pair", "en-xb")
    assert "1 stage(s) will be tried again" in out.stdout
    assert planned(tmp_path) == {"train_student": 1, "evaluate": 1, "export": 1, "report": 1}


@pytest.mark.parametrize("mode", ["presence", "mtime"])
def test_forcerun_and_forceall_redo_what_snakemake_documents(tmp_path, mode):
    config = copy.deepcopy(SMALL_CONFIG)
    config["rerun_policy"] = mode
    write_config(tmp_path, config)
    snakemake(tmp_path)
    assert planned(tmp_path) == {}
    # --forcerun RULE: the rule's jobs and everything downstream of them.
    assert planned(tmp_path, "--forcerun", "train_student") == {
        "train_student": 2, "evaluate": 2, "export": 2, "report": 1}
    assert planned(tmp_path, "--forcerun", "translate_corpus") == {
        "translate_corpus": 2, "train_student": 2, "evaluate": 2, "export": 2, "report": 1}
    # --forceall: every job.
    every = planned(tmp_path, "--forceall")
    assert every["fetch_corpus"] == 2 and every["train_teacher"] == 4 and every["report"] == 1
    # And a real --forcerun redoes exactly that: the old workspace is archived.
    snakemake(tmp_path, "--forcerun", "export")
    assert read_manifest(tmp_path / "results/en-xa/exp1/export")["attempts"][-1]["series"] == 2
    assert planned(tmp_path) == {}


PROGRESSIVE = """
import sys, time
with open(sys.argv[1], "w") as out:
    for i in range(3_000_000):
        out.write(f"{i}\\n")
        if i % 50_000 == 0:
            out.flush()
            time.sleep(0.05)
"""


def test_a_killed_progressive_writer_is_redone_even_without_snakemake_metadata(tmp_path):
    """SIGKILL of Snakemake, the runner and the step mid-output, then
    `.snakemake/` deleted: the partial output is not done; the next run
    redoes the stage, and its consumer never sees the partial file."""
    workflow = tmp_path / "wf"
    workflow.mkdir()
    (workflow / "writer.py").write_text(PROGRESSIVE)
    (workflow / "Snakefile").write_text(f"""
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow, default_configfile="config.yaml")

rule write:
    output: lines=wp.out("lines.txt")
    shell: "{sys.executable} {workflow / 'writer.py'} {{output.lines}}"

rule count:
    input: lines=wp.stage("write", "lines.txt")
    output: n=wp.out("n.txt")
    shell: "wc -l < {{input.lines}} > {{output.n}}"

wp.finish()

rule all:
    default_target: True
    input: wp.targets
""")
    write_config(tmp_path, {"root": "results", "experiments": {"e": {}}})
    snakefile = workflow / "Snakefile"
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), "-d", str(tmp_path), "--profile",
           str(REPO / "profiles" / "local"), "--configfile", str(tmp_path / "config.yaml")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    lines = tmp_path / "results/_all/e/write/lines.txt"
    deadline = time.time() + 60
    while not (lines.exists() and lines.stat().st_size > 100_000) and time.time() < deadline:
        time.sleep(0.05)
    assert lines.exists(), "the writer never started"
    os.killpg(proc.pid, signal.SIGKILL)   # Snakemake, the runner and the step at once
    proc.wait()
    time.sleep(0.3)
    partial = len(lines.read_text().splitlines())
    assert 0 < partial < 3_000_000
    assert (lines.parent / "_running.json").exists() and not (lines.parent / "_manifest.json").exists()
    import shutil
    shutil.rmtree(tmp_path / ".snakemake")   # the common reset habit, or another machine

    dry = subprocess.run(cmd + ["-n"], cwd=tmp_path, capture_output=True, text=True)
    assert "rule write:" in dry.stdout and "Forced execution" in dry.stdout, dry.stdout
    done = cron(tmp_path, snakefile=snakefile, workflow=workflow)
    assert done.returncode == 0 and records(tmp_path)[-1]["snakemake_exit"] == 0, done.stdout + done.stderr
    assert "set aside the partial outputs of interrupted" in done.stdout
    assert len(lines.read_text().splitlines()) == 3_000_000
    assert (tmp_path / "results/_all/e/count/n.txt").read_text().strip() == "3000000"
    data = read_manifest(lines.parent)
    assert data["state"] == "SUCCESS"
    assert [a["state"] for a in data["attempts"]] == ["CANCELLED", "SUCCESS"]
    # The partial output was set aside, not deleted.
    archived = lines.parent / ".attempts/1/lines.txt"
    assert archived.exists() and len(archived.read_text().splitlines()) >= partial


def _parse(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


@pytest.mark.soak
def test_soak_with_stages_that_always_fail_gives_them_up_and_the_rest_converges(tmp_path):
    """About 10% of the instances fail on every attempt of every run; the
    others fail at random now and then. After enough crons the first are
    given up with a bounded attempt count, the rest converge."""
    config = (SOAK / "config" / "config.yaml").read_text()
    config = config.replace("instances: 100", "instances: 40").replace(
        "failure_rate: 0.2", "failure_rate: 0.1\n    permanent_failure_rate: 0.1")
    config = config.replace("  max_attempts: 3", "  max_attempts: 2\n  max_series: 2")
    runs = soak_crons(tmp_path, config)
    assert "clock skew" not in run_logs(tmp_path)

    root = tmp_path / "results"
    given_up, skipped, converged, attempts, violations = [], [], 0, 0, []
    for path in root.rglob("_manifest.json"):
        if ".attempts" in path.parts:
            continue
        d = path.parent
        data = json.loads(path.read_text())
        attempts += len(data["attempts"])
        spans = sorted((_parse(a["start"]), _parse(a["end"])) for a in data["attempts"] if a.get("end"))
        if any(s2 < e1 for (_, e1), (s2, _) in itertools.pairwise(spans)):
            violations.append(f"{d}: attempts overlapped")
        for a in data["attempts"]:
            if a.get("workspace") not in (None, ".") and not (d / a["workspace"]).is_dir():
                violations.append(f"{d}: archived attempt {a['number']} lost")
        if data["state"] == "SUCCESS":
            converged += 1
            if manifest_problems(d, data):
                violations.append(f"{d}: outputs differ from the manifest")
        elif data.get("given_up"):
            given_up.append(d.name)
            if len(data["attempts"]) > 2 * 2:   # max_series × max_attempts
                violations.append(f"{d}: {len(data['attempts'])} attempts past the cap")
        elif data["state"] == "SKIPPED":
            skipped.append(d.name)
            if not all(json.loads((tmp_path / i["manifest"]).read_text()).get("given_up")
                       for i in data["inputs"] if i["state"] not in ("SUCCESS", "ADOPTED")):
                violations.append(f"{d}: skipped over a parent that was not given up")
        else:
            violations.append(f"{d}: {data['state']} and neither given up nor skipped")
    assert violations == []
    permanent = {"i001", "i010", "i020", "i023", "i034"}   # flaky_step.py's --permanent-rate 0.1 of 40
    assert set(given_up) == permanent and set(skipped) == permanent
    assert converged == 2 * 40 + 1 - 2 * len(permanent)
    gather = json.loads((root / "_all/soak/gather/_manifest.json").read_text())
    assert gather["state"] == "SUCCESS" and gather["provisional"] is True
    print(f"\nsoak with permanent failures: {converged} stages done, {len(given_up)} given up "
          f"(attempts each: {2 * 2} at most), {len(skipped)} skipped over them, {attempts} attempts, "
          f"{runs} cron runs, 0 invariant violations")
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    (REPO / "test-artifacts" / "soak-permanent.json").write_text(json.dumps(
        {"done": converged, "given_up": len(given_up), "skipped": len(skipped), "attempts": attempts,
         "runs": runs}, indent=1))


def manifest_problems(directory: Path, data: dict) -> list:
    from waypost.model import manifest
    return manifest.verify_outputs(str(directory), data)


def test_liveness_unknown_is_never_gone(tmp_path):
    """An attempt on another host without a Slurm job can't be asked: while
    its heartbeat is younger than the lease it may be at work, and rerun,
    retry and cron leave it alone and say so; once the heartbeat is older
    than the lease it counts as gone from anywhere."""
    write_config(tmp_path, SMALL_CONFIG)
    snakemake(tmp_path, "--until", "fetch_corpus")
    stage = tmp_path / "results/en-xa/exp1/fetch_corpus"
    marker = stage / "_running.json"
    marker.write_text(json.dumps({"pid": 4242, "host": "node-elsewhere", "run": "r", "series": 2,
                                  "slurm_job_id": None, "attempts": [], "outputs": ["corpus.tsv"]}))
    proc = waypost(tmp_path, "rerun", "fetch_corpus", "--pair", "en-xa", check=False)
    assert proc.returncode == 1 and "unknown: pid 4242 on node-elsewhere" in proc.stderr, proc.stderr
    assert "nothing was changed" in proc.stderr and not (stage / ".attempts").exists()
    out = cron(tmp_path, "--until", "fetch_corpus")
    assert f"left {stage.relative_to(tmp_path)} alone: an attempt may still be at work there (unknown" in out.stdout \
        or "alone: an attempt may still be at work there (unknown" in out.stdout, out.stdout
    assert marker.exists() and not (stage / ".attempts").exists()

    old = time.time() - 3600                       # an hour without a heartbeat: past the 10-minute lease
    os.utime(marker, (old, old))
    done = waypost(tmp_path, "rerun", "fetch_corpus", "--pair", "en-xa")
    assert "archived in .attempts/1" in done.stdout


def test_config_precedence_is_the_same_with_and_without_configfile(tmp_path):
    """The config file, then the reuse/ files beside it, then --config: the
    same order whether Snakemake was given --configfile or not."""
    (tmp_path / "config" / "reuse").mkdir(parents=True)
    config = copy.deepcopy(SMALL_CONFIG)
    write_config(tmp_path / "config", config)
    (tmp_path / "config" / "reuse" / "exp1.yaml").write_text("root: from-reuse\n")
    base = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "-d", str(tmp_path),
            "--profile", str(REPO / "profiles" / "local"), "-n", "--until", "fetch_corpus"]
    for extra in ([], ["--configfile", str(tmp_path / "config" / "config.yaml")]):
        reused = subprocess.run(base + extra, cwd=tmp_path, capture_output=True, text=True)
        assert "from-reuse/en-xa/exp1/fetch_corpus" in reused.stdout, reused.stdout + reused.stderr
        given = subprocess.run(base + extra + ["--config", "root=from-cli"], cwd=tmp_path, capture_output=True,
                               text=True)
        assert "from-cli/en-xa/exp1/fetch_corpus" in given.stdout, (extra, given.stdout + given.stderr)


def tiny_pipeline(workdir: Path, snakefile: str, config: dict | None = None):
    """A workflow of the test's own in ``workdir`` (its config, when given,
    in config/config.yaml); returns a function running Snakemake there with
    the local profile and more arguments."""
    (workdir / "workflow").mkdir(exist_ok=True)
    (workdir / "workflow" / "Snakefile").write_text(snakefile)
    (workdir / "config").mkdir(exist_ok=True)
    if config is not None:
        write_config(workdir, config, name="config/config.yaml")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile", "--profile",
                               str(LOCAL_PROFILE), *args], cwd=workdir, capture_output=True, text=True, timeout=300)
    return run


GIVEN_UP_STUDY = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


def points(experiment):
    return ["k1", "k2", "k3"]


rule solve:
    output: out=wp.out("x.txt", instances=points)
    shell: "test {wildcards.instance} != k2; echo {wildcards.instance} > {output.out}"


rule collect:
    input: xs=wp.each("solve", "x.txt")
    output: out=wp.out("all.txt", funnel=True)
    shell: "cat {input.xs} > {output.out}; echo run $WAYPOST_RUN_ID >> {output.out}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def test_a_given_up_point_counts_as_its_last_end_for_a_funnel_that_accepts_it(tmp_path):
    # k2 fails for good (max_series 1): given up. The funnel accepts any end
    # (all_done), so it is not held by k2: after `rerun --downstream` of
    # another point, the next run redoes that point and the funnel.
    run = tiny_pipeline(tmp_path, GIVEN_UP_STUDY, {"root": "results", "experiments": {"e": {}}, "stages": {
        "solve": {"policy": {"max_attempts": 1, "max_series": 1}},
        "collect": {"policy": {"depends": "all_done"}}}})
    first = run()
    stage = tmp_path / "results" / "_all" / "e"
    assert read_manifest(stage / "solve" / "k2")["given_up"], first.stderr[-3000:]
    made = (stage / "collect" / "all.txt").read_text()
    assert made.startswith("k1\nk3\nrun "), made        # k2: an empty placeholder

    again = run("-n")
    assert "Nothing to be done" in again.stdout + again.stderr      # given up: not tried again
    out = subprocess.run([sys.executable, "-m", "waypost.cli", "rerun", "solve", "--instance", "k1", "--downstream"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    planned_run = run("-n", *reported(tmp_path))
    text = planned_run.stdout + planned_run.stderr
    assert "on hold, not scheduled" not in text, text[-2000:]
    assert _job_stats(tmp_path / "events.jsonl") == {"solve": 1, "collect": 1}, text[-2000:]
    second = run()
    assert second.returncode == 0, second.stderr[-3000:]
    remade = (stage / "collect" / "all.txt").read_text()
    assert remade.startswith("k1\nk3\nrun ") and remade != made
    assert read_manifest(stage / "solve" / "k2")["attempts"] == read_manifest(stage / "solve" / "k2")["attempts"][:1]


def _job_stats(path: Path) -> dict[str, int]:
    """Jobs per rule (not ``all``) of the run that reported its events to
    ``path`` (then removed: the next run reports afresh)."""
    found = events.counts(events.read(str(path)))
    path.unlink(missing_ok=True)
    return found


def reported(work: Path) -> tuple[str, ...]:
    """The options that have a run report its events to ``work/events.jsonl``."""
    return tuple(events.snakemake_args(str(work / "events.jsonl")))


ENSEMBLE = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


def members(experiment):
    return [str(m) for m in config["experiments"][experiment]["members"]]


rule member:
    output: m=wp.out("m.txt", instances=members)
    shell: "echo member {wildcards.instance} > {output.m}"


rule ensemble:
    input: ms=wp.each("member", "m.txt")
    output: e=wp.out("ensemble.txt")
    shell: "cat {input.ms} > {output.e}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


@pytest.mark.parametrize("mode", ["presence", "mtime"])
def test_a_stage_made_from_a_set_of_instances_is_redone_when_the_set_changes(tmp_path, mode):
    snakemake_run = tiny_pipeline(tmp_path, ENSEMBLE)
    (tmp_path / "workflow" / "schemas").mkdir()
    (tmp_path / "workflow" / "schemas" / "config.schema.yaml").write_text(yaml.safe_dump({"properties": {
        "experiments": {"additionalProperties": {"properties": {"members": {"type": "array"}}}}}}))

    def with_members(*names):
        write_config(tmp_path, {"root": "results", "rerun_policy": mode, "experiments": {"x": {"members": list(names)}}},
                     name="config/config.yaml")
    def run(*args):
        proc = snakemake_run(*args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout + proc.stderr
    ensemble = tmp_path / "results" / "_all" / "x" / "ensemble" / "ensemble.txt"
    with_members("a", "b")
    run()
    assert ensemble.read_text() == "member a\nmember b\n"
    assert "Nothing to be done" in run("-n")                         # the same set: nothing to redo

    with_members("a", "b", "c", "d")                                 # grown
    planned_text = run("-n", *reported(tmp_path))
    assert "x/ensemble: made from 2 inputs, now 4 (2 new, 0 gone): redone" in planned_text
    assert _job_stats(tmp_path / "events.jsonl") == {"member": 2, "ensemble": 1}, planned_text[-2000:]
    plan = subprocess.run([sys.executable, "-m", "waypost.cli", "plan", "--profile", str(LOCAL_PROFILE), "--json"],
                          cwd=tmp_path, capture_output=True, text=True)
    rows = {r["stage"]: r["why"] for r in json.loads(plan.stdout)["next_run"]}
    assert rows["ensemble"] == "redo: made from 2 inputs, now 4 (2 new, 0 gone)", plan.stdout
    run()
    assert ensemble.read_text() == "member a\nmember b\nmember c\nmember d\n"

    with_members("a", "c", "d")                                      # shrunk: nothing new to make
    planned_text = run("-n", *reported(tmp_path))
    assert "x/ensemble: made from 4 inputs, now 3 (0 new, 1 gone): redone" in planned_text
    assert _job_stats(tmp_path / "events.jsonl") == {"ensemble": 1}, planned_text[-2000:]
    run()
    assert ensemble.read_text() == "member a\nmember c\nmember d\n"
    assert "Nothing to be done" in run("-n")


HOPELESS = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


rule solve:
    output: out=wp.out("x.txt", instances=["k1", "k2"])
    shell: "if [ {wildcards.instance} = k2 ]; then echo diverged > $WAYPOST_STAGE_DIR/residual; exit 1; fi; echo ok > {output.out}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def test_a_check_can_give_a_stage_up_for_good(tmp_path):
    # A check sees the point is hopeless; its cue gives it up at once: no
    # further series in later runs (max_series would allow 5) until
    # `waypost retry`, which says what the next run will do.
    policy = {"max_attempts": 3, "max_series": 5,
              "checks": {"converging": "! grep -q diverged $WAYPOST_STAGE_DIR/residual 2>/dev/null"},
              "cues": [{"action": "give_up", "when": "converging.FAILED"}, {"action": "rerun", "when": "cmd.FAILED"}]}
    run = tiny_pipeline(tmp_path, HOPELESS, {"root": "results", "experiments": {"e": {}},
                                            "stages": {"solve": {"policy": policy}}})
    first = run()
    assert first.returncode != 0
    hopeless = read_manifest(tmp_path / "results/_all/e/solve/k2")
    assert hopeless["given_up"] and len(hopeless["attempts"]) == 1, hopeless
    assert hopeless["attempts"][0]["decision"]["action"] == "give_up"
    assert "given up by cue 1 (give_up when converging.FAILED)" in hopeless["reason"]
    again = run("-n")
    assert "Nothing to be done" in again.stdout + again.stderr and "e/solve/k2 given up" in again.stderr
    out = subprocess.run([sys.executable, "-m", "waypost.cli", "retry", "solve", "--instance", "k2"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "the next run: a fresh start (its workspace archived under .attempts/ first)" in out.stdout, out.stdout
    run("-n", *reported(tmp_path))
    assert _job_stats(tmp_path / "events.jsonl").get("solve") == 1


def test_a_restart_that_goes_on_with_work_made_under_other_settings_says_so(tmp_path):
    """epochs changed while a student's series was unfinished: plan says the
    next series restarts in place on work made with the old value, the
    restart records and logs it, and `status --attempts` shows it."""
    config = always_timing_out(max_series=3)
    write_config(tmp_path, config)
    snakemake(tmp_path, check=False)
    assert [a["action"] for a in read_manifest(student_dir(tmp_path))["attempts"]] == ["cmd", "restart"]

    config["experiments"]["exp1"]["per_pair"]["en-xb"]["train_student"]["epochs"] = 900
    write_config(tmp_path, config)
    found = json.loads(waypost(tmp_path, "plan", "--json").stdout)
    [row] = [r for r in found["drift"] if r.get("unfinished")]
    assert (row["pair"], row["stage"]) == ("en-xb", "train_student")
    assert "going on with attempt 2's work, made under other settings: epochs: 1000 → 900" in row["what"][0]
    shown = waypost(tmp_path, "plan").stdout
    assert "not done, and the next series goes on with work made under other settings" in shown

    run = snakemake(tmp_path, check=False)
    assert "this restart goes on with attempt 2's work, made under other settings: epochs: 1000 → 900" in run.stderr
    attempts = read_manifest(student_dir(tmp_path))["attempts"]
    assert attempts[2]["action"] == "restart" and attempts[2]["series"] == 2
    assert attempts[2]["resumes"] == {"attempt": 2, "settings": ["epochs: 1000 → 900"]}
    assert attempts[2]["settings"]["epochs"] == 900 and attempts[1]["settings"]["epochs"] == 1000
    assert "resumes" not in attempts[3]   # the series' own work, under the same settings
    listed = waypost(tmp_path, "status", "--attempts", "train_student", "--pair", "en-xb").stdout
    assert "#3 went on with attempt 2's work, made under other settings: epochs: 1000 → 900" in listed
