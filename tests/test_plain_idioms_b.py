"""Plain Snakemake idioms in a waypost Snakefile, side by side with plain
Snakemake: params functions that read ``input`` see a job's inputs whether
or not waypost found the job done; an unnamed ``wp.each`` input; a
constraint on ``wp.parts``' name, as ``glob_wildcards`` takes one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_series import tiny_pipeline

# Each params function notes what it saw (rule, wildcards, inputs) in seen.log.
SEEN = '''
import os


def noted(rule, value):
    def function(wildcards, input):
        with open("seen.log", "a") as log:
            log.write(f"{rule} {' '.join(sorted(map(str, input)))} -> {value(input)}\\n")
        return value(input)
    return function


first_name = lambda input: input[0].rsplit("/", 1)[-1].rsplit(".", 1)[0]
'''

STAGED = SEEN + '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


rule harvest:
    output: grains=wp.out("grains.txt")
    shell: "printf 'oat\\\\nrye\\\\n' > {output.grains}"


rule mill:
    input: grains=wp.stage("harvest", "grains.txt")
    output: flour=wp.out("flour.txt")
    params: n=noted("mill", len), stem=noted("mill", first_name)
    shell: "echo {params.n} {params.stem} > {output.flour}"


rule bake:
    input: flour=wp.stage("mill", "flour.txt"), grains=wp.stage("harvest", "grains.txt")
    output: bread=wp.out("bread.txt")
    params: n=noted("bake", len), stem=noted("bake", first_name)
    resources: units=noted("bake resources", len)
    shell: "cat {input.flour} > {output.bread}; echo {params.n} {params.stem} >> {output.bread}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''

# The same rules in plain Snakemake, with the paths waypost gives them.
D = "out/_all/field"
PLAIN = SEEN + f'''
rule all:
    input: "{D}/bake/bread.txt"


rule harvest:
    output: grains="{D}/harvest/grains.txt"
    shell: "printf 'oat\\\\nrye\\\\n' > {{output.grains}}"


rule mill:
    input: grains="{D}/harvest/grains.txt"
    output: flour="{D}/mill/flour.txt"
    params: n=noted("mill", len), stem=noted("mill", first_name)
    shell: "echo {{params.n}} {{params.stem}} > {{output.flour}}"


rule bake:
    input: flour="{D}/mill/flour.txt", grains="{D}/harvest/grains.txt"
    output: bread="{D}/bake/bread.txt"
    params: n=noted("bake", len), stem=noted("bake", first_name)
    resources: units=noted("bake resources", len)
    shell: "cat {{input.flour}} > {{output.bread}}; echo {{params.n}} {{params.stem}} >> {{output.bread}}"
'''


def plain_snakemake(workdir: Path, snakefile: str):
    """Plain Snakemake (no waypost, no profile) on a Snakefile of the test's own in ``workdir``."""
    workdir.mkdir(exist_ok=True)
    (workdir / "Snakefile").write_text(snakefile)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=workdir,
                              capture_output=True, text=True, timeout=300)
    return run


def seen(workdir: Path) -> set[str]:
    """What the params functions saw since last asked."""
    log = workdir / "seen.log"
    lines = set(log.read_text().splitlines()) if log.exists() else set()
    log.unlink(missing_ok=True)
    return lines


def test_params_functions_see_a_done_jobs_inputs_as_in_plain_snakemake(tmp_path: Path):
    (tmp_path / "wp").mkdir()
    staged = tiny_pipeline(tmp_path / "wp", STAGED, {"root": "out", "experiments": {"field": {}}})
    plain = plain_snakemake(tmp_path / "plain", PLAIN)
    bread = f"{D}/bake/bread.txt"
    ran = {}
    for name, run, work in (("waypost", staged, tmp_path / "wp"), ("plain", plain, tmp_path / "plain")):
        first = run()
        assert first.returncode == 0, first.stderr[-3000:]
        flour = (work / D / "mill" / "flour.txt").read_text()
        again = run(bread)   # every job done, the last one asked for: in the DAG
        assert again.returncode == 0, again.stderr[-3000:]
        (work / D / "mill" / "flour.txt").unlink()   # a middle output gone
        third = run(bread)
        assert third.returncode == 0, third.stderr[-3000:]
        # What each params function saw, every time it was asked, and what
        # it made of it: a done job's functions see its inputs all the same.
        ran[name] = seen(work), (work / bread).read_text(), flour
    assert ran["waypost"] == ran["plain"]
    assert ran["plain"][1] == "1 grains\n2 flour\n"
    assert any(line.startswith("bake resources out/") for line in ran["plain"][0])
    # asked for the last output only, neither remade the middle one; asked
    # for everything, waypost redoes it (presence mode), with the same params
    assert not (tmp_path / "plain" / D / "mill" / "flour.txt").exists()
    assert not (tmp_path / "wp" / D / "mill" / "flour.txt").exists()
    last = staged()
    assert last.returncode == 0, last.stderr[-3000:]
    assert (tmp_path / "wp" / D / "mill" / "flour.txt").read_text() == ran["plain"][2]
    assert seen(tmp_path / "wp") <= ran["plain"][0]


