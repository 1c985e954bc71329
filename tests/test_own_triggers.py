"""Edits never go stale without a word: a rule in its own layout keeps
Snakemake's rerun triggers under waypost's shipped profile (the same jobs
rerun as in plain Snakemake, side by side, after a changed param, shell
command, script, set of inputs, or a script outside the root the command
calls), its record keeps what those triggers compare, and ``waypost plan``
names each difference as drift; in presence mode nothing reruns, and
``plan`` still names it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import LOCAL_PROFILE

MARK = "# waypost"

SNAKEFILE = textwrap.dedent("""\
    configfile: "config.yaml"
    from waypost.snakemake import Pipeline  # waypost
    wp = Pipeline(config, workflow)  # waypost

    SAMPLES = ["a", "b"]

    rule all:
        input: "summary/report.txt"

    rule fit:
        input: "data/{s}.txt"
        output: "out/{s}/fit.txt"
        params: fdr=config["model"]["fdr"]
        shell: "cat {input} > {output}; echo fdr={params.fdr} >> {output}"

    rule score:
        input: rules.fit.output
        output: "out/{s}/score.txt"
        script: "scripts/score.py"

    rule train:
        input: sh="train.sh", data="data/{s}.txt"
        output: "out/{s}/model.txt"
        shell: "bash {input.sh} {input.data} > {output}"

    rule report:
        input: expand("out/{s}/score.txt", s=SAMPLES), expand("out/{s}/model.txt", s=SAMPLES)
        output: "summary/report.txt"
        shell: "cat {input} > {output}"

    wp.finish()  # waypost
    """)
SCORE = "open(snakemake.output[0], 'w').write(open(snakemake.input[0]).read().upper())\n"
TRAIN = 'echo "trained on $(wc -l < "$1") lines"\n'
CONFIG = {"model": {"fdr": 0.05}, "root": "records", "experiments": {"trial": {}}}


def _write(workdir: Path, with_waypost: bool, config: dict) -> Path:
    keep = (lambda line: True) if with_waypost else (lambda line: not line.rstrip().endswith(MARK))
    (workdir / "data").mkdir(parents=True)
    (workdir / "scripts").mkdir()
    (workdir / "Snakefile").write_text("".join(line for line in SNAKEFILE.splitlines(keepends=True) if keep(line)))
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (workdir / "scripts" / "score.py").write_text(SCORE)
    (workdir / "train.sh").write_text(TRAIN)
    for name in ("a", "b", "extra"):
        (workdir / "data" / f"{name}.txt").write_text(f"{name}\n")
    return workdir


def _snakemake(workdir: Path, *args: str, plain: bool) -> subprocess.CompletedProcess:
    """Plain Snakemake as it comes (no profile), waypost with its shipped local profile."""
    profile = [] if plain else ["--profile", str(LOCAL_PROFILE)]
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *profile, *args], cwd=workdir,
                          capture_output=True, text=True, timeout=300)


def _planned(workdir: Path, plain: bool) -> dict[str, int]:
    """rule → jobs of a dry run, from its job stats."""
    dry = _snakemake(workdir, "-n", plain=plain)
    assert dry.returncode == 0, dry.stderr[-3000:]
    text = dry.stdout + dry.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:", 1)[1]
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", table, re.M) if rule not in ("total", "all")}


def _drift(workdir: Path) -> dict[str, list[str]]:
    """``waypost plan``'s drift: job (rule, and its wildcards) → what differs."""
    done = subprocess.run([sys.executable, "-m", "waypost.cli", "plan", "--config", "config.yaml", "--profile",
                           str(LOCAL_PROFILE), "--json"], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return {row["stage"] + (f"[{row['instance']}]" if row["instance"] else ""): row["what"]
            for row in json.loads(done.stdout)["drift"]}


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, Path]:
    """Plain Snakemake, waypost, and waypost in presence mode, each after a full run."""
    base = tmp_path_factory.mktemp("triggers")
    dirs = {"plain": _write(base / "plain", False, CONFIG), "wp": _write(base / "wp", True, CONFIG),
            "presence": _write(base / "presence", True, {**CONFIG, "rerun_policy": "presence"})}
    for name, workdir in dirs.items():
        done = _snakemake(workdir, plain=name == "plain")
        assert done.returncode == 0, done.stderr[-3000:]
    return dirs


def _edit_params(workdir: Path) -> None:
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["model"]["fdr"] = 0.1
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def _edit_command(workdir: Path) -> None:
    path = workdir / "Snakefile"
    path.write_text(path.read_text().replace('"bash {input.sh}', '"bash -e {input.sh}'))


def _edit_script(workdir: Path) -> None:
    (workdir / "scripts" / "score.py").write_text("# louder\n" + SCORE)


def _add_input(workdir: Path) -> None:
    path = workdir / "Snakefile"
    path.write_text(path.read_text().replace('s=SAMPLES), expand("out/{s}/model.txt", s=SAMPLES)',
                                             's=SAMPLES), expand("out/{s}/model.txt", s=SAMPLES), "data/extra.txt"'))


