"""A Snakefile of the user's own (issue 40, item 7): examples/own-snakefile,
a pipeline in plain Snakemake style, with its three ``# waypost`` lines and
without them (removed as tests/test_own_snakefile.py removes them, from the
Snakefile and the config), side by side.

1. **Planning**: a dry run (``-n``) of BENCH_OWN_PLAN_LANGS (default 120)
   languages (the config's ``langs``; 11 jobs each before the checkpoint),
   waypost with ``--profile profiles/local`` against plain Snakemake
   ``--cores 2``. Target: ≤ 1.10× plain.
2. **CPU per job**: full runs of BENCH_OWN_RUN_LANGS (default 4) languages,
   the same two commands; CPU is ``getrusage`` of each run's processes
   (Snakemake and every job it ran), over the jobs Snakemake reports done.
3. **CPU per job of ``script:`` rules** (issue 54, point 9): a pipeline
   whose BENCH_OWN_SCRIPT_JOBS (default 100) jobs each run a Python
   ``script:`` (as a snakemake-workflows pipeline's do), after a ``shell:``
   job each.

Each full run's plain Snakemake runs twice (issue 57): with the local
profile's scheduler (``--scheduler greedy``: the targets are against it)
and with its defaults (the ILP scheduler). A dry run schedules nothing:
the planning part has one baseline.

Rounds alternate, the order flipped every round; the ratios are the medians
of the rounds' ratios. The machine's speed probe is taken before each part.

Run alone: ``.venv/bin/python benchmarks/bench_own_snakefile.py``.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    LOCAL_PROFILE,
    PYTHON,
    REPO,
    Row,
    Section,
    check,
    interleaved,
    job_counts,
    log,
    machine_speed_ms,
    median,
    paired_ratio,
    run_parts,
    show,
    timed,
)

EXAMPLE = REPO / "examples" / "own-snakefile"
MARK = "# waypost"
PLAN_LANGS = int(os.environ.get("BENCH_OWN_PLAN_LANGS", "120"))
RUN_LANGS = int(os.environ.get("BENCH_OWN_RUN_LANGS", "4"))
PLAN_ROUNDS = 5
RUN_ROUNDS = 3
SCRIPT_JOBS = int(os.environ.get("BENCH_OWN_SCRIPT_JOBS", "100"))
PLAN_TARGET = 1.10
CPU_TARGET = 1.10        # issue 57, item 2: CPU per job, against plain with the same scheduler
TIMEOUT_S = 900
DONE = re.compile(r"^(\d+) of \1 steps \(100%\) done$", re.M)


def copy_example(dest: Path, with_waypost: bool, langs: int) -> Path:
    """The example in ``dest``, its ``# waypost`` lines removed unless
    ``with_waypost`` (as tests/test_own_snakefile.py does), with ``langs``
    languages in its config."""
    shutil.copytree(EXAMPLE, dest)
    for name in ("Snakefile", "config.yaml"):
        lines = (dest / name).read_text().splitlines(keepends=True)
        if not with_waypost:
            lines = [line for line in lines if not line.rstrip().endswith(MARK)]
        (dest / name).write_text("".join(lines))
    config = (dest / "config.yaml").read_text()
    names = ", ".join(f"l{i:03d}" for i in range(langs))
    scaled = re.sub(r"^langs: \[.*\]$", f"langs: [{names}]", config, count=1, flags=re.M)
    if scaled == config:
        raise RuntimeError(f"{EXAMPLE}/config.yaml: no `langs: [...]` line to scale")
    (dest / "config.yaml").write_text(scaled)
    return dest


#: The two baselines: plain Snakemake with the local profile's scheduler (the
#: targets are against it), and with its own defaults (the ILP scheduler).
BASELINES = (("plain-greedy", "plain Snakemake `--cores 2 --scheduler greedy` (the local profile's scheduler)"),
             ("plain", "plain Snakemake `--cores 2` (its defaults: the ILP scheduler)"))


def command(name: str, *extra: str) -> list[str]:
    """waypost with the local profile as shipped; plain Snakemake with two
    cores, with the profile's scheduler or its own default."""
    options = ["--profile", str(LOCAL_PROFILE)] if name == "waypost" else \
        ["--cores", "2", *(["--scheduler", "greedy"] if name == "plain-greedy" else [])]
    return [PYTHON, "-m", "snakemake", *options, *extra]


