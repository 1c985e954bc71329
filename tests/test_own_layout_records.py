"""A job and its record for rules in their own layout: a plain ``shell:``
rule's job (its rule and wildcards) runs through waypost's step runner, and
keeps its record (manifest, logs, attempts, archives) in a directory of its
own under the root, while its outputs stay where the rule puts them. The
control policy, status and Snakemake's own decisions apply to it; the files
are plain Snakemake's, side by side."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from waypost.model.layout import is_valid_name, job_instance

MARK = "# waypost"

SNAKEFILE = textwrap.dedent("""\
    configfile: "config.yaml"
    from waypost.snakemake import Pipeline  # waypost
    wp = Pipeline(config, workflow)  # waypost

    SAMPLES = config["samples"]

    rule everything:
        input: expand("data/{sample}/summary.txt", sample=SAMPLES), "data/merged.tsv", "data/slow/weights.txt"

    rule prepare:
        output: "data/{sample,[a-z]+}/raw.csv"
        shell: "echo {wildcards.sample},1 > {output}"

    rule fit:
        input: "data/{sample}/raw.csv"
        output: "data/{sample}/fit/params.json"
        shell: "bash fit.sh {wildcards.sample} {input} {output}"

    rule count:
        input: "data/{sample}/raw.csv"
        output: temp("data/{sample}/count.txt")
        shell: "wc -l < {input} > {output}"

    rule summarize:
        input: rules.fit.output, rules.count.output
        output: "data/{sample}/summary.txt"
        params: fitted_in=lambda wildcards, input: input[0].rsplit("/", 1)[0]
        shell: "wc -c < {input[0]} > {output}; cat {input[1]} >> {output}"

    rule merge:
        input: expand("data/{sample}/summary.txt", sample=SAMPLES)
        output: "data/merged.tsv"
        shell: "cat {input} > {output}"

    rule slow:
        output: "data/slow/weights.txt"
        shell: "bash slow.sh {output}"

    wp.finish()  # waypost
    """)

# Sample "b" fails its first try (exit 3) after writing half its output
# (plain Snakemake retries it with --retries; waypost's policy reruns it).
FIT = textwrap.dedent("""\
    mkdir -p "$(dirname "$3")"
    echo "fitting $1" > "$(dirname "$3")/fit.log"   # a side file, in a directory only this job writes
    if [ "$1" = b ] && [ ! -e failed-once ]; then touch failed-once; echo partial > "$3"; exit 3; fi
    echo "{\\"sample\\": \\"$1\\", \\"rows\\": $(wc -l < "$2")}" > "$3"
    """)

# Three steps of 0.3 s each, a checkpoint beside the output after each: with
# a runtime under the whole (0.01 min, 0.6 s), only restarts that resume from it finish.
SLOW = textwrap.dedent("""\
    mkdir -p "$(dirname "$1")"
    ckpt="$(dirname "$1")/checkpoint"
    n=$(cat "$ckpt" 2>/dev/null || echo 0)
    if [ "$n" -gt 0 ]; then echo "resuming from step $n"; fi
    while [ "$n" -lt 3 ]; do sleep 0.3; n=$((n + 1)); echo $n > "$ckpt"; done
    echo "trained in 3 steps" > "$1"
    """)

CONFIG = {
    "samples": ["a", "b"],
    "root": "records",  # waypost
    "experiments": {"trial": {}},  # waypost
    "stages": {  # waypost
        "fit": {"policy": {"max_attempts": 3, "cues": [{"action": "rerun", "rerun": "new", "when": "cmd.exit == 3"}]}},
        "slow": {"policy": {"runtime": 0.01, "kill_grace": 1, "max_attempts": 12,
                            "cues": [{"action": "restart", "when": "cmd.TIMEOUT"}]}},
    },
}


def _write(workdir: Path, with_waypost: bool) -> Path:
    workdir.mkdir(parents=True)
    keep = (lambda line: True) if with_waypost else (lambda line: not line.rstrip().endswith(MARK))
    (workdir / "Snakefile").write_text("".join(line for line in SNAKEFILE.splitlines(keepends=True) if keep(line)))
    text = yaml.safe_dump(CONFIG, sort_keys=False)
    if not with_waypost:
        text = yaml.safe_dump({"samples": CONFIG["samples"]})
    (workdir / "config.yaml").write_text(text)
    (workdir / "fit.sh").write_text(FIT)
    (workdir / "slow.sh").write_text(SLOW)
    return workdir


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=workdir,
                          capture_output=True, text=True, timeout=300)


def _waypost(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waypost.cli", *args], cwd=workdir, capture_output=True,
                          text=True, timeout=300)


def _files(workdir: Path) -> dict[str, str]:
    return {str(p.relative_to(workdir)): p.read_text() for p in sorted((workdir / "data").rglob("*"))
            if p.is_file() and p.name != "checkpoint"}


def _jobs(dry_run: subprocess.CompletedProcess) -> dict[str, int]:
    """rule → jobs, from a dry run's job stats."""
    assert dry_run.returncode == 0, dry_run.stderr[-3000:]
    if "Nothing to be done" in dry_run.stdout + dry_run.stderr:
        return {}
    table = (dry_run.stdout + dry_run.stderr).split("Job stats:", 1)[1]
    return {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)$", table, re.M) if rule != "total"}


def _record(workdir: Path, rule: str, job: str | None = None) -> Path:
    path = workdir / "records" / "_all" / "trial" / rule
    return path / job if job else path


def _manifest(workdir: Path, rule: str, job: str | None = None) -> dict:
    return json.loads((_record(workdir, rule, job) / "_manifest.json").read_text())


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("ownrec")
    plain, wp = _write(base / "plain", False), _write(base / "wp", True)
    for workdir in (plain, wp):
        done = _snakemake(workdir) if workdir == wp else _snakemake(workdir, "--retries", "1")
        assert done.returncode == 0, done.stderr[-4000:]
    return plain, wp


def test_each_job_keeps_a_record_named_by_its_rule_and_wildcards(ran):
    plain, wp = ran
    assert _files(wp) == _files(plain)
    for sample in ("a", "b"):
        for rule in ("prepare", "fit", "summarize"):
            data = _manifest(wp, rule, sample)
            assert data["state"] == "SUCCESS", (rule, sample, data)
            assert data["wildcards"] == {"sample": sample}
            assert data["stage"] == rule and data["instance"] == sample
            # The outputs are named where they are, from the record.
            base = (_record(wp, rule, sample) / data["outputs_dir"]).resolve()
            for out in data["outputs"]:
                assert (base / out["path"]).is_file(), out
    # fit's directory is its job's alone: the file it left beside its output is its own
    assert {o["path"]: o.get("side", False) for o in _manifest(wp, "fit", "a")["outputs"]} == \
        {"params.json": False, "fit.log": True}
    # summarize's is shared (prepare and count write there too): nothing else is taken
    assert [o["path"] for o in _manifest(wp, "summarize", "a")["outputs"]] == ["summary.txt"]
    merged = _manifest(wp, "merge")   # a rule without wildcards: one job, one record
    assert merged["instance"] is None and merged["wildcards"] == {}
    assert [o["path"] for o in merged["outputs"]] == ["merged.tsv"]
    assert (_record(wp, "fit", "a") / "_logs" / "attempt-1.log").is_file()


