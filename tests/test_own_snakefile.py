"""A pipeline written in plain Snakemake style (examples/own-snakefile) runs
with waypost's few added lines as plain Snakemake runs it without them, side
by side: the same jobs, the same files, the same answer on a later run, and
waypost's commands find its Snakefile and config where the pipeline keeps
them (no workflow/ directory, its own config keys)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "own-snakefile"
MARK = "# waypost"


def _copy(dest: Path, with_waypost: bool) -> Path:
    shutil.copytree(EXAMPLE, dest)
    if not with_waypost:
        for name in ("Snakefile", "config.yaml"):
            text = (dest / name).read_text()
            (dest / name).write_text("".join(line for line in text.splitlines(keepends=True) if not line.rstrip().endswith(MARK)))
    return dest


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=workdir,
                          capture_output=True, text=True, timeout=300)


def _files(workdir: Path) -> dict[str, str]:
    """The pipeline's outputs (not Snakemake's or waypost's own files)."""
    return {str(p.relative_to(workdir)): p.read_text() for top in ("out", "raw")
            for p in sorted((workdir / top).rglob("*")) if p.is_file() and p.name != ".snakemake_timestamp"}


def _jobs(dry_run: subprocess.CompletedProcess) -> dict[str, int]:
    """rule → jobs, from a dry run's job stats."""
    assert dry_run.returncode == 0, dry_run.stderr[-3000:]
    text = dry_run.stdout + dry_run.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:", 1)[1]
    return {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)$", table, re.M) if rule != "total"}


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("own")
    plain, wp = _copy(base / "plain", False), _copy(base / "wp", True)
    added = [line for line in (wp / "Snakefile").read_text().splitlines() if line.endswith(MARK)]
    assert len(added) == 3, added   # the import, Pipeline(config, workflow), finish()
    assert _jobs(_snakemake(plain, "-n")) == _jobs(_snakemake(wp, "-n"))
    for workdir in (plain, wp):
        ran = _snakemake(workdir)
        assert ran.returncode == 0, ran.stderr[-3000:]
    return plain, wp


def test_the_same_jobs_and_files_as_plain_snakemake(both):
    plain, wp = both
    assert _files(wp) == _files(plain)
    assert "out/de/model.bin" in _files(plain) and "out/fr/parts/part.1.ref" in _files(plain)
    assert not (wp / "out" / "de" / "scored").exists() or not any((wp / "out" / "de" / "scored").iterdir())  # temp()
    assert _jobs(_snakemake(plain, "-n")) == _jobs(_snakemake(wp, "-n")) == {}


def test_a_later_run_after_deleted_and_touched_files_redoes_what_plain_snakemake_redoes(both, tmp_path):
    plain, wp = (shutil.copytree(d, tmp_path / d.name, symlinks=True) for d in both)
    for workdir in (plain, wp):
        (workdir / "out" / "fr" / "model.yml").unlink()    # one of a multiext's outputs
        (workdir / "out" / "de" / "clean.txt").unlink()    # an intermediate whose consumers are done
        (workdir / "raw" / "fr.txt").touch()               # newer, but read as ancient()
    redo = _jobs(_snakemake(plain, "-n"))
    assert redo == {"train": 1, "all": 1}
    assert _jobs(_snakemake(wp, "-n")) == redo
    # Asked for by name, the deleted intermediate's job runs alone, as in plain Snakemake.
    asked = _jobs(_snakemake(plain, "-n", "out/de/clean.txt"))
    assert asked and _jobs(_snakemake(wp, "-n", "out/de/clean.txt")) == asked


