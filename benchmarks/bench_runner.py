"""Step-runner overhead.

1. A no-op step through the runner, as Snakemake's shell runs a local
   stage job::

       bash -c "set -euo pipefail; exec python -S .../waypost/runner/launch.py <<'WAYPOST_STEP_…'
       {step spec: stage e/p/s, stage_dir D, outputs [D/out]}
       echo x > D/out
       WAYPOST_STEP_…"

   (the runner then runs ``echo x > D/out`` from its attempt script with
   Snakemake's prefix) vs the bare ``bash -c 'set -euo pipefail; echo x >
   D/out'`` as plain Snakemake runs it (each run in a fresh D, so no earlier
   workspace to archive).
   Alongside, for the breakdown, both started and ended as the runner is
   (``-S``, ``os._exit``): the interpreter alone, and the runner's imports.
   Target: ≤ 50 ms over the bare command.

2. Checksums of a large output: the runner hashes every declared output into
   the manifest (``manifest.digests_file``: sha256 and crc32c in one read). Its cost per MB on a file of
   BENCH_BIG_MB (default 200) MB, from the page cache, vs ``sha256sum`` of
   the same file, and the disk's own read speed (``dd iflag=direct``). Target:
   hashing at disk speed — no slower per MB than reading the file from disk,
   or than ``sha256sum`` where the disk is faster than any SHA-256 can go.
   End to end, a step that writes the file through the runner vs bare.

Run alone: ``.venv/bin/python benchmarks/bench_runner.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import PYTHON, Row, Section, check, importtime_table, interleaved, log, median, run_parts, show, timed

OVERHEAD_TARGET_MS = 50
NOOP_REPETITIONS = 20
BIG_MB = int(os.environ.get("BENCH_BIG_MB", "200"))
BIG_REPETITIONS = 5
HASH_SLACK = 1.10     # "as fast as": within 10%


def runner_cmd(stage_dir: Path, output: Path, command: str) -> list[str]:
    """As Snakemake's shell runs a local stage job (see ``waypost.planning.wiring.rules.wire``)."""
    import shlex

    from waypost.model import spec
    from waypost.runner import main as runner
    step = spec.encode({"stage": "s", "experiment": "e", "pair": "p", "stage_dir": str(stage_dir),
                        "outputs": [str(output)]})
    line = (f"set -euo pipefail; exec {shlex.join(runner.command(PYTHON))} <<'{spec.DELIMITER}'\n{step}\n"
            f"{command}\n{spec.DELIMITER}")
    return ["bash", "-c", line]


