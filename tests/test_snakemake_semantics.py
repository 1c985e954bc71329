"""Snakemake's own semantics, kept with waypost's three lines added to a
Snakefile, each side by side with plain Snakemake on a small workflow
modelled on Snakemake's own test of it (its sdist's ``tests/``): the params
a command, script or block sees (``{params}`` formatted whole), an
``update()`` output updated in place (test_update_flag), ``directory()``
outputs and links to directories (test_directory), and which rule makes a
file two rules can make, in presence mode (Snakemake's candidates whose
inputs it can't find drop out)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

WAYPOST_HEAD = "from waypost.snakemake import Pipeline\nwp = Pipeline(config, workflow)\n"
WAYPOST_TAIL = "\nwp.finish()\n"


def _both(tmp_path: Path, snakefile: str, config: dict | None = None) -> tuple[Path, Path]:
    """The same workflow twice: plain, and with waypost's three lines (its
    config: a root and one experiment, and ``config``)."""
    plain, wp = tmp_path / "plain", tmp_path / "wp"
    for workdir in (plain, wp):
        workdir.mkdir()
    (plain / "Snakefile").write_text(snakefile)
    (wp / "Snakefile").write_text('configfile: "config.yaml"\n' + WAYPOST_HEAD + snakefile + WAYPOST_TAIL)
    (wp / "config.yaml").write_text(json.dumps({"root": "rec", "experiments": {"x": {}}, **(config or {})}))
    return plain, wp


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=workdir,
                          capture_output=True, text=True, timeout=300)


def _ran(workdir: Path, *args: str) -> str:
    ran = _snakemake(workdir, *args)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stdout + ran.stderr


def _planned(workdir: Path) -> dict[str, int]:
    """rule → jobs a dry run plans (empty: nothing to be done)."""
    text = _ran(workdir, "-n")
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:", 1)[1]
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", table, re.M) if rule != "total"}


PARAMS = '''
rule all:
    input: "out/shell.txt", "out/script.txt", "out/block.txt"

rule by_shell:
    output: "out/shell.txt"
    params: 7, size=4, name="teal"
    message: "params: {params}"
    shell: "echo {params} / {params.size} / {params[0]} > {output}"

rule by_script:
    output: "out/script.txt"
    params: 7, size=4, name="teal"
    script: "show.py"

rule by_block:
    output: "out/block.txt"
    params: 7, size=4, name="teal"
    run:
        with open(output[0], "w") as f:
            print(list(params), dict(params.items()), str(params), file=f)
'''
SHOW = ('with open(snakemake.output[0], "w") as f:\n'
        '    print(list(snakemake.params), dict(snakemake.params.items()), str(snakemake.params), file=f)\n')


def test_the_params_a_command_script_or_block_sees_are_plain_snakemakes(tmp_path):
    """``{params}`` is every param, formatted: none of waypost's among them
    (in the command, and in the rule's ``message:``)."""
    plain, wp = _both(tmp_path, PARAMS)
    said = {}
    for workdir in (plain, wp):
        (workdir / "show.py").write_text(SHOW)
        said[workdir.name] = _ran(workdir)
    files = {name: [(d / "out" / name).read_text() for d in (plain, wp)] for name in ("shell.txt", "script.txt", "block.txt")}
    assert files["shell.txt"][0] == "7 4 teal / 4 / 7\n"
    assert files["block.txt"][0] == "[7, 4, 'teal'] {'size': 4, 'name': 'teal'} 7 4 teal\n"
    for name, (expected, got) in files.items():
        assert got == expected, name
    assert "params: 7 4 teal\n" in said["plain"] and "params: 7 4 teal\n" in said["wp"], said["wp"][-3000:]


UPDATE = '''
rule all:
    input: "out/test.txt"

rule a:
    input: "in.txt"
    output: update("out/test.txt")
    shell: "echo bar >> {output}"
'''


def test_an_update_output_is_updated_where_it_is(tmp_path):
    """Snakemake's test_update_flag: the job appends to the file it updates,
    which is neither removed nor moved away before it runs."""
    plain, wp = _both(tmp_path, UPDATE)
    for workdir in (plain, wp):
        (workdir / "out").mkdir()
        (workdir / "out" / "test.txt").write_text("foo\n")
        (workdir / "in.txt").write_text("in\n")
        _ran(workdir)
    assert (plain / "out" / "test.txt").read_text() == "foo\nbar\n"
    assert (wp / "out" / "test.txt").read_text() == "foo\nbar\n"
    assert not (wp / "rec" / "_all" / "x" / "a" / ".attempts").exists()
    assert _planned(wp) == _planned(plain) == {}


DIRECTORIES = '''
rule all:
    input: "res/after.txt"

rule tree:
    output: directory("res/tree")
    shell: "mkdir -p {output}/sub && echo x > {output}/f && echo y > {output}/sub/g && ln -s f {output}/also_f"

rule linked:
    output: directory("res/link")
    shell: "mkdir -p elsewhere/target && echo z > elsewhere/target/h && ln -s ../elsewhere/target {output}"

rule after:
    input: "res/link", "res/tree"
    output: "res/after.txt"
    shell: "ls {input[0]}/ {input[1]}/ {input[1]}/sub > {output}"
'''


def test_directory_outputs_and_a_link_to_a_directory(tmp_path):
    """Snakemake's test_directory: a ``directory()`` output, and one that
    is a link to a directory: the jobs succeed, their records list the
    files in them, and nothing is to be done after."""
    plain, wp = _both(tmp_path, DIRECTORIES)
    for workdir in (plain, wp):
        _ran(workdir)
    assert (wp / "res" / "after.txt").read_text() == (plain / "res" / "after.txt").read_text()
    assert (wp / "res" / "link").is_symlink()
    records = wp / "rec" / "_all" / "x"
    listed = {rule: sorted(o["path"] for o in json.loads((records / rule / "_manifest.json").read_text())["outputs"])
              for rule in ("tree", "linked")}
    assert listed == {"tree": ["tree/also_f", "tree/f", "tree/sub/g"], "linked": ["link/h"]}
    assert _planned(wp) == _planned(plain) == {}


TWO_MAKERS = '''
rule all:
    input: "res/base/devset.metrics", "res/speed/devset.metrics"

rule train:
    output: "models/{model}/model.bin"
    wildcard_constraints: model="base|big"
    shell: "echo {wildcards.model} > {output}"

rule quantize:
    input: "models/base/model.bin"
    output: "quant/model.bin"
    shell: "cat {input} > {output}"

rule evaluate:
    input: "models/{model}/model.bin"
    output: "res/{model}/{dataset}.metrics"
    shell: "cat {input} > {output}"

rule eval_quantized:
    input: "quant/model.bin"
    output: "res/speed/{dataset}.metrics"
    shell: "echo quantized > {output}"
'''


def test_presence_mode_picks_the_rule_that_makes_a_file_as_plain_snakemake_does(tmp_path):
    """Two rules can make ``res/speed/devset.metrics``; Snakemake drops
    ``evaluate``, whose input ``models/speed/model.bin`` no rule makes. In
    presence mode too, once the file is there (the translation pipeline's
    ``evaluate``/``eval_quantized``), and for a file made before waypost."""
    plain, wp = _both(tmp_path, TWO_MAKERS, {"rerun_policy": "presence"})
    for workdir in (plain, wp):
        _ran(workdir)
    assert (wp / "res" / "speed" / "devset.metrics").read_text() == "quantized\n"
    assert _planned(wp) == _planned(plain) == {}
    (plain / "res" / "base" / "devset.metrics").unlink()
    (wp / "res" / "base" / "devset.metrics").unlink()
    assert _planned(wp) == _planned(plain) == {"evaluate": 1, "all": 1}
    # the same files, made by plain Snakemake, then planned with waypost (no records)
    (plain / "Snakefile").write_text((wp / "Snakefile").read_text())
    (plain / "config.yaml").write_text((wp / "config.yaml").read_text())
    assert _planned(plain) == {"evaluate": 1, "all": 1}