def test_the_policy_steers_a_rule_in_its_own_layout(ran):
    _, wp = ran
    fit = _manifest(wp, "fit", "b")
    assert [(a["state"], a["exit_code"]) for a in fit["attempts"]] == [("FAILED", 3), ("SUCCESS", 0)]
    assert fit["attempts"][0]["decision"]["action"] == "rerun"
    # rerun: new archived what the failed attempt left, at its path from the outputs' directory
    archived = _record(wp, "fit", "b") / fit["attempts"][0]["workspace"]
    assert (archived / "params.json").read_text() == "partial\n"
    assert (archived / "fit.log").read_text() == "fitting b\n"   # its side file went with it
    assert json.loads((wp / "data/b/fit/params.json").read_text()) == {"sample": "b", "rows": 1}
    # a timeout restarts in place: the checkpoint beside the output is kept
    slow = _manifest(wp, "slow")
    states = [a["state"] for a in slow["attempts"]]
    assert states[-1] == "SUCCESS" and set(states[:-1]) == {"TIMEOUT"} and len(states) >= 2, states
    assert all(a["action"] == "restart" for a in slow["attempts"][1:])
    last_log = (_record(wp, "slow") / slow["attempts"][-1]["log"]).read_text()
    assert "resuming from step" in last_log


def test_status_shows_the_rules_jobs(ran):
    _, wp = ran
    shown = _waypost(wp, "status", "--config", "config.yaml", "--json")
    assert shown.returncode == 0, shown.stderr
    cells = json.loads(shown.stdout)["experiments"]["trial"]["_all"]
    assert cells["fit"]["state"] == "SUCCESS" and set(cells["fit"]["instances"]) == {"a", "b"}
    assert cells["merge"]["state"] == "SUCCESS"
    assert cells["fit"]["instances"]["b"]["attempts"] == 2
    # a temp() output Snakemake removed once summarize read it: done, not missing
    assert cells["count"]["state"] == "SUCCESS", cells["count"]
    assert not (wp / "data/a/count.txt").exists()
    assert _manifest(wp, "count", "a")["outputs"][0]["temp"] is True


def test_find_names_jobs_by_rule_and_wildcards_and_their_lineage_by_the_records_that_made_their_inputs(ran, tmp_path):
    _, wp = ran
    # an input made by another recorded job of the run is described with that job's record
    inputs = _manifest(wp, "summarize", "a")["inputs"]
    assert [(i["path"], i["manifest"], i["state"]) for i in inputs] == [
        ("data/a/fit/params.json", "records/_all/trial/fit/a/_manifest.json", "SUCCESS"),
        ("data/a/count.txt", "records/_all/trial/count/a/_manifest.json", "SUCCESS")]
    assert inputs[0]["sha256"] == next(o["sha256"] for o in _manifest(wp, "fit", "a")["outputs"]
                                       if o["path"] == "params.json")

    db = str(tmp_path / "catalog.sqlite")
    table = _waypost(wp, "find", "--config", "config.yaml", "--db", db, "--stage", "fit", "--width", "250")
    assert table.returncode == 0, table.stderr
    header, *rows = [line.split() for line in table.stdout.splitlines()[2:] if line.strip() and "─" not in line]
    assert header[:4] == ["experiment", "stage", "state", "created"], table.stdout   # no pair column of _all
    assert sorted(row[1] for row in rows) == ["fit[sample=a]", "fit[sample=b]"], table.stdout
    one = _waypost(wp, "find", "--config", "config.yaml", "--db", db, "--stage", "fit[sample=b]", "--json")
    assert one.returncode == 0, one.stderr
    assert [(r["stage"], r["wildcards"]) for r in json.loads(one.stdout)] == [("fit", {"sample": "b"})]

    lineage = _waypost(wp, "find", "--config", "config.yaml", "--db", db, "--lineage", "records/_all/trial/summarize/a")
    assert lineage.returncode == 0, lineage.stderr
    named = [line.split(":")[0] for line in lineage.stdout.splitlines()]
    assert named == ["trial/summarize[sample=a]", "  trial/fit[sample=a]", "    trial/prepare[sample=a]",
                     "  trial/count[sample=a]", "    trial/prepare[sample=a]"], lineage.stdout
    assert "placed by hand" not in lineage.stdout


def test_a_deleted_output_is_redone_as_plain_snakemake_redoes_it_in_a_new_series(ran, tmp_path):
    plain, wp = ran
    for workdir in (plain, wp):
        copy = shutil.copytree(workdir, tmp_path / workdir.name, symlinks=True)
        (copy / "data/a/summary.txt").unlink()
    dry = {name: _snakemake(tmp_path / name, "-n") for name in ("plain", "wp")}
    jobs = {name: _jobs(d) for name, d in dry.items()}
    assert jobs["wp"] == jobs["plain"] == {"count": 1, "summarize": 1, "merge": 1, "everything": 1}, dry["wp"].stdout
    again = _snakemake(tmp_path / "wp")
    assert again.returncode == 0, again.stderr[-3000:]
    redone = _manifest(tmp_path / "wp", "summarize", "a")
    assert redone["state"] == "SUCCESS" and [a["series"] for a in redone["attempts"]] == [1, 2]
    assert _manifest(tmp_path / "wp", "summarize", "b")["attempts"][-1]["series"] == 1   # not redone
    assert _files(tmp_path / "wp") == _files(plain)


def test_verify_reads_each_jobs_outputs_where_its_rule_put_them_and_repair_sets_them_aside(ran, tmp_path):
    _, wp = ran
    copy = shutil.copytree(wp, tmp_path / "wp", symlinks=True)
    checked = _waypost(copy, "verify", "--config", "config.yaml")
    assert checked.returncode == 0 and "not to be trusted" not in checked.stdout + checked.stderr, checked.stdout
    (copy / "data/b/fit/params.json").write_text((copy / "data/b/fit/params.json").read_text().upper())
    checked = _waypost(copy, "verify", "--config", "config.yaml", "--repair")
    said = checked.stdout + checked.stderr
    assert "records/_all/trial/fit/b: params.json does not match its checksum" in said, said
    archive = _record(copy, "fit", "b") / ".attempts"
    archived = sorted(p.name for p in archive.rglob("*") if p.is_file())
    assert "params.json" in archived and "fit.log" in archived and "_manifest.json" in archived, archived
    assert not (copy / "data/b/fit/params.json").exists()