def planning(tmp: Path) -> tuple[list[Row], list[str]]:
    dirs = {name: copy_example(tmp / f"plan-{name}", name == "waypost", PLAN_LANGS) for name in ("waypost", "plain")}
    jobs = {name: job_counts(check(timed(command(name, "-n"), cwd=d), f"{name} dry run").output)
            for name, d in dirs.items()}
    if jobs["waypost"] != jobs["plain"]:
        raise RuntimeError(f"the dry runs plan different jobs: {jobs}")

    cpu: dict[str, list[float]] = {"waypost": [], "plain": []}

    def dry(name: str):
        def once() -> float:
            result = check(timed(command(name, "-n"), cwd=dirs[name], keep_output=False), f"{name} dry run")
            cpu[name].append(result.cpu_s)
            return result.seconds
        return once

    speed = machine_speed_ms()
    # (the checked dry runs above were the warm-up)
    samples = interleaved({"waypost": dry("waypost"), "plain": dry("plain")}, PLAN_ROUNDS, warmup=0)
    ratio = paired_ratio(samples, "waypost", "plain")
    wp, base = median(samples["waypost"]), median(samples["plain"])
    cpu_ratio = paired_ratio(cpu, "waypost", "plain")
    log(f"own snakefile, dry run: {wp:.2f} s vs {base:.2f} s, paired ratio {ratio:.2f} (CPU {cpu_ratio:.2f})")
    row = Row(measure=f"own Snakefile (examples/own-snakefile, {PLAN_LANGS} langs, {sum(jobs['plain'].values())} "
                      "jobs): planning (`-n`)", value=wp, unit="s", baseline=base,
              baseline_label="plain Snakemake, the same Snakefile without its 3 `# waypost` lines",
              target=f"≤ {PLAN_TARGET:.2f}× plain", met=ratio <= PLAN_TARGET, paired_ratio=ratio,
              samples={**samples, **{f"{k} (CPU-s)": v for k, v in cpu.items()}},
              note=f"CPU ratio {cpu_ratio:.2f} ({median(cpu['waypost']):.2f} s vs {median(cpu['plain']):.2f} s, "
                   "steadier than wall on a loaded machine); "
                   f"waypost `--profile profiles/local`, plain `--cores 2`; {PLAN_ROUNDS} rounds, paired; "
                   f"speed probe {speed:.0f} ms")
    return [row], []


def cpu_per_job(tmp: Path) -> tuple[list[Row], list[str]]:
    fresh = itertools.count()
    names = ("waypost", "plain-greedy", "plain")
    cpu: dict[str, list[float]] = {name: [] for name in names}
    jobs: dict[str, set[int]] = {name: set() for name in names}
    records: set[int] = set()       # the waypost run's job records (`_manifest.json`)

    def full(name: str):
        def once() -> float:
            d = copy_example(tmp / f"run-{name}-{next(fresh)}", name == "waypost", RUN_LANGS)
            result = check(timed(command(name), cwd=d, timeout=TIMEOUT_S), f"{name} run")
            done = DONE.findall(result.output)
            if not done or not (d / "out" / "report.txt").exists():
                raise RuntimeError(f"{name} run: no report or no '100% done' line:\n{result.output[-2000:]}")
            jobs[name].add(int(done[-1]))
            if name == "waypost":
                records.add(sum(1 for _ in d.rglob("_manifest.json")))
            cpu[name].append(result.cpu_s / int(done[-1]))
            log(f"own snakefile, {name} run: {result.seconds:.1f} s, {done[-1]} jobs, "
                f"{1000 * cpu[name][-1]:.0f} ms CPU per job")
            shutil.rmtree(d, ignore_errors=True)
            return result.seconds
        return once

    speed = machine_speed_ms()
    # (no warm-up round: the planning part's dry runs compiled and cached what these runs import)
    walls = interleaved({name: full(name) for name in names}, RUN_ROUNDS, warmup=0)
    if len({frozenset(j) for j in jobs.values()}) != 1 or len(jobs["plain"]) != 1:
        raise RuntimeError(f"the runs did different numbers of jobs: {jobs}")
    count = next(iter(jobs["plain"]))
    rows = []
    for base, label in BASELINES:
        ratio, wall_ratio = paired_ratio(cpu, "waypost", base), paired_ratio(walls, "waypost", base)
        same = base == "plain-greedy"
        rows.append(Row(
            measure=f"own Snakefile ({RUN_LANGS} langs, {count} jobs): CPU per job, whole run (`getrusage` of "
                    "Snakemake and its jobs)", value=1000 * median(cpu["waypost"]), unit="ms",
            baseline=1000 * median(cpu[base]), baseline_label=f"{label}, the same Snakefile without its "
                                                                "`# waypost` lines",
            target=f"≤ {CPU_TARGET:.2f}× plain" if same else "", met=(ratio <= CPU_TARGET) if same else None,
            paired_ratio=ratio, samples={**{f"{k} (CPU-s per job)": cpu[k] for k in ("waypost", base)},
                                         **{f"{k} (wall)": walls[k] for k in ("waypost", base)}},
            note=f"waypost `--profile profiles/local`, {'/'.join(map(str, sorted(records)))} job records "
                 f"(`_manifest.json`) written per run; wall ratio {wall_ratio:.2f} ({median(walls['waypost']):.1f} s "
                 f"vs {median(walls[base]):.1f} s); {RUN_ROUNDS} rounds, paired; speed probe {speed:.0f} ms"))
    return rows, []