def _edit_outside(workdir: Path) -> None:
    (workdir / "train.sh").write_text(TRAIN.replace("trained on", "trained well on"))


# edit → (the jobs plain Snakemake reruns, waypost plan's drift: job → a line it names)
EDITS = {
    "params": (_edit_params, {"fit": 2, "score": 2, "report": 1},
               {"fit[a]": "params: 0.05 → 0.1", "fit[b]": "params: 0.05 → 0.1"}),
    "shell command": (_edit_command, {"train": 2, "report": 1},
                      {"train[a]": "code: the shell command changed", "train[b]": "code: the shell command changed"}),
    "script": (_edit_script, {"score": 2, "report": 1},
               {"score[a]": "code: script scripts/score.py changed",
                "score[b]": "code: script scripts/score.py changed"}),
    "added input": (_add_input, {"report": 1}, {"report": "inputs: added data/extra.txt"}),
    "outside input": (_edit_outside, {"train": 2, "report": 1},
                      {"train[a]": "input edited since: train.sh (content changed",
                       "train[b]": "input edited since: train.sh (content changed"}),
}


def _copies(ran: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """The finished runs, copied with their times (and Snakemake's metadata)."""
    return {name: Path(shutil.copytree(workdir, tmp_path / name, symlinks=True)) for name, workdir in ran.items()}


def _says(drift: dict[str, list[str]], expected: dict[str, str]) -> None:
    """``drift`` names each expected job with its line; any other job it
    names was made from one of them (``inputdrift``: what was made from an
    edited input, where the records link a job's inputs to their makers)."""
    assert set(expected) <= set(drift), drift
    for job in set(drift) - set(expected):
        assert all(line.startswith("made from an edited input") for line in drift[job]), (job, drift[job])
    for job, words in expected.items():
        assert any(line.startswith(words) for line in drift[job]), (job, drift[job])


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edit_reruns_what_plain_snakemake_reruns_and_plan_names_it(ran, tmp_path, edit):
    change, reruns, drift = EDITS[edit]
    dirs = _copies(ran, tmp_path)
    for workdir in dirs.values():
        change(workdir)
    assert _planned(dirs["plain"], plain=True) == reruns
    assert _planned(dirs["wp"], plain=False) == reruns
    _says(_drift(dirs["wp"]), drift)
    # presence mode: nothing reruns, and plan says what differs
    assert _planned(dirs["presence"], plain=False) == {}
    _says(_drift(dirs["presence"]), drift)


def test_a_run_after_an_edit_leaves_no_drift(ran, tmp_path):
    """The jobs that ran again keep what they ran with: plan is quiet after."""
    dirs = _copies(ran, tmp_path)
    _edit_params(dirs["wp"])
    _edit_script(dirs["wp"])
    done = _snakemake(dirs["wp"], plain=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _drift(dirs["wp"]) == {}
    assert _planned(dirs["wp"], plain=False) == {}


def test_the_record_keeps_what_the_triggers_compare(ran):
    manifest = json.loads((ran["wp"] / "records" / "_all" / "trial" / "fit" / "a" / "_manifest.json").read_text())
    assert manifest["triggers"]["params"] == ["0.05"]
    assert set(manifest["triggers"]["code"]) == {"shell"}
    assert manifest["triggers"]["inputs"] == ["data/a.txt"]
    score = json.loads((ran["wp"] / "records" / "_all" / "trial" / "score" / "a" / "_manifest.json").read_text())
    assert score["triggers"]["code"]["script"] == "scripts/score.py"
    train = json.loads((ran["wp"] / "records" / "_all" / "trial" / "train" / "a" / "_manifest.json").read_text())
    assert {i["path"]: bool(i.get("fingerprint")) for i in train["inputs"]} == {"train.sh": True, "data/a.txt": True}


def test_rerun_drifted_redoes_in_presence_mode_what_plain_snakemake_would(ran, tmp_path):
    """Issue 56: in presence mode an edit reruns nothing; ``waypost rerun
    --drifted`` archives the jobs ``plan`` names (their records and
    outputs), and the next run makes them again with the edit, as plain
    Snakemake's run after the edit does, and leaves no drift."""
    dirs = _copies(ran, tmp_path)
    workdir = dirs["presence"]
    _edit_params(workdir)
    rerun = subprocess.run([sys.executable, "-m", "waypost.cli", "rerun", "--drifted", "--downstream", "--config",
                            "config.yaml", "--profile", str(LOCAL_PROFILE)], cwd=workdir, capture_output=True,
                           text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr[-3000:]
    assert "drifted: params: 0.05 → 0.1" in rerun.stdout, rerun.stdout
    assert _planned(workdir, plain=False) == {"fit": 2, "score": 2, "report": 1}
    done = _snakemake(workdir, plain=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (workdir / "out" / "a" / "fit.txt").read_text() == "a\nfdr=0.1\n"
    assert _drift(workdir) == {}