def test_presence_mode_when_the_config_asks_for_it_present_outputs_are_done(ran, tmp_path):
    plain, wp = ran
    copies = {name: shutil.copytree(workdir, tmp_path / name, symlinks=True) for name, workdir in
              (("plain", plain), ("wp", wp), ("presence", wp))}
    config = yaml.safe_load((copies["presence"] / "config.yaml").read_text())
    (copies["presence"] / "config.yaml").write_text(yaml.safe_dump({**config, "rerun_policy": "presence"}))
    for copy in copies.values():   # a changed input, and a deleted intermediate a done job read
        (copy / "data/a/raw.csv").write_text("a,1\na,2\n")
        (copy / "data/b/fit/params.json").unlink()
    jobs = {name: _jobs(_snakemake(copy, "-n")) for name, copy in copies.items()}
    # without rerun_policy in the config: plain Snakemake's answer; with it, present outputs are done
    # (summarize's params function reads its input: it still sees it, though the job got none)
    assert jobs["wp"] == jobs["plain"] == {"fit": 1, "count": 1, "summarize": 1, "merge": 1, "everything": 1}
    assert jobs["presence"] == {}, jobs
    # the intermediate no done job needs (as in plain Snakemake) is redone when asked for, alone
    assert _jobs(_snakemake(copies["presence"], "-n", "data/b/fit/params.json")) == {"fit": 1}
    # --forcerun: Snakemake's answer, as without presence mode
    forced = {name: _jobs(_snakemake(copies[name], "-n", "--forcerun", "count")) for name in ("plain", "presence")}
    assert forced["presence"] == forced["plain"], forced
    # a hand-made output is adopted: its job, and what only it needed, don't run
    presence = copies["presence"]
    (presence / "data/c/fit").mkdir(parents=True)
    (presence / "data/c/fit/params.json").write_text('{"sample": "c", "rows": 7}\n')
    more = _snakemake(presence, "--config", "samples=[a,b,c]")
    assert more.returncode == 0, more.stderr[-3000:]
    assert (presence / "data/c/fit/params.json").read_text() == '{"sample": "c", "rows": 7}\n'
    assert not _record(presence, "fit", "c").exists()
    assert _manifest(presence, "summarize", "c")["state"] == "SUCCESS"
    assert [a["series"] for a in _manifest(presence, "summarize", "a")["attempts"]] == [1]   # not redone


def test_rerun_archives_a_jobs_outputs_with_its_record_and_the_next_run_redoes_them_as_snakemake_would(ran, tmp_path):
    plain, wp = ran
    plain, wp = (shutil.copytree(workdir, tmp_path / workdir.name, symlinks=True) for workdir in (plain, wp))
    rerun = _waypost(wp, "rerun", "fit", "--config", "config.yaml", "--instance", "b", "--downstream")
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.splitlines()[:3] == ["records/_all/trial/fit/b: archived in .attempts/2",
                                             "records/_all/trial/summarize/b: archived in .attempts/1",
                                             "records/_all/trial/merge: archived in .attempts/1"], rerun.stdout
    assert "3 stage(s) archived" in rerun.stdout and "3 of them are jobs of rules in their own layout" in rerun.stdout
    # the outputs (the side file too) went into the record's archive, at their paths from the outputs' directory
    archive = _record(wp, "fit", "b") / ".attempts" / "2"
    assert sorted(p.name for p in archive.iterdir()) == ["_logs", "_manifest.json", "fit.log", "params.json"]
    assert not (wp / "data/b/fit/params.json").exists() and not (wp / "data/b/fit/fit.log").exists()
    for gone in ("data/b/fit/params.json", "data/b/fit/fit.log", "data/b/summary.txt", "data/merged.tsv"):
        (plain / gone).unlink()   # the same files, deleted by hand, beside plain Snakemake
    jobs = {name: _jobs(_snakemake(workdir, "-n")) for name, workdir in (("plain", plain), ("wp", wp))}
    assert jobs["wp"] == jobs["plain"] == {"fit": 1, "count": 1, "summarize": 1, "merge": 1, "everything": 1}
    again = _snakemake(wp)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _manifest(wp, "fit", "b")["state"] == "SUCCESS" and (wp / "data/b/fit/fit.log").is_file()
    # adopt names such a job by its wildcards, not a stage's instance
    adopt = _waypost(wp, "adopt", "fit", "--config", "config.yaml", "--experiment", "trial", "--instance", "a")
    assert adopt.returncode == 2 and adopt.stdout == ""
    assert adopt.stderr == ("waypost: adopt fit: a rule in its own layout: name its job by --wildcards NAME=VALUE "
                            "..., not --instance or a pair; nothing was changed\n")


@given(st.lists(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=3), min_size=2, max_size=6,
                unique_by=tuple))
def test_a_jobs_record_name_is_a_valid_name_and_its_own(value_sets):
    names = [job_instance({f"w{i}": v for i, v in enumerate(values)}) for values in value_sets]
    assert all(is_valid_name(name) for name in names), names
    same_length = {}
    for values, name in zip(value_sets, names):
        same_length.setdefault(len(values), {})[tuple(values)] = name
    for by_values in same_length.values():   # (a rule's jobs all have as many wildcards)
        assert len(set(by_values.values())) == len(by_values), by_values


EDGES = textwrap.dedent("""\
    from waypost.snakemake import Pipeline  # waypost
    wp = Pipeline(config, workflow)  # waypost

    rule all_done:
        input: "edge/ran.txt", "edge/_private.txt", "edge/shadowed.txt", "edge/which.txt"

    rule ran:
        output: "edge/ran.txt"
        run:
            with open(output[0], "w") as f:
                f.write("run block\\\\n")

    rule _private:
        output: "edge/_private.txt"
        shell: "echo private > {output}"

    rule shadowed:
        output: "edge/shadowed.txt"
        shadow: "minimal"
        shell: "echo shadowed > {output}"

    rule which:
        output: "edge/which.txt"
        shell: "command -v python > {output} || echo none > {output}"

    wp.finish()  # waypost
    """)