def noop_step(tmp: Path) -> tuple[list[Row], list[str]]:
    fresh = itertools.count()

    def stage_dir() -> Path:
        path = tmp / f"noop-{next(fresh)}"
        path.mkdir()
        return path

    def bare() -> float:
        d = stage_dir()
        return check(timed(["bash", "-c", f"set -euo pipefail; echo x > {d}/out"], keep_output=False),
                     "bare step").seconds

    def through_runner() -> float:
        d = stage_dir()
        cmd = runner_cmd(d, d / "out", f"echo x > {d}/out")
        return check(timed(cmd, keep_output=False), "runner step").seconds

    import waypost
    source = os.path.dirname(os.path.dirname(os.path.abspath(waypost.__file__)))

    def python_start() -> float:
        return check(timed([PYTHON, "-S", "-c", "import os; os._exit(0)"], keep_output=False),
                     "python alone").seconds

    def runner_imports() -> float:
        code = f"import os, sys; sys.path.append({source!r}); import waypost.runner.main; os._exit(0)"
        return check(timed([PYTHON, "-S", "-c", code], keep_output=False), "import").seconds

    # A first run, checked: the manifest is SUCCESS with the output's checksum.
    d = stage_dir()
    check(timed(runner_cmd(d, d / "out", f"echo x > {d}/out")), "runner step")
    data = json.loads((d / "_manifest.json").read_text())
    assert data["state"] == "SUCCESS" and data["outputs"][0]["sha256"], data

    samples = interleaved({"runner": through_runner, "bare": bare, "python alone": python_start,
                           "import waypost.runner.main": runner_imports}, NOOP_REPETITIONS, warmup=2)
    ms = {name: 1000 * median(values) for name, values in samples.items()}
    overhead = ms["runner"] - ms["bare"]
    log(f"runner no-op: {ms['runner']:.1f} ms vs bare {ms['bare']:.1f} ms (+{overhead:.1f} ms)")
    rows = [Row(measure="step runner: a no-op step", value=ms["runner"], unit="ms", baseline=ms["bare"],
                baseline_label="the bare command", target=f"≤ +{OVERHEAD_TARGET_MS} ms per step",
                met=overhead <= OVERHEAD_TARGET_MS, samples=samples,
                note=f"+{overhead:.0f} ms per step")]
    python, imports = ms["python alone"], ms["import waypost.runner.main"]
    breakdown = (f"Breakdown of the no-op step (medians of {NOOP_REPETITIONS}): bare command "
                 f"{ms['bare']:.1f} ms; the interpreter alone {python:.1f} ms; the interpreter and the runner's "
                 f"imports {imports:.1f} ms (both started and ended as the runner is: `python -S`, no "
                 f"teardown at exit); the whole runner {ms['runner']:.1f} ms. So of the +{overhead:.0f} ms: "
                 f"~{python:.0f} ms is starting Python, ~{imports - python:.0f} ms importing the runner's modules, "
                 f"~{max(0.0, ms['runner'] - imports - ms['bare']):.0f} ms the rest: the runner's own work "
                 "(archive check, `_running.json`, the fork of the step, the log tee, the manifest with its "
                 "fsync).")
    notes = [breakdown]
    if overhead > OVERHEAD_TARGET_MS or os.environ.get("BENCH_PROFILE") == "1":
        d = stage_dir()
        cmd = runner_cmd(d, d / "out", f"echo x > {d}/out")
        cmd[2] = cmd[2].replace(" -S ", " -X importtime -S ", 1)
        result = check(timed(cmd), "runner step with -X importtime")
        notes.append("The runner's slowest imports (`python -X importtime`, one run):\n\n"
                     + importtime_table(result.output))
    return rows, notes


def hashing(tmp: Path) -> tuple[list[Row], list[str]]:
    from waypost.model.manifest import digests_file

    big = tmp / "big.bin"
    write = ["dd", "if=/dev/zero", f"of={big}", "bs=1M", f"count={BIG_MB}", "conv=fdatasync", "status=none"]
    written = check(timed(write), "writing the large file").seconds
    disk_write = BIG_MB / written

    # The disk's sequential read speed, past the page cache (O_DIRECT).
    direct = timed(["dd", f"if={big}", "of=/dev/null", "bs=4M", "iflag=direct", "status=none"])
    disk_read = BIG_MB / direct.seconds if direct.returncode == 0 else None

    def python_hash() -> float:
        start = time.perf_counter()
        digests_file(str(big))
        return time.perf_counter() - start

    def coreutils() -> float:
        return check(timed(["sha256sum", str(big)], keep_output=False), "sha256sum").seconds

    samples = interleaved({"runner's digests_file": python_hash, "sha256sum": coreutils}, BIG_REPETITIONS)
    ours = 1000 * median(samples["runner's digests_file"]) / BIG_MB
    theirs = 1000 * median(samples["sha256sum"]) / BIG_MB
    disk_ms = 1000 / disk_read if disk_read else None
    bound = max(theirs, disk_ms or 0) * HASH_SLACK
    log(f"hashing: {ours:.2f} ms/MB vs sha256sum {theirs:.2f} ms/MB; disk read "
        f"{disk_read or float('nan'):.0f} MB/s, write {disk_write:.0f} MB/s")
    rows = [Row(measure=f"step runner: sha256 + crc32c of a {BIG_MB} MB output, per MB", value=ours, unit="ms/MB",
                baseline=theirs, baseline_label="`sha256sum`",
                target="at disk speed (≤ max(disk read, `sha256sum`) per MB, +10%)", met=ours <= bound,
                samples=samples,
                note=f"{1000 / ours:.0f} MB/s; disk reads " + (f"{disk_read:.0f} MB/s" if disk_read else "?")
                + f", writes {disk_write:.0f} MB/s")]

    # End to end: a step that writes the file, through the runner vs bare.
    fresh = itertools.count()

    def step(via_runner: bool):
        def go() -> float:
            d = tmp / f"big-{next(fresh)}"
            d.mkdir()
            out = d / "out.bin"
            cmd = f"dd if=/dev/zero of={out} bs=1M count={BIG_MB} status=none"
            seconds = check(timed(runner_cmd(d, out, cmd) if via_runner else ["bash", "-c", cmd],
                                  keep_output=False), "large step").seconds
            shutil.rmtree(d)            # keep the disk and the page cache from filling up
            return seconds
        return go

    steps = interleaved({"runner": step(True), "bare": step(False)}, BIG_REPETITIONS)
    wp, bare = median(steps["runner"]), median(steps["bare"])
    rows.append(Row(measure=f"step runner: a step writing {BIG_MB} MB", value=wp, unit="s", baseline=bare,
                    baseline_label="the bare command", target="(informational)", samples=steps,
                    note=f"+{1000 * (wp - bare):.0f} ms: start-up plus hashing {BIG_MB} MB "
                         f"(~{ours * BIG_MB:.0f} ms at the rate above)"))
    notes = [f"Hashing: the runner reads each output in 1 MiB chunks through `hashlib.sha256` (OpenSSL); "
             f"{ours:.2f} ms/MB ({1000 / ours:.0f} MB/s) from the page cache, `sha256sum` {theirs:.2f} ms/MB "
             f"({1000 / theirs:.0f} MB/s). The disk reads {disk_read:.0f} MB/s with O_DIRECT and wrote "
             f"{disk_write:.0f} MB/s (fdatasync)." if disk_read else
             f"Hashing: {ours:.2f} ms/MB vs `sha256sum` {theirs:.2f} ms/MB (O_DIRECT reads unsupported here)."]
    big.unlink()
    return rows, notes


