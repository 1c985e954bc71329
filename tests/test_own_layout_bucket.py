"""A Snakefile in its own layout on a ``gs://`` root, against fake-gcs-server:
every job of a ``shell:``, ``script:`` or ``run:`` rule keeps its record in
the bucket (``{root}/_all/{experiment}/{rule}/{wildcards}``), its outputs
where its rule puts them under the root, stored by the step runner before
the manifest; a rule waypost leaves plain (``shadow:``) runs as plain
Snakemake runs it with a storage plugin. The files in the bucket are those
plain Snakemake writes on disk, side by side."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import gcs_flags as flags
from conftest import gcs_fs as fs
from conftest import gcs_key as key
from conftest import gcs_objects as objects
from test_own_layout_records import MARK, _jobs, _snakemake

SNAKEFILE = textwrap.dedent("""\
    configfile: "config.yaml"
    from waypost.snakemake import Pipeline  # waypost
    wp = Pipeline(config, workflow)  # waypost

    PLOTS = config["plots"]

    rule everything:
        input: "out/summary.tsv", "out/mirrored.txt", expand("out/{plot}/count.txt", plot=PLOTS)

    rule measure:
        output: "work/{plot,[a-z]+}/area.txt"
        log: "logs/measure/{plot}.log"
        shell: "bash measure.sh {wildcards.plot} {output} {log}"

    rule count:
        input: "work/{plot}/area.txt"
        output: "out/{plot}/count.txt"
        params: folder=lambda wildcards, input: input[0].rsplit("/", 1)[0].rsplit("/", 1)[-1]
        shell: "wc -c < {input} > {output}; echo {params.folder} >> {output}"

    rule gather:
        input: expand("work/{plot}/area.txt", plot=PLOTS)
        output: "out/gathered.tsv"
        script: "gather.py"

    rule summarize:
        input: rules.gather.output
        output: "out/summary.tsv"
        run:
            rows = open(input[0]).read().splitlines()
            with open(output[0], "w") as f:
                f.write(f"{len(rows)} plots\\n")

    rule mirror:
        input: rules.gather.output
        output: "out/mirrored.txt"
        shadow: "minimal"
        shell: "rev {input} > {output}"

    wp.finish()  # waypost
    """)

# Plot "bog" fails its first try (exit 3) after writing half its output; a
# checkpoint goes beside the output, in a directory only this job writes.
MEASURE = textwrap.dedent("""\
    mkdir -p "$(dirname "$2")" "$(dirname "$3")"
    echo "measuring $1" > "$3"
    echo "notes on $1" > "$(dirname "$2")/notes.txt"
    if [ "$1" = bog ] && [ ! -e failed-once ]; then touch failed-once; echo partial > "$2"; exit 3; fi
    echo "$1 $(( ${#1} * 7 ))" > "$2"
    """)

GATHER = textwrap.dedent("""\
    with open(snakemake.output[0], "w") as out:
        for path in snakemake.input:
            out.write(open(path).read())
    """)


def _write(workdir: Path, root: str | None) -> Path:
    workdir.mkdir(parents=True)
    text = SNAKEFILE if root else "".join(line for line in SNAKEFILE.splitlines(keepends=True)
                                         if not line.rstrip().endswith(MARK))
    (workdir / "Snakefile").write_text(text)
    config = {"plots": ["bog", "fen"]}
    if root:
        config |= {"root": root, "experiments": {"survey": {}},
                   "stages": {"measure": {"policy": {"max_attempts": 3, "cues": [
                       {"action": "rerun", "rerun": "new", "when": "cmd.exit == 3"}]}}}}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (workdir / "measure.sh").write_text(MEASURE)
    (workdir / "gather.py").write_text(GATHER)
    return workdir


def _waypost(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "waypost.cli", *args, "--config", "config.yaml"], cwd=workdir,
                          capture_output=True, text=True, timeout=300)


def _bucket_files(root: str, top: str) -> dict[str, str]:
    return {name: fs().cat_file(f"{key(root)}/{name}").decode() for name in sorted(objects(root))
            if name.startswith(top + "/")}


def _disk_files(workdir: Path, top: str) -> dict[str, str]:
    return {str(p.relative_to(workdir)): p.read_text() for p in sorted((workdir / top).rglob("*")) if p.is_file()}


def _record(root: str, rule: str, job: str | None = None) -> dict:
    where = f"_all/survey/{rule}" + (f"/{job}" if job else "")
    return json.loads(fs().cat_file(f"{key(root)}/{where}/_manifest.json"))


@pytest.fixture(scope="module")
def ran(gcs_emulator, tmp_path_factory) -> tuple[Path, Path, str]:
    """Both runs, once (the last test changes the bucket: it comes last)."""
    fs().mkdir("own-layout-study")
    root = "gs://own-layout-study/study"
    base = tmp_path_factory.mktemp("ownbucket")
    plain, wp = _write(base / "plain", None), _write(base / "wp", root)
    done = _snakemake(plain, "--retries", "1")
    assert done.returncode == 0, done.stderr[-4000:]
    done = _snakemake(wp, *flags(root))
    assert done.returncode == 0, done.stderr[-4000:]
    return plain, wp, root


def test_the_bucket_holds_what_plain_snakemake_writes_and_each_job_its_record(ran):
    plain, wp, root = ran
    fs().invalidate_cache()
    assert _bucket_files(root, "out") == _disk_files(plain, "out")   # the files, side files, the plain rule's
    for top in ("work", "logs"):
        assert _bucket_files(root, top) == _disk_files(plain, top)
    assert not (wp / "out").exists() and not (wp / "work").exists()
    for plot in ("bog", "fen"):
        record = _record(root, "measure", plot)
        assert record["state"] == "SUCCESS" and record["wildcards"] == {"plot": plot}
        assert {o["path"]: bool(o.get("side")) for o in record["outputs"]} == {"area.txt": False, "notes.txt": True}
        assert record["declared"] == ["area.txt"] and record["outputs_dir"] == f"../../../../work/{plot}"
    for rule in ("gather", "summarize"):
        assert _record(root, rule)["state"] == "SUCCESS"
    assert not any(name.startswith("_all/survey/mirror") for name in objects(root))   # (plain: no record)
    # Outputs first, the manifest last.
    listing = fs().find(key(root), detail=True)
    assert listing[f"{key(root)}/out/fen/count.txt"]["mtime"] <= listing[
        f"{key(root)}/_all/survey/count/fen/_manifest.json"]["mtime"]
    # A second run: nothing to do, in plain Snakemake's words.
    again = _snakemake(wp, *flags(root), "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]


def test_the_policy_reruns_in_a_new_workspace_archiving_in_the_bucket_what_the_failed_try_left(ran):
    _, _, root = ran
    record = _record(root, "measure", "bog")
    assert [(a["state"], a["exit_code"]) for a in record["attempts"]] == [("FAILED", 3), ("SUCCESS", 0)]
    archive = record["attempts"][0]["workspace"]
    assert archive == ".attempts/1"
    base = f"{key(root)}/_all/survey/measure/bog/{archive}"
    assert fs().cat_file(f"{base}/area.txt") == b"partial\n"
    assert fs().cat_file(f"{base}/notes.txt") == b"notes on bog\n"
    assert fs().cat_file(f"{key(root)}/work/bog/area.txt") == b"bog 21\n"


def test_status_rerun_and_presence_read_the_records_in_the_bucket(ran):
    _, wp, root = ran
    shown = _waypost(wp, "status")
    assert shown.returncode == 0, shown.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in shown.stdout.splitlines()
            if line.count("│") >= 3}
    assert rows["measure"] == "done 2 ×2" and rows["gather"] == "done"

    # rerun: the job's record and its outputs (and side files) go into its archive; the next run redoes it.
    done = _waypost(wp, "rerun", "summarize")
    assert done.returncode == 0, done.stderr
    fs().invalidate_cache()
    assert "out/summary.tsv" not in objects(root)
    assert {"_all/survey/summarize/.attempts/1/summary.tsv", "_all/survey/summarize/.attempts/1/_manifest.json"} \
        <= objects(root)
    redone = _snakemake(wp, *flags(root))
    assert redone.returncode == 0, redone.stderr[-3000:]
    assert "localrule summarize:" in redone.stdout + redone.stderr
    assert "localrule measure:" not in redone.stdout + redone.stderr
    assert fs().cat_file(f"{key(root)}/out/summary.tsv") == b"2 plots\n"

    # verify reads each record's outputs where its rule put them; --repair
    # sets aside a job whose output changed, with its outputs and side files.
    checked = _waypost(wp, "verify")
    assert checked.returncode == 0 and "not to be trusted" not in checked.stdout + checked.stderr, checked.stdout
    fs().pipe_file(f"{key(root)}/work/fen/area.txt", b"fen 99\n")   # (the same size, other bytes)
    checked = _waypost(wp, "verify", "--repair")
    said = checked.stdout + checked.stderr
    assert "_all/survey/measure/fen: area.txt does not match its checksum" in said, said
    fs().invalidate_cache()
    assert {"_all/survey/measure/fen/.attempts/1/area.txt", "_all/survey/measure/fen/.attempts/1/notes.txt"} \
        <= objects(root) and "work/fen/area.txt" not in objects(root)
    redone = _snakemake(wp, *flags(root), "work/fen/area.txt")   # (an intermediate file: asked for by name)
    assert redone.returncode == 0, redone.stderr[-3000:]
    assert fs().cat_file(f"{key(root)}/work/fen/area.txt") == b"fen 21\n"

    # Presence mode: a recorded job whose outputs are in the bucket is done,
    # even with a newer input; the plain rule keeps Snakemake's answer.
    config = yaml.safe_load((wp / "config.yaml").read_text()) | {"rerun_policy": "presence"}
    (wp / "config.yaml").write_text(yaml.safe_dump(config))
    fs().pipe_file(f"{key(root)}/out/gathered.tsv", fs().cat_file(f"{key(root)}/out/gathered.tsv"))   # newer
    assert _jobs(_snakemake(wp, *flags(root), "-n")) == {"mirror": 1, "everything": 1}
    fs().rm_file(f"{key(root)}/out/fen/count.txt")
    assert _jobs(_snakemake(wp, *flags(root), "-n")) == {"mirror": 1, "count": 1, "everything": 1}


def test_a_failed_job_leaves_no_output_in_the_bucket_only_its_record_and_log(bucket, tmp_path):
    root = bucket + "/broken"
    wp = _write(tmp_path / "wp", root)
    (wp / "measure.sh").write_text('echo "tried $1" > "$3"; echo half > "$2"; exit 5\n')
    done = _snakemake(wp, *flags(root), "--keep-going")
    assert done.returncode != 0
    fs().invalidate_cache()
    names = objects(root)
    assert not any(name.startswith("out/") for name in names), names
    assert fs().cat_file(f"{key(root)}/logs/measure/fen.log") == b"tried fen\n"   # Snakemake keeps a failed job's log
    record = _record(root, "measure", "fen")
    assert record["state"] == "FAILED" and record["outputs"] == []


def test_an_experiment_reuses_another_ones_jobs_in_the_bucket_server_side(bucket, tmp_path, gcs_log):
    from test_own_layout_records import REUSING
    root = bucket + "/records"
    (tmp_path / "Snakefile").write_text(REUSING)
    common = {"samples": ["s1", "s2"], "root": root}
    (tmp_path / "alpha.yaml").write_text(yaml.safe_dump({**common, "data_dir": "out-alpha",
                                                         "experiments": {"alpha": {}}}))
    (tmp_path / "beta.yaml").write_text(yaml.safe_dump({**common, "data_dir": "out-beta",
                                                        "experiments": {"beta": {"reuse": {"train": "alpha"}}}}))
    ran = _snakemake(tmp_path, "--configfile", "alpha.yaml", *flags(root))
    assert ran.returncode == 0, ran.stderr[-3000:]
    mark = gcs_log.mark()
    ran = _snakemake(tmp_path, "--configfile", "beta.yaml", *flags(root))
    assert ran.returncode == 0, ran.stderr[-3000:]
    # beta ran no training: its train jobs took alpha's, outputs and side files, at beta's own paths
    assert sorted((tmp_path / "train-calls.txt").read_text().split()) == ["s1", "s2"]
    fs().invalidate_cache()
    for sample in ("s1", "s2"):
        assert fs().cat_file(f"{key(root)}/out-beta/models/{sample}/weights.bin") == f"trained {sample}\n".encode()
        assert fs().cat_file(f"{key(root)}/out-beta/models/{sample}/decoder.yml") == b"dim: 4\n"
        assert fs().cat_file(f"{key(root)}/out-beta/{sample}/report.txt") == f"trained {sample}\ndim: 4\n".encode()
        record = json.loads(fs().cat_file(f"{key(root)}/_all/beta/train/{sample}/_manifest.json"))
        assert record["reused_from"] == f"{root}/_all/alpha/train/{sample}" and \
            record["attempts"][0]["action"] == "reuse", record
        assert {o["path"]: o.get("side", False) for o in record["outputs"]} == \
            {"weights.bin": False, "decoder.yml": True}
    # Server-side: the copies' bytes never came down (only the evaluate jobs' inputs did).
    copies = [r for r in gcs_log.requests(mark) if "/rewriteTo/" in r or "/copyTo/" in r]
    assert len(copies) == 4, copies


def test_waypost_adopt_records_files_put_in_the_bucket_by_hand_as_a_jobs_outputs(bucket, tmp_path):
    from test_own_layout_records import REUSING
    root = bucket + "/records"
    (tmp_path / "Snakefile").write_text(REUSING)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"samples": ["s1", "s2"], "root": root,
                                                          "data_dir": "out", "experiments": {"alpha": {}}}))
    facts = _snakemake(tmp_path, "--configfile", "config.yaml", *flags(root), "-n")   # (what adopt reads)
    assert facts.returncode == 0, facts.stderr[-2000:]
    refused = _waypost(tmp_path, "adopt", "train", "--experiment", "alpha", "--wildcards", "sample=s1")
    assert refused.returncode != 0 and "missing: " + root + "/out/models/s1/weights.bin" in refused.stderr, \
        refused.stderr
    fs().pipe_file(f"{key(root)}/out/models/s1/weights.bin", b"trained elsewhere\n")
    fs().pipe_file(f"{key(root)}/out/models/s1/decoder.yml", b"dim: 8\n")   # (beside it, as its trainer left it)
    adopted = _waypost(tmp_path, "adopt", "train", "--experiment", "alpha", "--wildcards", "sample=s1",
                       "--note", "from the big machine")
    assert adopted.returncode == 0, adopted.stderr
    assert f"adopted 1 file(s) as the job train[sample=s1] of experiment alpha: {root}/out/models/s1/weights.bin" \
        in adopted.stdout, adopted.stdout
    record = json.loads(fs().cat_file(f"{key(root)}/_all/alpha/train/s1/_manifest.json"))
    assert record["adopted"] and record["outputs_dir"] == "../../../../out/models/s1"
    assert record["outputs"][0]["size"] == len(b"trained elsewhere\n")
    ran = _snakemake(tmp_path, *flags(root), "--configfile", "config.yaml")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (tmp_path / "train-calls.txt").read_text().split() == ["s2"]   # s1 was adopted, not trained
    assert fs().cat_file(f"{key(root)}/out/s2/report.txt") == b"trained s2\ndim: 4\n"
    assert fs().cat_file(f"{key(root)}/out/s1/report.txt") == b"trained elsewhere\ndim: 8\n"


def test_snakemake_idioms_on_a_gs_root_make_the_files_plain_snakemake_makes_on_disk(bucket, tmp_path):
    """log:, benchmark:, retries, group, unpack, ensure(), a checkpoint
    gathered with glob_wildcards, touch() and protected() outputs, a
    module's rules: the same files (their names: a params function sees
    the local copies' paths, as with any storage plugin), every job its
    record, and the same plan under --forcerun."""
    from test_own_layout_records import IDIOMS, IDIOMS_MODULE
    root = bucket + "/idioms"
    made = {}
    for name, with_waypost in (("plain", False), ("wp", True)):
        workdir = tmp_path / name
        (workdir / "mod").mkdir(parents=True)
        (workdir / "mod" / "Snakefile").write_text(IDIOMS_MODULE)
        keep = (lambda line: True) if with_waypost else (lambda line: not line.rstrip().endswith(MARK))
        (workdir / "Snakefile").write_text("".join(line for line in IDIOMS.splitlines(keepends=True) if keep(line)))
        (workdir / "config.yaml").write_text(yaml.safe_dump({"root": root, "experiments": {"trial": {}}})
                                             if with_waypost else "{}\n")
        options = ("--configfile", "config.yaml", *(flags(root) if with_waypost else ()))
        ran = _snakemake(workdir, *options)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "no waypost record" not in ran.stderr   # every rule that makes files has its record
        if with_waypost:
            fs().invalidate_cache()
            made[name] = {n for n in objects(root) if not n.startswith("_all/")}
        else:
            made[name] = {str(p.relative_to(workdir)) for top in ("agg", "base", "bench", "chunked", "chunks", "mod",
                                                                  "logs") for p in (workdir / top).rglob("*")
                          if p.is_file() and p.name != "Snakefile" and p.name != ".snakemake_timestamp"}
        made[name + " forced"] = _jobs(_snakemake(workdir, *options, "-n", "--forcerun", "per_chunk"))
        made[name + " again"] = _jobs(_snakemake(workdir, *options, "-n"))
    assert made["wp"] == made["plain"]
    assert made["wp forced"] == made["plain forced"] == {"per_chunk": 4, "agg": 2, "final": 1, "everything": 1}
    assert made["wp again"] == made["plain again"] == {}
    records = {n.rsplit("/", 1)[0] for n in objects(root) if n.startswith("_all/") and n.endswith("/_manifest.json")}
    assert {"_all/trial/base/ab", "_all/trial/final", "_all/trial/m_shout/cd", "_all/trial/chunks/ab"} <= records


MIXED = textwrap.dedent("""\
    configfile: "config.yaml"
    from waypost.snakemake import Pipeline
    wp = Pipeline(config, workflow)

    rule report:
        input: "work/bog/area.txt"
        output: wp.out("report.txt")
        shell: "cat {input} $(dirname {input})/notes.txt > {output}"

    rule measure:
        output: "work/{plot,[a-z]+}/area.txt"
        shell: "echo notes on {wildcards.plot} > $(dirname {output})/notes.txt; echo 7 > {output}"

    wp.finish()

    rule all:
        default_target: True
        input: wp.targets
    """)


def test_a_stage_reading_a_rule_in_its_own_layouts_output_gets_its_side_files_as_on_disk(bucket, tmp_path):
    # On disk the notes a job leaves beside its output are there for whoever
    # reads the output; on a gs:// root a stage's step gets them with it.
    root = bucket + "/mixed"
    tmp_path.joinpath("Snakefile").write_text(MIXED)
    tmp_path.joinpath("config.yaml").write_text(yaml.safe_dump({"root": root, "experiments": {"survey": {}}}))
    done = _snakemake(tmp_path, *flags(root))
    assert done.returncode == 0, done.stderr[-4000:]
    fs().invalidate_cache()
    report = [name for name in objects(root) if name.endswith("/report.txt")]
    assert len(report) == 1, objects(root)
    assert fs().cat_file(f"{key(root)}/{report[0]}") == b"7\nnotes on bog\n"
    # Again on a machine with no local copies: the stage alone runs, fetching what it reads.
    fs().rm(f"{key(root)}/{report[0].rsplit('/', 1)[0]}", recursive=True)
    shutil.rmtree(tmp_path / ".snakemake" / "storage")
    done = _snakemake(tmp_path, *flags(root))
    assert done.returncode == 0, done.stderr[-4000:]
    fs().invalidate_cache()
    assert fs().cat_file(f"{key(root)}/{report[0]}") == b"7\nnotes on bog\n"