def test_rules_waypost_cant_record_run_as_plain_snakemake_runs_them_and_it_says_which(tmp_path):
    runs = {}
    for name, with_waypost in (("plain", False), ("wp", True)):
        workdir = tmp_path / name
        workdir.mkdir()
        keep = (lambda line: True) if with_waypost else (lambda line: not line.rstrip().endswith(MARK))
        (workdir / "Snakefile").write_text("".join(line for line in EDGES.splitlines(keepends=True) if keep(line)))
        (workdir / "config.yaml").write_text(yaml.safe_dump({"root": "records", "experiments": {"trial": {}}})
                                             if with_waypost else "{}\n")
        runs[name] = _snakemake(workdir, "--configfile", "config.yaml")
        assert runs[name].returncode == 0, runs[name].stderr[-3000:]
    files = {name: {p.name: p.read_text() for p in (tmp_path / name / "edge").iterdir()} for name in runs}
    assert files["wp"] == files["plain"]   # `python` too: the PATH plain Snakemake gives a job
    said = [line for line in runs["wp"].stderr.splitlines() if "with no waypost record" in line]
    assert said == ["waypost: run as plain Snakemake runs them, with no waypost record: "
                    "_private (its name is no directory name (letters, digits, '.', '_' or '-', starting with "
                    "a letter or digit)), shadowed (shadow:)"], said
    recorded = sorted(p.name for p in (tmp_path / "wp" / "records" / "_all" / "trial").iterdir())
    assert recorded == ["ran", "which"]   # a run: block, through its own Snakemake process


REUSING = textwrap.dedent("""\
    from waypost.snakemake import Pipeline
    wp = Pipeline(config, workflow)

    D = config["data_dir"]

    rule report_all:
        input: expand(f"{D}/{{sample}}/report.txt", sample=config["samples"])

    rule train:
        output: f"{D}/models/{{sample}}/weights.bin"
        shell: "echo trained {wildcards.sample} > {output}; echo 'dim: 4' > $(dirname {output})/decoder.yml; "
               "echo {wildcards.sample} >> train-calls.txt"

    rule evaluate:
        input: rules.train.output
        output: f"{D}/{{sample}}/report.txt"
        shell: "cat {input} $(dirname {input})/decoder.yml > {output}"

    wp.finish()
    """)


def test_an_experiment_reuses_another_ones_jobs_by_rule_and_wildcards_position_by_position(tmp_path):
    (tmp_path / "Snakefile").write_text(REUSING)
    common = {"samples": ["s1", "s2"], "root": "records"}
    (tmp_path / "alpha.yaml").write_text(yaml.safe_dump({**common, "data_dir": "out-alpha",
                                                         "experiments": {"alpha": {}}}))
    (tmp_path / "beta.yaml").write_text(yaml.safe_dump({**common, "data_dir": "out-beta",
                                                        "experiments": {"beta": {"reuse": {"train": "alpha"}}}}))
    for name in ("alpha", "beta"):
        ran = _snakemake(tmp_path, "--configfile", f"{name}.yaml")
        assert ran.returncode == 0, ran.stderr[-3000:]
    # beta ran no training: its train jobs took alpha's, outputs and side files, at beta's own paths
    assert sorted((tmp_path / "train-calls.txt").read_text().split()) == ["s1", "s2"]
    for sample in ("s1", "s2"):
        assert (tmp_path / f"out-beta/models/{sample}/weights.bin").read_text() == f"trained {sample}\n"
        assert (tmp_path / f"out-beta/models/{sample}/decoder.yml").read_text() == "dim: 4\n"
        assert (tmp_path / f"out-beta/{sample}/report.txt").read_text() == f"trained {sample}\ndim: 4\n"
        record = json.loads((tmp_path / f"records/_all/beta/train/{sample}/_manifest.json").read_text())
        source = tmp_path / f"records/_all/alpha/train/{sample}"
        assert record["reused_from"] == str(source) and record["attempts"][0]["action"] == "reuse", record
        assert {o["path"]: o.get("side", False) for o in record["outputs"]} == \
            {"weights.bin": False, "decoder.yml": True}
        assert record["wildcards"] == {"sample": sample} and record["declared"] == ["weights.bin"]
        # evaluate ran in beta, over the copies
        assert json.loads((tmp_path / f"records/_all/beta/evaluate/{sample}/_manifest.json").read_text())[
            "attempts"][0]["action"] == "cmd"
    shown = _waypost(tmp_path, "status", "--config", "beta.yaml", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["experiments"]["beta"]["_all"]["train"]["state"] == "SUCCESS"
    # a source with no such job: one line naming it, the job fails, nothing is made
    (tmp_path / "gamma.yaml").write_text(yaml.safe_dump({**common, "data_dir": "out-gamma",
                                                         "experiments": {"gamma": {"reuse": {"train": "nowhere"}}}}))
    failed = _snakemake(tmp_path, "--configfile", "gamma.yaml")
    assert failed.returncode != 0
    said = [line for line in failed.stderr.splitlines() if "can't reuse" in line]
    # (either job may be the first to say it: they run side by side)
    assert said and re.search(r"records/_all/nowhere/train/s[12]/_manifest\.json: no manifest", said[0]), \
        failed.stderr[-2000:]
    assert not (tmp_path / "out-gamma/models").exists() or not any((tmp_path / "out-gamma/models").rglob("*.bin"))


def test_waypost_reuse_writes_the_entries_for_the_rules_upstream_of_a_rule_in_its_own_layout(tmp_path):
    (tmp_path / "Snakefile").write_text(REUSING)
    common = {"samples": ["s1", "s2"], "root": "records"}
    (tmp_path / "alpha.yaml").write_text(yaml.safe_dump({**common, "data_dir": "out-alpha",
                                                         "experiments": {"alpha": {}}}))
    (tmp_path / "delta.yaml").write_text(yaml.safe_dump({**common, "data_dir": "out-delta",
                                                         "experiments": {"delta": {}}}))
    before = _waypost(tmp_path, "reuse", "--config", "delta.yaml", "--into", "delta", "--from", "alpha",
                      "--upstream-of", "evaluate")
    assert before.returncode == 2 and "waypost: rule evaluate has no job recorded in experiment alpha" \
        in before.stderr, before.stderr   # one line, nothing written
    assert not (tmp_path / "reuse").exists()
    ran = _snakemake(tmp_path, "--configfile", "alpha.yaml")
    assert ran.returncode == 0, ran.stderr[-3000:]
    wrote = _waypost(tmp_path, "reuse", "--config", "delta.yaml", "--into", "delta", "--from", "alpha",
                     "--upstream-of", "evaluate")
    assert wrote.returncode == 0, wrote.stderr
    assert wrote.stdout.startswith("wrote reuse/delta.yaml: experiment delta takes 1 stage(s) from alpha: train")
    pointers = yaml.safe_load((tmp_path / "reuse" / "delta.yaml").read_text())
    assert pointers == {"experiments": {"delta": {"reuse": {"train": "alpha"}}}}
    ran = _snakemake(tmp_path, "--configfile", "delta.yaml")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert sorted((tmp_path / "train-calls.txt").read_text().split()) == ["s1", "s2"]   # alpha's training only
    for sample in ("s1", "s2"):
        record = json.loads((tmp_path / f"records/_all/delta/train/{sample}/_manifest.json").read_text())
        assert record["reused_from"] == str(tmp_path / f"records/_all/alpha/train/{sample}")
        assert (tmp_path / f"out-delta/{sample}/report.txt").read_text() == f"trained {sample}\ndim: 4\n"


SEVERAL = textwrap.dedent("""\
    from waypost.snakemake import Pipeline
    wp = Pipeline(config, workflow)

    RUNS = list(config["experiments"])

    rule collect:
        input: expand("work/{experiment}/{city}/forecast.csv", experiment=RUNS, city=config["cities"]), "work/table.md"

    rule simulate:
        output: "work/{experiment}/{city}/state.nc"
        shell: "echo {wildcards.experiment} {wildcards.city} > {output}; echo 'grid: 8' > work/{wildcards.experiment}/{wildcards.city}/grid.yml; echo {wildcards.experiment}-{wildcards.city} >> simulated.txt"

    rule forecast:
        input: rules.simulate.output
        output: "work/{experiment}/{city}/forecast.csv"
        shell: "cat {input} > {output}"

    rule table:
        input: expand("work/{experiment}/{city}/forecast.csv", experiment=RUNS, city=config["cities"])
        output: "work/table.md"
        shell: "cat {input} > {output}"

    wp.finish()
    """)


def test_several_experiments_in_one_config_take_the_experiment_from_the_jobs_wildcard(tmp_path):
    (tmp_path / "Snakefile").write_text(SEVERAL)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "cities": ["oslo", "lima"], "root": "ledger",
        "experiments": {"coarse": {}, "fine": {"reuse": {"simulate": "coarse"}}}}))
    ran = _snakemake(tmp_path, "--configfile", "config.yaml")
    assert ran.returncode == 0, ran.stderr[-3000:]
    # fine took coarse's simulations (made first, in the same run): simulated once per city
    assert sorted((tmp_path / "simulated.txt").read_text().split()) == ["coarse-lima", "coarse-oslo"]
    for experiment in ("coarse", "fine"):
        for city in ("oslo", "lima"):
            for rule in ("simulate", "forecast"):
                record = json.loads((tmp_path / f"ledger/_all/{experiment}/{rule}/{city}/_manifest.json").read_text())
                assert record["state"] == "SUCCESS" and record["experiment"] == experiment
                assert record["wildcards"] == {"experiment": experiment, "city": city}
            assert (tmp_path / f"work/{experiment}/{city}/forecast.csv").read_text() == f"coarse {city}\n"
    # a rule without the wildcard: which experiment is its job's can't be told; said, and run as plain
    said = [line for line in ran.stderr.splitlines() if line.startswith("waypost: ") and "no waypost record" in line]
    assert said == ["waypost: run as plain Snakemake runs them, with no waypost record: table (no {experiment} "
                    "wildcard, and the config declares several experiments)"]
    # grid.yml, in a directory forecast writes too, and that no rule declares: said, not taken
    left = [line for line in ran.stderr.splitlines() if "left beside its outputs" in line]
    assert sorted(line.split(": ")[2] for line in left) == ["work/coarse/lima/grid.yml", "work/coarse/oslo/grid.yml"]
    assert all(line.startswith("waypost: simulate[") and "experiment=coarse" in line for line in left), left
    simulated = json.loads((tmp_path / "ledger/_all/coarse/simulate/oslo/_manifest.json").read_text())
    assert [o["path"] for o in simulated["outputs"]] == ["state.nc"]
    shown = _waypost(tmp_path, "status", "--config", "config.yaml", "--json")
    assert shown.returncode == 0, shown.stderr
    grids = json.loads(shown.stdout)["experiments"]
    assert {e: grids[e]["_all"]["forecast"]["state"] for e in grids} == {"coarse": "SUCCESS", "fine": "SUCCESS"}


