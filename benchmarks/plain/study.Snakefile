# The parameter study of examples/param-study written as plain Snakemake, for
# the planning benchmark (benchmarks/bench_study_planning.py): the same grid
# from the same config, the same three rules, commands and paths, and the
# same resources (those waypost's local pool gives the rules' worker
# classes, config/workers.yaml: cpu-large for simulate, cpu for the others),
# so both ask the executor for the same jobs; the benchmark checks that the
# dry runs print the same resources for every rule.
import itertools

GRID = config["experiments"]["sweep"]["grid"]


def axis(spec):
    if isinstance(spec, dict):
        step = (spec["to"] - spec["from"]) / (spec["count"] - 1)
        return [round(spec["from"] + i * step, 10) for i in range(spec["count"])]
    return list(spec)


def name(value):
    return f"{value:g}" if isinstance(value, float) else str(value)


POINTS = {"-".join(f"{k}{name(v)}" for k, v in zip(GRID, values)): dict(zip(GRID, values))
          for values in itertools.product(*(axis(s) for s in GRID.values()))}
ROOT = "results/_all/sweep"
SETTINGS = config["stages"]["simulate"]

wildcard_constraints:
    point=r"[A-Za-z0-9._-]+",


rule all:
    default_target: True
    input: f"{ROOT}/summary_report/summary.md"


rule simulate:
    output: result=ROOT + "/simulate/{point}/result.json"
    resources: cpus_per_task=2, runtime=240, mem_mb=4000
    params:
        alpha=lambda wc: POINTS[wc.point]["alpha"], cells=lambda wc: POINTS[wc.point]["cells"],
        t_end=SETTINGS.get("t_end", 0.1), every=SETTINGS.get("checkpoint_every", 1000),
    shell:
        "python " + workflow.basedir + "/../scripts/simulate.py --alpha {params.alpha} --cells {params.cells}"
        " --t-end {params.t_end} --checkpoint-every {params.every} --checkpoint-dir $(dirname {output.result})/checkpoints"
        " --output {output.result}"


rule data_extract:
    input: simulation=ROOT + "/simulate/{point}/result.json"
    output: extract=ROOT + "/data_extract/{point}/extract.json"
    resources: cpus_per_task=1, runtime=60, mem_mb=1000
    shell: "python " + workflow.basedir + "/../scripts/extract.py --simulation {input.simulation}"
           " --instance {wildcards.point} --output {output.extract}"


rule summary_report:
    input: extracts=expand(ROOT + "/data_extract/{point}/extract.json", point=POINTS)
    output: summary=ROOT + "/summary_report/summary.md"
    resources: cpus_per_task=1, runtime=60, mem_mb=1000
    shell: "python " + workflow.basedir + "/../scripts/summarize.py {input.extracts} --output {output.summary}"