UNNAMED = '''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


rule sketch:
    output: wp.out("sketch.txt", instances=["ink", "chalk", "coal"])
    shell: "echo {wildcards.instance} > {output}"


rule album:
    input: wp.each("sketch", "sketch.txt"), wp.stage("cover", "cover.txt")
    output: wp.out("album.txt")
    shell: "cat {input} > {output}; echo {input[0]} >> {output}"


rule catalogue:
    input: sheets=[wp.each("sketch", "sketch.txt"), wp.stage("cover", "cover.txt")]
    output: wp.out("catalogue.txt")
    shell: "cat {input.sheets} > {output}; echo {input.sheets[0]} >> {output}"


rule cover:
    output: wp.out("cover.txt")
    shell: "echo cover > {output}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def test_an_unnamed_each_input_is_every_instance_as_a_named_one_is(tmp_path: Path):
    run = tiny_pipeline(tmp_path, UNNAMED, {"root": "out", "experiments": {"gallery": {}}})
    first = run()
    assert first.returncode == 0, first.stderr[-3000:]
    made = "ink\nchalk\ncoal\ncover\nout/_all/gallery/sketch/ink/sketch.txt\n"
    # unnamed, or a named list with wp.each in it: the instances in their order, as one named gets them
    assert (tmp_path / "out/_all/gallery/album/album.txt").read_text() == made
    assert (tmp_path / "out/_all/gallery/catalogue/catalogue.txt").read_text() == made
    # done: the rule's unnamed inputs left out in presence mode, and asked again
    again = run("out/_all/gallery/album/album.txt")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr


# A checkpoint leaves reference files beside its parts: only the numbered parts are parts.
SHARDS = r'''
from waypost.snakemake import Pipeline
wp = Pipeline(config, workflow)


checkpoint shard:
    output: shards=directory(wp.out("shards"))
    shell: "mkdir -p {output.shards} && cd {output.shards} && for i in 07 08 09; do echo line$i > rec.$i; echo ref > rec.$i.ref; done; echo x > rec.top"


rule weigh:
    input: shard=wp.stage("shard", "shards/rec.{part}")
    output: weight=wp.out("weight.txt", instances=wp.parts("shard", PATTERN))
    shell: "wc -c < {input.shard} > {output.weight}"


rule scale:
    input: weights=wp.each("weigh", "weight.txt")
    output: total=wp.out("total.txt")
    shell: "cat {input.weights} > {output.total}"


wp.finish()

rule all:
    default_target: True
    input: wp.targets
'''


def glob_parts(directory: Path, pattern: str) -> list[str]:
    """What Snakemake's ``glob_wildcards`` finds in ``directory`` for ``pattern``."""
    found = subprocess.run([sys.executable, "-c", "import sys; from snakemake.io import glob_wildcards; "
                            "print(' '.join(sorted(glob_wildcards(sys.argv[1]).part)))",
                            str(directory / pattern)], capture_output=True, text=True, check=True)
    return found.stdout.split()


def test_parts_take_a_wildcard_constraint_as_glob_wildcards_does(tmp_path: Path):
    for name, pattern in (("numbered", r"shards/rec.{part,\d+}"), ("any", "shards/rec.{part}")):
        work = tmp_path / name
        work.mkdir()
        run = tiny_pipeline(work, SHARDS.replace("PATTERN", repr(pattern)),
                            {"root": "out", "experiments": {"ledger": {}}})
        done = run()
        assert done.returncode == 0, done.stderr[-3000:]
        stage = work / "out/_all/ledger"
        parts = sorted(p.name for p in (stage / "weigh").iterdir() if p.is_dir() and not p.name.startswith("_"))
        assert parts == glob_parts(stage / "shard", pattern)
        if name == "numbered":
            assert parts == ["07", "08", "09"]
            assert (stage / "scale/total.txt").read_text() == "7\n7\n7\n"
        else:   # unconstrained, as before: every file after the prefix is a part
            assert parts == ["07", "07.ref", "08", "08.ref", "09", "09.ref", "top"]