SCRIPT_RULES = """
rule all:
    input: "summary.txt"

rule prep:
    output: "prep/{i}.txt"
    shell: "echo {wildcards.i} > {output}"

rule analyse:
    input: "prep/{i}.txt"
    output: "analysed/{i}.tsv"
    params: scale=2
    script: "scripts/analyse.py"

rule summary:
    input: expand("analysed/{i}.tsv", i=range(int(config["count"])))
    output: "summary.txt"
    script: "scripts/summary.py"
"""
SCRIPTS = {
    "analyse.py": "v = int(open(snakemake.input[0]).read()) * snakemake.params.scale\n"
                  "open(snakemake.output[0], 'w').write(f'value\\t{v}\\n')\n",
    "summary.py": "open(snakemake.output[0], 'w').write(''.join(open(p).read().split()[-1] + '\\n' "
                  "for p in snakemake.input))\n",
}


def script_pipeline(dest: Path, with_waypost: bool) -> Path:
    (dest / "scripts").mkdir(parents=True)
    for name, text in SCRIPTS.items():
        (dest / "scripts" / name).write_text(text)
    head, tail = ("from waypost.snakemake import Pipeline\nwp = Pipeline(config, workflow)\n", "\nwp.finish()\n") \
        if with_waypost else ("", "")
    (dest / "Snakefile").write_text(head + SCRIPT_RULES + tail)
    return dest


def script_rules_cpu(tmp: Path) -> tuple[list[Row], list[str]]:
    fresh = itertools.count()
    names = ("waypost", "plain-greedy", "plain")
    cpu: dict[str, list[float]] = {name: [] for name in names}
    jobs = 2 * SCRIPT_JOBS + 2

    def full(name: str):
        def once() -> float:
            d = script_pipeline(tmp / f"script-{name}-{next(fresh)}", name == "waypost")
            result = check(timed(command(name, "--config", f"count={SCRIPT_JOBS}"), cwd=d, timeout=TIMEOUT_S),
                           f"{name} run")
            if not (d / "summary.txt").exists():
                raise RuntimeError(f"{name} run: no summary.txt:\n{result.output[-2000:]}")
            cpu[name].append(result.cpu_s / jobs)
            shutil.rmtree(d, ignore_errors=True)
            return result.seconds
        return once

    speed = machine_speed_ms()
    walls = interleaved({name: full(name) for name in names}, RUN_ROUNDS, warmup=1)
    cpu = {name: values[1:] for name, values in cpu.items()}   # (not the warm-up's)
    rows = []
    for base, label in BASELINES:
        ratio, wall_ratio = paired_ratio(cpu, "waypost", base), paired_ratio(walls, "waypost", base)
        same = base == "plain-greedy"
        rows.append(Row(
            measure=f"`script:` rules ({jobs} jobs, {SCRIPT_JOBS + 1} of them `script:`): CPU per job, whole run "
                    "(`getrusage` of Snakemake and its jobs)", value=1000 * median(cpu["waypost"]), unit="ms",
            baseline=1000 * median(cpu[base]), baseline_label=f"{label}, the same Snakefile without waypost's lines",
            target=f"≤ {CPU_TARGET:.2f}× plain" if same else "", met=(ratio <= CPU_TARGET) if same else None,
            paired_ratio=ratio, samples={**{f"{k} (CPU-s per job)": cpu[k] for k in ("waypost", base)},
                                         **{f"{k} (wall)": walls[k] for k in ("waypost", base)}},
            note=f"waypost `--profile profiles/local`; wall ratio {wall_ratio:.2f} ({median(walls['waypost']):.1f} s "
                 f"vs {median(walls[base]):.1f} s); {RUN_ROUNDS} rounds after a warm-up, paired; "
                 f"speed probe {speed:.0f} ms"))
    return rows, []


def run(ctx: dict) -> Section:
    return run_parts("Own Snakefile", ctx, (planning, cpu_per_job, script_rules_cpu))


if __name__ == "__main__":
    show(run({}))