BUNDLE_STAGES = 40


def bundled_steps(tmp: Path) -> tuple[list[Row], list[str]]:
    """A bundle of no-op stages as a Slurm job runs it (``launch.py
    --bundle``, no Slurm): each stage's runner forked from the bundle, which
    imported it once, against the same steps each started alone (a comment
    line first: bash runs the file, which starts the runner)."""
    from waypost.runner import bundle as bundles
    from waypost.runner import main as runner
    fresh = itertools.count()

    def bundle(alone: bool) -> tuple[float, float]:
        root = tmp / f"bundle-{next(fresh)}"
        root.mkdir()
        entries = []
        for i in range(BUNDLE_STAGES):
            d = root / f"s{i}"
            d.mkdir()
            line = runner_cmd(d, d / "out", f"echo x > {d}/out")[2].removeprefix("set -euo pipefail; ")
            (root / f"{i}.sh").write_text(("# started alone\n" if alone else "") + line + "\n")
            entries.append(f"{root}/{i}.sh\t{root}/{i}.status\n")
        (root / "list").write_text("".join(entries))
        result = check(timed([*runner.command(PYTHON), bundles.BUNDLE_OPTION, str(root / "list")],
                             keep_output=False), "bundle")
        assert all((root / f"{i}.status").read_text() == "0\n" for i in range(BUNDLE_STAGES))
        return result.seconds / BUNDLE_STAGES, result.cpu_s / BUNDLE_STAGES

    cpu: dict[str, list[float]] = {"forked": [], "alone": []}

    def variant(name: str):
        def go() -> float:
            seconds, cpu_s = bundle(name == "alone")
            cpu[name].append(cpu_s)
            return seconds
        return go

    bundle(False), bundle(True)   # warm-up, unrecorded: the page cache and the bytecode
    samples = interleaved({"forked": variant("forked"), "alone": variant("alone")}, 5, warmup=0)
    ms = {name: 1000 * median(values) for name, values in samples.items()}
    cpu_ms = {name: 1000 * median(values) for name, values in cpu.items()}
    log(f"bundled stage: forked {ms['forked']:.1f} ms ({cpu_ms['forked']:.1f} CPU) vs alone "
        f"{ms['alone']:.1f} ms ({cpu_ms['alone']:.1f} CPU)")
    return [Row(measure=f"a bundled no-op stage ({BUNDLE_STAGES} in one bundle), runner forked",
                value=ms["forked"], unit="ms", baseline=ms["alone"], baseline_label="each runner started alone",
                samples=samples,
                note=f"CPU {cpu_ms['forked']:.1f} ms against {cpu_ms['alone']:.1f} ms per stage")], []


def run(ctx: dict) -> Section:
    return run_parts("Step runner overhead", ctx, (noop_step, hashing, bundled_steps))


if __name__ == "__main__":
    show(run({}))