def test_a_snakefile_that_never_calls_finish_is_one_line_and_runs_nothing(tmp_path):
    (tmp_path / "Snakefile").write_text(SEVERAL.replace("wp.finish()", ""))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"cities": ["oslo"], "root": "ledger",
                                                          "experiments": {"coarse": {}}}))
    ran = _snakemake(tmp_path, "--configfile", "config.yaml")
    assert ran.returncode != 0 and "Traceback" not in ran.stderr
    assert "waypost: the Snakefile never called wp.finish() after its rules" in ran.stderr, ran.stderr[-2000:]
    assert not (tmp_path / "work").exists() and not (tmp_path / "ledger").exists()


INTERRUPTED = textwrap.dedent("""\
    from waypost.snakemake import Pipeline
    wp = Pipeline(config, workflow)

    rule all:
        input: "models/north/weights.txt"

    rule fit:
        output: "models/{region}/weights.txt"
        shell: "if [ -e quick ]; then echo whole > {output}; else echo half > {output}; sleep 120; fi"

    wp.finish()
    """)


def test_cron_sets_aside_what_an_interrupted_job_left_before_the_job_runs_again(tmp_path):
    import os
    import signal
    import time

    from conftest import LOCAL_PROFILE
    (tmp_path / "Snakefile").write_text(INTERRUPTED)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"root": "ledger", "experiments": {"spring": {}}}))
    # The whole run is killed (the driver, its runner and the step) while the step is at work.
    run = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "config.yaml"],
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    marker = tmp_path / "ledger/_all/spring/fit/north/_running.json"
    output = tmp_path / "models/north/weights.txt"
    deadline = time.monotonic() + 120
    while not (marker.exists() and output.exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists() and output.read_text() == "half\n"
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    (tmp_path / "quick").touch()
    again = subprocess.run([sys.executable, "-m", "waypost.cli", "cron", "--config", "config.yaml",
                            "--profile", str(LOCAL_PROFILE)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    said = [line for line in again.stdout.splitlines() if "set aside the partial outputs" in line]
    assert len(said) == 1 and said[0].endswith("ledger/_all/spring/fit/north in .attempts/1"), again.stdout
    # what the killed attempt left is in the record's archive, at its path from the outputs' directory
    assert (tmp_path / "ledger/_all/spring/fit/north/.attempts/1/weights.txt").read_text() == "half\n"
    assert output.read_text() == "whole\n"
    record = _manifest_at(tmp_path / "ledger/_all/spring/fit/north")
    assert record["state"] == "SUCCESS" and record["attempts"][0]["state"] != "SUCCESS", record["attempts"]


def _manifest_at(record: Path) -> dict:
    return json.loads((record / "_manifest.json").read_text())


# Snakemake's idioms through a record each: log:, benchmark:, params and
# resources functions, threads, shell.prefix, globals in the command, {{ }}
# in awk, retries, group, unpack, ensure, a checkpoint gathered with
# glob_wildcards, touch and protected outputs, a module's rules.
IDIOMS = 'from waypost.snakemake import Pipeline  # waypost\nwp = Pipeline(config, workflow)  # waypost\nimport os\nshell.prefix("set -o pipefail; export GREETING=hi; ")\nwildcard_constraints:\n    x="[a-z]+"\nXS = ["ab", "cd"]\nSUFFIX = "sfx"\n\nlocalrules: everything\n\nrule everything:\n    default_target: True\n    input: expand("agg/{x}.sum", x=XS), expand("mod/{x}.loud", x=XS), "agg/final.txt", expand("agg/{x}.ensured", x=XS)\n\nrule base:\n    output: "base/{x}.txt"\n    log: "logs/base/{x}.log"\n    benchmark: "bench/base/{x}.tsv"\n    params: size=lambda w, output: len(output[0])\n    resources: mem_mb=lambda w, attempt: 100 * attempt\n    threads: 2\n    message: "making {wildcards.x}"\n    priority: 3\n    retries: 1\n    shell: "echo {wildcards.x} {params.size} $GREETING {SUFFIX} {resources.mem_mb} {threads} > {output:q} 2> {log}; awk \'{{print $1}}\' {output} >> {log}"\n\ndef unpacked(w):\n    return {"one": f"base/{w.x}.txt"}\n\nrule ensured:\n    input: unpack(unpacked)\n    output: ensure("agg/{x}.ensured", non_empty=True)\n    group: "g1"\n    shell: "cat {input.one} > {output}"\n\ncheckpoint chunks:\n    input: "base/{x}.txt"\n    output: directory("chunks/{x}")\n    shell: "mkdir -p {output}; for i in 1 2; do echo $i > {output}/c$i.txt; done"\n\nrule per_chunk:\n    input: "chunks/{x}/c{i}.txt"\n    output: "chunked/{x}/c{i}.out"\n    shell: "cat {input} > {output}"\n\ndef gathered(w):\n    d = checkpoints.chunks.get(x=w.x).output[0]\n    return expand("chunked/{x}/c{i}.out", x=w.x, i=glob_wildcards(os.path.join(d, "c{i}.txt")).i)\n\nrule agg:\n    input: gathered\n    output: "agg/{x}.sum"\n    shell: "cat {input} > {output}"\n\nrule final:\n    input: expand("agg/{x}.sum", x=XS)\n    output: touch("agg/final.txt"), protected("agg/final.keep")\n    shell: "cat {input} > {output[1]}"\n\nmodule m:\n    snakefile: "mod/Snakefile"\nuse rule * from m as m_*\n\nwp.finish()  # waypost\n'
IDIOMS_MODULE = 'rule shout:\n    input: "base/{x}.txt"\n    output: "mod/{x}.loud"\n    shell: "tr a-z A-Z < {input} > {output}"\n'


def test_snakemake_idioms_run_through_records_as_plain_snakemake_runs_them(tmp_path):
    import hashlib
    made = {}
    for name, with_waypost in (("plain", False), ("wp", True)):
        workdir = tmp_path / name
        (workdir / "mod").mkdir(parents=True)
        (workdir / "mod" / "Snakefile").write_text(IDIOMS_MODULE)
        keep = (lambda line: True) if with_waypost else (lambda line: not line.rstrip().endswith(MARK))
        (workdir / "Snakefile").write_text("".join(line for line in IDIOMS.splitlines(keepends=True) if keep(line)))
        (workdir / "config.yaml").write_text(yaml.safe_dump({"root": "records", "experiments": {"trial": {}}})
                                             if with_waypost else "{}\n")
        ran = _snakemake(workdir, "--configfile", "config.yaml")
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "no waypost record" not in ran.stderr   # every rule that makes files has its record
        made[name] = {str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
                      for top in ("agg", "base", "chunked", "chunks", "mod", "logs") for p in (workdir / top).rglob("*")
                      if p.is_file() and p.name != "Snakefile"}
        forced = _snakemake(workdir, "--configfile", "config.yaml", "-n", "--forcerun", "per_chunk")
        made[name]["forced"] = _jobs(forced)
    assert made["wp"] == made["plain"]
    assert made["wp"]["forced"] == {"per_chunk": 4, "agg": 2, "final": 1, "everything": 1}
    final = _manifest(tmp_path / "wp", "final")
    assert sorted(o["path"] for o in final["outputs"]) == ["final.keep", "final.txt"]   # the touch() one too


PYTHON_RULES = textwrap.dedent("""\
    from waypost.snakemake import Pipeline  # waypost
    wp = Pipeline(config, workflow)  # waypost

    PARTS = ["north", "south"]

    rule tables:
        input: expand("py/{part}/table.txt", part=PARTS), expand("py/{part}/scored.txt", part=PARTS)

    rule measure:
        output: "py/{part}/raw.txt"
        shell: "echo {wildcards.part} 7 > {output}"

    rule tabulate:
        input: "py/{part}/raw.txt"
        output: "py/{part}/table.txt"
        params: width=12, label=lambda wildcards, input: input[0].split("/")[1]
        script: "scripts/lay_out.py"

    rule score:
        input: rules.tabulate.output
        output: "py/{part}/scored.txt"
        params: weight=2
        run:
            with open(input[0]) as table, open(output[0], "w") as scored:
                scored.write(f"{wildcards.part} {params.weight} {sorted(params.keys())}\\\\n")
                scored.write(table.read())
            shell("echo scored {wildcards.part} >> {output}; echo scoring {wildcards.part}")
            if wildcards.part == config.get("fail_part"):
                raise ValueError("no score for " + wildcards.part)

    wp.finish()  # waypost
    """)

# The script passes its params on as keyword arguments: an extra one of waypost's would break it.
TABULATE = textwrap.dedent("""\
    def tabulate(source, target, width, label):
        with open(source) as raw, open(target, "w") as table:
            table.write(label.ljust(width) + "|" + raw.read())
    tabulate(snakemake.input[0], snakemake.output[0], **snakemake.params)
    """)


def _python_rules(workdir: Path, with_waypost: bool, **config) -> None:
    workdir.mkdir(parents=True)
    keep = (lambda line: True) if with_waypost else (lambda line: not line.rstrip().endswith(MARK))
    (workdir / "Snakefile").write_text("".join(line for line in PYTHON_RULES.splitlines(keepends=True) if keep(line)))
    (workdir / "scripts").mkdir()
    (workdir / "scripts" / "lay_out.py").write_text(TABULATE)
    waypost_keys = {"root": "records", "experiments": {"trial": {}}} if with_waypost else {}
    (workdir / "config.yaml").write_text(yaml.safe_dump({**waypost_keys, **config}))


def test_script_and_run_rules_get_a_record_and_see_what_plain_snakemake_gives_them(tmp_path):
    runs = {}
    for name, with_waypost in (("plain", False), ("wp", True)):
        _python_rules(tmp_path / name, with_waypost)
        runs[name] = _snakemake(tmp_path / name, "--configfile", "config.yaml")
        assert runs[name].returncode == 0, runs[name].stderr[-3000:]
    files = {name: {str(p.relative_to(tmp_path / name)): p.read_text()
                    for p in sorted((tmp_path / name / "py").rglob("*")) if p.is_file()} for name in runs}
    assert files["wp"] == files["plain"]   # the script's **params and the block's params: the rule's own
    assert "['weight']" in files["wp"]["py/north/scored.txt"]
    assert "no waypost record" not in runs["wp"].stderr
    records = tmp_path / "wp" / "records" / "_all" / "trial"
    for rule in ("tabulate", "score"):
        for part in ("north", "south"):
            manifest = json.loads((records / rule / part / "_manifest.json").read_text())
            assert manifest["state"] == "SUCCESS", (rule, part, manifest)
    block_log = (records / "score" / "north" / "_logs" / "attempt-1.log").read_text()
    assert "scoring north" in block_log   # the block's own shell() output, in its attempt's log
    # the script Snakemake wrote out (and removed since) is kept with the attempt, and its .sh names it:
    # run again by hand, it remakes the same file
    logs = records / "tabulate" / "north" / "_logs"
    command = (logs / "attempt-1.sh").read_text()
    assert "records/_all/trial/tabulate/north/_logs/attempt-1.lay_out.py" in command, command
    assert ".snakemake/scripts" not in command and not list((tmp_path / "wp" / ".snakemake" / "scripts").iterdir())
    assert (logs / "attempt-1.lay_out.py").read_text().endswith(TABULATE)
    table = tmp_path / "wp" / "py" / "north" / "table.txt"
    table.unlink()
    subprocess.run(["bash", str(logs / "attempt-1.sh")], cwd=tmp_path / "wp", check=True)
    assert table.read_text() == files["plain"]["py/north/table.txt"]
    # its input, made by measure's job in the same run, is described with measure's record
    read = json.loads((records / "tabulate" / "north" / "_manifest.json").read_text())["inputs"]
    assert [(i["path"], i["manifest"], i["state"]) for i in read] == [
        ("py/north/raw.txt", "records/_all/trial/measure/north/_manifest.json", "SUCCESS")]
    assert read[0]["sha256"] == json.loads((records / "measure" / "north" / "_manifest.json").read_text())[
        "outputs"][0]["sha256"]


def test_a_failing_run_block_is_reported_as_plain_snakemake_reports_it_and_recorded_failed(tmp_path):
    runs = {}
    for name, with_waypost in (("plain", False), ("wp", True)):
        _python_rules(tmp_path / name, with_waypost, fail_part="south")
        runs[name] = _snakemake(tmp_path / name, "--configfile", "config.yaml")
        assert runs[name].returncode == 1, runs[name].stderr[-3000:]
    line = next(n for n, text in enumerate(PYTHON_RULES.splitlines(), 1) if "raise ValueError" in text) - 2  # (without the waypost lines)
    said = f'ValueError in file "{tmp_path / "plain" / "Snakefile"}", line {line}:\nno score for south'
    assert said in runs["plain"].stderr
    assert said.replace(str(tmp_path / "plain"), str(tmp_path / "wp")).replace(f"line {line}", f"line {line + 2}") \
        in runs["wp"].stderr
    assert "Traceback (most recent call last)" not in runs["wp"].stderr, runs["wp"].stderr[-3000:]
    manifest = json.loads((tmp_path / "wp" / "records" / "_all" / "trial" / "score" / "south" / "_manifest.json")
                          .read_text())
    assert manifest["state"] == "FAILED"
    assert (tmp_path / "wp" / "py" / "north" / "scored.txt").exists()


ADOPTING = textwrap.dedent("""\
    from waypost.snakemake import Pipeline
    wp = Pipeline(config, workflow)

    D = config["data_dir"]

    rule scores:
        input: expand(f"{D}/{{lang}}/score.txt", lang=["de", "fr"])

    rule teach:
        output: f"{D}/{{lang}}/teacher/model.npz", f"{D}/{{lang}}/teacher/vocab.txt"
        shell: "echo trained {wildcards.lang} > {output[0]}; echo v > {output[1]}; echo {wildcards.lang} >> teach-calls.txt"

    rule score:
        input: rules.teach.output
        output: f"{D}/{{lang}}/score.txt"
        shell: "cat {input} > {output}"

    wp.finish()
    """)


def test_waypost_adopt_records_a_hand_made_job_of_a_rule_in_its_own_layout(tmp_path):
    (tmp_path / "Snakefile").write_text(ADOPTING)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"data_dir": "work", "root": "store",
                                                          "experiments": {"first": {}}}))
    teacher = tmp_path / "work" / "de" / "teacher"
    teacher.mkdir(parents=True)
    (teacher / "model.npz").write_text("made by hand\n")
    (teacher / "vocab.txt").write_text("hand vocab\n")

    wrong = _waypost(tmp_path, "adopt", "teach", "--config", "config.yaml", "--experiment", "first", "--wildcards", "language=de")
    assert wrong.returncode != 0 and wrong.stderr.strip().splitlines() == [
        "waypost: adopt teach: its jobs' wildcards are lang; give lang=VALUE; it has no language; nothing adopted"]
    absent = _waypost(tmp_path, "adopt", "teach", "--config", "config.yaml", "--experiment", "first", "--wildcards", "lang=fr")
    assert absent.returncode != 0 and "put its outputs where the rule writes them first; missing: " \
        "work/fr/teacher/model.npz, work/fr/teacher/vocab.txt; nothing adopted" in absent.stderr, absent.stderr
    assert not (tmp_path / "store").exists()   # nothing written

    adopted = _waypost(tmp_path, "adopt", "teach", "--config", "config.yaml", "--experiment", "first", "--wildcards", "lang=de",
                       "--note", "trained on the big machine")
    assert adopted.returncode == 0, adopted.stderr
    assert adopted.stdout.splitlines()[0] == (
        "adopted 2 file(s) as the job teach[lang=de] of experiment first: work/de/teacher/model.npz, "
        "work/de/teacher/vocab.txt (its record: store/_all/first/teach/de)")
    record = json.loads((tmp_path / "store/_all/first/teach/de/_manifest.json").read_text())
    assert record["adopted"] and record["state"] == "SUCCESS" and record["note"] == "trained on the big machine"
    assert record["wildcards"] == {"lang": "de"} and record["declared"] == ["model.npz", "vocab.txt"]

    ran = _snakemake(tmp_path, "--configfile", "config.yaml")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (tmp_path / "teach-calls.txt").read_text().split() == ["fr"]   # the adopted teacher is not trained
    assert (tmp_path / "work/de/score.txt").read_text() == "made by hand\nhand vocab\n"
    shown = _waypost(tmp_path, "status", "--config", "config.yaml", "--json")
    assert shown.returncode == 0, shown.stderr
    cell = json.loads(shown.stdout)["experiments"]["first"]["_all"]["teach"]
    assert cell["instances"]["de"]["state"] == "adopted" and cell["instances"]["fr"]["state"] == "SUCCESS", cell

    # another experiment takes the adopted job as any other: it is the source of a reuse
    (tmp_path / "second.yaml").write_text(yaml.safe_dump({"data_dir": "work2", "root": "store",
                                                          "experiments": {"second": {"reuse": {"teach": "first"}}}}))
    ran = _snakemake(tmp_path, "--configfile", "second.yaml")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (tmp_path / "work2/de/score.txt").read_text() == "made by hand\nhand vocab\n"
    assert (tmp_path / "teach-calls.txt").read_text().split() == ["fr"]
    # over a job the pipeline ran itself: only with --force, its record archived first
    again = _waypost(tmp_path, "adopt", "teach", "--config", "config.yaml", "--experiment", "first",
                     "--wildcards", "lang=fr")
    assert again.returncode != 0 and "store/_all/first/teach/fr: already a SUCCESS job with its own record" \
        in again.stderr, again.stderr
    forced = _waypost(tmp_path, "adopt", "teach", "--config", "config.yaml", "--experiment", "first",
                      "--wildcards", "lang=fr", "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines()[1].endswith("archived in store/_all/first/teach/fr/.attempts/1"), forced.stdout
    assert json.loads((tmp_path / "store/_all/first/teach/fr/.attempts/1/_manifest.json").read_text())[
        "attempts"][0]["action"] == "cmd"


HAND_MADE = textwrap.dedent("""\
    from waypost.snakemake import Pipeline  # waypost
    wp = Pipeline(config, workflow)  # waypost

    rule scores:
        input: "out/de/score.txt"

    rule teach:
        input: "data/{lang}.txt"
        output: "out/{lang}/model.txt"
        shell: "cat {input} > {output}; echo {wildcards.lang} >> teach-calls.txt"

    rule score:
        input: rules.teach.output
        output: "out/{lang}/score.txt"
        shell: "cat {input} > {output}"

    wp.finish()  # waypost
    """)


def test_an_adopted_job_is_done_in_the_default_mode_and_its_hand_made_outputs_are_never_lost(tmp_path):
    """``waypost adopt`` over a hand-made output that is older than the
    rule's input: plain Snakemake (its mtime trigger, the shipped profile's)
    would overwrite it; with waypost the adopted job is done, and the run
    says so in one line. ``--forcerun`` redoes it, its record and the
    hand-made file set aside first; an adopted record is never replaced
    unkept."""
    from conftest import LOCAL_PROFILE

    def place(workdir: Path, with_waypost: bool) -> Path:
        workdir.mkdir()
        keep = (lambda line: True) if with_waypost else (lambda line: not line.rstrip().endswith(MARK))
        (workdir / "Snakefile").write_text("".join(filter(keep, HAND_MADE.splitlines(keepends=True))))
        (workdir / "config.yaml").write_text(yaml.safe_dump({"root": "rec", "experiments": {"first": {}}}))
        (workdir / "out" / "de").mkdir(parents=True)
        (workdir / "out/de/model.txt").write_text("made by hand\n")
        (workdir / "data").mkdir()
        (workdir / "data/de.txt").write_text("raw\n")   # newer than the hand-made model
        os.utime(workdir / "out/de/model.txt", (1_000_000_000, 1_000_000_000))
        return workdir

    def run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
        done = _snakemake(workdir, *args, "--profile", str(LOCAL_PROFILE), "--configfile", "config.yaml")
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    plain, wp = place(tmp_path / "plain", False), place(tmp_path / "wp", True)
    run(plain)
    assert (plain / "out/de/model.txt").read_text() == "raw\n"   # plain Snakemake overwrites it

    adopted = _waypost(wp, "adopt", "teach", "--config", "config.yaml", "--experiment", "first", "--wildcards", "lang=de")
    assert adopted.returncode == 0, adopted.stderr
    ran = run(wp)
    assert (wp / "out/de/model.txt").read_text() == "made by hand\n" and not (wp / "teach-calls.txt").exists()
    assert (wp / "out/de/score.txt").read_text() == "made by hand\n"
    said = [line for line in ran.stderr.splitlines() if line.startswith("waypost:") and "adopted" in line]
    assert said == ["waypost: out/de/model.txt: adopted by hand; its input data/de.txt is newer: kept "
                    "(`waypost rerun teach --instance de` to redo it)"], ran.stderr
    assert _jobs(_snakemake(wp, "--profile", str(LOCAL_PROFILE), "--configfile", "config.yaml", "-n")) == {}
    assert json.loads((wp / "rec/_all/first/teach/de/_manifest.json").read_text())["adopted"]

    # --forcerun redoes it: its record and the hand-made file set aside first, said in one line
    dry = _snakemake(wp, "--profile", str(LOCAL_PROFILE), "--configfile", "config.yaml", "-n", "--forcerun", "teach")
    assert _jobs(dry)["teach"] == 1 and not (wp / "rec/_all/first/teach/de/.attempts").exists()
    forced = run(wp, "--forcerun", "teach")
    assert ("waypost: rec/_all/first/teach/de: adopted by hand; --forcerun redoes it: its record and outputs set "
            "aside in .attempts/1 first") in forced.stderr.splitlines(), forced.stderr
    kept = wp / "rec/_all/first/teach/de/.attempts/1"
    assert (kept / "model.txt").read_text() == "made by hand\n" and json.loads((kept / "_manifest.json").read_text())[
        "adopted"]
    assert (wp / "out/de/model.txt").read_text() == "raw\n" and (wp / "teach-calls.txt").read_text() == "de\n"

    # an adopted job whose output is gone is made again, its record set aside first (not replaced unkept)
    (wp / "out/de/model.txt").write_text("made by hand again\n")
    assert _waypost(wp, "adopt", "teach", "--config", "config.yaml", "--experiment", "first", "--wildcards",
                    "lang=de", "--force").returncode == 0
    (wp / "out/de/model.txt").unlink()
    again = run(wp, "out/de/model.txt")
    assert "waypost: teach[lang=de]: adopted by hand; redone now: its record set aside in .attempts/3" \
        in again.stderr.splitlines(), again.stderr
    assert json.loads((wp / "rec/_all/first/teach/de/.attempts/3/_manifest.json").read_text())["adopted"]
    assert json.loads((wp / "rec/_all/first/teach/de/_manifest.json").read_text())["attempts"][0]["action"] == "cmd"
