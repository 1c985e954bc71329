# benchmarks/checkpoints/Snakefile as plain Snakemake: the baseline of the
# checkpoint benchmark (benchmarks/bench_checkpoints.py).
#
# Same rules, wildcards, paths, inputs, outputs and commands, written the way
# a plain Snakemake user would: the parts found with `checkpoints.chunk.get`
# and `glob_wildcards`, instance names (`000-t0`) matched by wildcard regexes,
# the local pool's resources written out, `rule all` over the final outputs.

import os

ROOT = config.get("root", "results")
EXPERIMENTS = config["experiments"]
TEACHERS = ["t0", "t1"]
NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
CPU = dict(cpus_per_task=1, mem_mb=1000, runtime=60)

wildcard_constraints:
    site=NAME,
    experiment=NAME,
    part=r"\d+",
    teacher=r"t\d+",


def d(stage):
    return ROOT + "/{site}/{experiment}/" + stage


def final_outputs(wildcards):
    outputs = []
    for experiment, exp in EXPERIMENTS.items():
        for site in exp["sites"]:
            at = dict(site=site, experiment=experiment)
            outputs += [(d("train") + "/{teacher}/model.txt").format(teacher=t, **at) for t in TEACHERS]
            outputs += [(d("per_teacher") + "/{teacher}/all.txt").format(teacher=t, **at) for t in TEACHERS]
            outputs.append((d("tally") + "/total.txt").format(**at))
    return outputs


rule all:
    default_target: True
    input: final_outputs


rule train:
    output: model=d("train") + "/{teacher}/model.txt"
    resources: **CPU
    shell: "echo {wildcards.teacher} > {output.model}"


checkpoint chunk:
    input: readings="readings/{site}.txt"
    output: chunks=directory(d("chunk") + "/chunks")
    resources: **CPU
    shell: "mkdir -p {output.chunks} && split -l 3 -d -a 3 --additional-suffix=.csv {input.readings} {output.chunks}/c"


rule measure:
    input: chunk=d("chunk") + "/chunks/c{part}.csv", model=d("train") + "/{teacher}/model.txt"
    output: out=d("measure") + "/{part}-{teacher}/out.txt"
    resources: **CPU
    shell: "cat {input.model} {input.chunk} > {output.out}"


def parts(wildcards):
    chunks = checkpoints.chunk.get(site=wildcards.site, experiment=wildcards.experiment).output.chunks
    return sorted(glob_wildcards(os.path.join(chunks, "c{part}.csv")).part)


def measured(wildcards, teachers):
    pattern = d("measure") + "/{part}-{teacher}/out.txt"
    return [pattern.format(part=part, teacher=teacher, site=wildcards.site, experiment=wildcards.experiment)
            for part in parts(wildcards) for teacher in teachers]


rule per_teacher:
    input: outs=lambda wildcards: measured(wildcards, [wildcards.teacher])
    output: out=d("per_teacher") + "/{teacher}/all.txt"
    resources: **CPU
    shell: "cat {input.outs} > {output.out}"


rule tally:
    input: outs=lambda wildcards: measured(wildcards, TEACHERS)
    output: out=d("tally") + "/total.txt"
    resources: **CPU
    shell: "cat {input.outs} > {output.out}"