def test_waypost_commands_find_the_snakefile_and_config_where_the_pipeline_keeps_them(tmp_path):
    wp = _copy(tmp_path / "wp", True)
    cli = [sys.executable, "-m", "waypost.cli"]
    ran = subprocess.run([*cli, "run", "--config", "config.yaml"], cwd=wp, capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert (wp / "out" / "report.txt").read_text().split() == ["out/de/clean.txt", "out/fr/clean.txt"]
    plan = subprocess.run([*cli, "plan", "--config", "config.yaml"], cwd=wp, capture_output=True, text=True,
                          timeout=300)
    assert plan.returncode == 0 and "nothing to do" in plan.stdout, plan.stdout + plan.stderr
    # Without --config: the config file the Snakefile's configfile: names, as snakemake reads it.
    status = subprocess.run([*cli, "status"], cwd=wp, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0 and "experiment baseline  (root results)" in status.stdout, status.stderr


def test_the_pipeline_keeps_its_own_config_keys_and_a_key_near_a_waypost_key_is_one_line(tmp_path):
    """A key that looks like one of waypost's may be the pipeline's own
    (the translation pipeline's ``experiment:``): kept, and said once."""
    wp = _copy(tmp_path / "wp", True)
    config = wp / "config.yaml"
    config.write_text(config.read_text() + "experiment: mine\n")
    ran = _snakemake(wp, "-n")
    assert ran.returncode == 0, ran.stderr[-3000:]
    said = ran.stdout + ran.stderr
    assert "waypost: config.yaml: experiment: taken as the pipeline's own key, not waypost's 'experiments' " \
        "(if you meant 'experiments', rename it; waypost's keys under `waypost:` never meet the pipeline's)" in said
    assert "Traceback" not in said


def _on_slurm_as_plain_locally(wp: Path, plain: Path) -> None:
    """Run the example in ``wp`` with the shipped onprem profile: it ends
    well, with the files of plain Snakemake's local run in ``plain``."""
    from conftest import REPO
    # (--cores: threads: workflow.cores asks for it under any cluster executor, as in plain Snakemake)
    fast = ["--cores", "2", "--waypost-init-seconds-before-status-checks", "1", "--latency-wait", "5",
            "--waypost-no-account"]
    ran = subprocess.run([sys.executable, "-m", "snakemake", "--profile", str(REPO / "profiles" / "onprem"), *fast],
                         cwd=wp, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert _files(wp) == _files(plain)


def test_on_slurm_with_the_onprem_profile_the_same_files_as_plain_snakemake_locally(both, slurm_cluster, tmp_path):
    plain, _ = both
    wp = _copy(tmp_path / "wp", True)
    _on_slurm_as_plain_locally(wp, plain)
    # Slurm ran them, the gpu=1 rule on the GPU partition (workers.yaml's assign), the rest on cpu.
    rows = [line.split("|") for line in subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", "now-1hour", "-o", "Partition,Comment,WorkDir"],
        capture_output=True, text=True, check=True).stdout.splitlines() if line.endswith(f"|{wp}")]
    partitions = {}
    for partition, comment, _ in rows:
        rule = comment.removeprefix("rule_").rsplit("_wildcards_", 1)[0]
        partitions.setdefault(rule, set()).add(partition)
    assert partitions["train"] == {"gpu-v100"} and partitions["clean"] == {"cpu"}, rows
    # Each shell: rule's job kept its record, its attempt run in a Slurm job of the cpu class.
    import json
    record = json.loads((wp / "results/_all/baseline/clean/de/_manifest.json").read_text())
    attempt = record["attempts"][-1]
    assert record["state"] == "SUCCESS" and record["wildcards"] == {"lang": "de"}, record
    assert attempt["scheduler_job_id"] and attempt["worker"]["class"] == "cpu", attempt
    assert _jobs(_snakemake(wp, "-n")) == {}


def _on_a_bucket(wp: Path, bucket: str) -> str:
    """Make the copy ``wp`` run over a gs:// root in ``bucket``: its root."""
    root = f"{bucket}/results"
    text = (wp / "config.yaml").read_text().replace("root: results  # waypost", f"root: {root}  # waypost")
    (wp / "config.yaml").write_text(text)
    return root


def _bucket_files(root: str) -> dict[str, str]:
    from conftest import gcs_fs, gcs_key, gcs_objects
    gcs_fs().invalidate_cache()
    return {name: gcs_fs().cat_file(f"{gcs_key(root)}/{name}").decode() for name in sorted(gcs_objects(root))
            if name.split("/")[0] in ("out", "raw") and not name.endswith(".snakemake_timestamp")}


def test_on_a_gs_root_the_bucket_holds_plain_snakemakes_files_and_every_job_its_record(both, bucket, tmp_path):
    """Checkpoints, glob_wildcards over their directory, a params function
    reading an input, run: and script: rules, touch(), temp(), protected():
    the files in the bucket are plain Snakemake's on disk."""
    import json

    from conftest import gcs_flags, gcs_fs, gcs_key
    plain, _ = both
    wp = _copy(tmp_path / "wp", True)
    root = _on_a_bucket(wp, bucket)
    ran = _snakemake(wp, *gcs_flags(root))
    assert ran.returncode == 0, ran.stderr[-3000:]
    found, expected = _bucket_files(root), {n: t for n, t in _files(plain).items() if "/scored/" not in n}
    # (the report lists its inputs' paths: here their local copies, as with any storage plugin)
    report, plain_report = found.pop("out/report.txt").splitlines(), expected.pop("out/report.txt").splitlines()
    assert len(report) == len(plain_report) and all(a.endswith("/results/" + b) for a, b in zip(report, plain_report))
    assert found == expected
    assert not (wp / "out").exists()
    for rule, job in (("clean", "de"), ("train", "fr"), ("report", None), ("score", "fr__2")):
        where = f"{gcs_key(root)}/_all/baseline/{rule}" + (f"/{job}" if job else "")
        assert json.loads(gcs_fs().cat_file(f"{where}/_manifest.json"))["state"] == "SUCCESS", where
    assert _jobs(_snakemake(wp, *gcs_flags(root), "-n")) == {}


def test_on_slurm_on_a_gs_root_the_bucket_holds_plain_snakemakes_files(both, slurm_cluster, bucket, tmp_path):
    """The onprem profile with the two storage settings of a gs:// root, the
    cpu class bundled: each job's runner, in its Slurm job (four to a job,
    run straight), fetches its inputs and stores its outputs and record in
    the bucket."""

    import yaml
    from conftest import REPO, gcs_flags
    plain, _ = both
    wp = _copy(tmp_path / "wp", True)
    root = _on_a_bucket(wp, bucket)
    workers = yaml.safe_load((wp / "workers.yaml").read_text())
    workers["pools"]["onprem"]["classes"]["cpu"]["bundle"] = 4
    (wp / "workers.yaml").write_text(yaml.safe_dump(workers))
    fast = ["--cores", "2", "--waypost-init-seconds-before-status-checks", "1", "--latency-wait", "5",
            "--waypost-no-account", *gcs_flags(root)]
    ran = subprocess.run([sys.executable, "-m", "snakemake", "--profile", str(REPO / "profiles" / "onprem"), *fast],
                         cwd=wp, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    found = _bucket_files(root)
    expected = {n: t for n, t in _files(plain).items() if "/scored/" not in n and n != "out/report.txt"}
    assert {n: t for n, t in found.items() if n != "out/report.txt"} == expected
    from conftest import gcs_manifests
    records = {name.removeprefix("_all/baseline/"): r for name, r in gcs_manifests(root).items()}
    assert len(records) >= 16 and all(r["state"] == "SUCCESS" for r in records.values()), records
    cpu = {name: r["attempts"][-1]["scheduler_job_id"] for name, r in records.items()
           if r["attempts"][-1]["worker"]["class"] == "cpu" and not name.startswith("fetch/")}
    assert len(cpu) >= 12 and all(cpu.values()), cpu
    assert len(set(cpu.values())) < len(cpu), cpu        # bundled: fewer Slurm jobs than jobs
    assert _jobs(_snakemake(wp, *gcs_flags(root), "-n")) == {}


def test_on_slurm_a_bundled_class_runs_several_of_its_jobs_in_one_slurm_job(both, slurm_cluster, tmp_path):
    # `bundle: 4` on the cpu class: the jobs of rules in their own layout
    # that need no Snakemake process of their own (no conda: in effect, no
    # benchmark, no protected() output) run their steps straight, four to
    # a Slurm job, and their runner makes the directories Snakemake would
    # (score's out/{lang}/scored/); fetch's protected() output keeps its
    # job's own Snakemake process. The files are plain Snakemake's.
    import json

    import yaml
    plain, _ = both
    wp = _copy(tmp_path / "wp", True)
    workers = yaml.safe_load((wp / "workers.yaml").read_text())
    workers["pools"]["onprem"]["classes"]["cpu"]["bundle"] = 4
    (wp / "workers.yaml").write_text(yaml.safe_dump(workers))
    _on_slurm_as_plain_locally(wp, plain)
    records = {str(path.parent.relative_to(wp / "results/_all/baseline")): json.loads(path.read_text())
               for path in (wp / "results/_all/baseline").rglob("_manifest.json")}
    assert all(r["state"] == "SUCCESS" for r in records.values()), records
    cpu = {name: r["attempts"][-1]["scheduler_job_id"] for name, r in records.items()
           if r["attempts"][-1]["worker"]["class"] == "cpu" and not name.startswith("fetch/")}
    assert len(cpu) >= 12 and all(cpu.values()), cpu
    assert len(set(cpu.values())) < len(cpu), cpu        # bundled: fewer Slurm jobs than jobs
    fetched = {r["attempts"][-1]["scheduler_job_id"] for name, r in records.items() if name.startswith("fetch/")}
    assert len(fetched) == 2 and not fetched & set(cpu.values())   # a Snakemake process each
    assert _jobs(_snakemake(wp, "-n")) == {}
