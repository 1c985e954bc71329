"""Where a trivial job's CPU goes with ``--profile profiles/local`` (issue 57
item 2), against plain Snakemake ``--scheduler greedy`` on the same jobs
(``bench_local_profile``'s two Snakefiles)::

    .venv/bin/python benchmarks/profile_job.py [--jobs N] [--out DIR] [--no-perf]

Two kinds of run, each on a fresh work directory of N trivial stages:

1. **CPU by process** (``perf sched record``, system-wide, unprofiled
   runs of waypost and of plain): every task of the run's process tree with
   its CPU time, grouped by its chain of names from Snakemake's main
   process (``main > python3.11 > python3.11 > bash``: the step server's
   forked runner's bash), per job. Skipped without ``perf`` (or with
   ``--no-perf``).
2. **cProfile** of waypost's run: the main process (every thread: the
   scheduler's and the jobs') and every forked step runner (the step
   server is started through ``--server-shim``, this script's own, which
   is ``launch.py --serve`` with each runner profiled). Writes
   ``main.prof`` and ``runners.prof`` (merged) under ``--out``, and prints
   their top functions and the per-job counts of a few calls. The clock is
   each thread's CPU time (``time.thread_time``): waits count nothing. Times
   under the profiler are inflated: read them as shares.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))

# Calls counted per job in the runners' profile (function name, file suffix).
COUNTED = {
    "json.dumps": ("dumps", "json/__init__.py"),
    "of which pure-Python encodes (indent)": ("_make_iterencode", "json/encoder.py"),
    "mount_of": ("mount_of", "stores/mounted.py"),
    "mount table reads": (("_parsed", "_read_table"), "stores/mounted.py"),   # (the first a tree has)
    "record writes (writes.whole)": ("whole", "model/writes.py"),
    "os.fork": ("<built-in method posix.fork>", "~"),
}


# --- the step server, with each forked runner under cProfile -------------------
def server_shim(out: str, src: str, argv: list[str]) -> None:
    """``launch.py --serve FD DIR`` (waypost from ``src``: the main
    process's), with every runner it forks profiled into ``out/runner-<pid>.prof``."""
    sys.path.append(src)
    import cProfile

    from waypost.runner import main as runner

    def profiled(data=None):
        sys.stderr.reconfigure(line_buffering=True, write_through=False)
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        try:
            status = runner.main([] if data is not None else None, data)
        finally:
            prof.disable()
            prof.dump_stats(os.path.join(out, f"runner-{os.getpid()}.prof"))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    runner.run_and_exit = profiled
    from waypost.runner.server import serve
    sys.exit(serve(int(argv[0]), argv[1]))


# --- Snakemake's main process under cProfile, every thread ------------------------
def main_profiled(out: str, argv: list[str]) -> None:
    """``python -m snakemake ARGV`` with this process's every thread under
    cProfile (merged into ``out/main.prof`` at exit), and the step server
    started through ``server_shim``."""
    import atexit
    import cProfile
    import pstats
    import runpy
    import threading

    profilers = []

    def thread_start(*_):   # (a new thread's first profile event: a profiler of its own)
        sys.setprofile(None)
        prof = cProfile.Profile(time.thread_time)
        profilers.append(prof)
        prof.enable()

    def dump():
        main_prof.disable()
        stats = pstats.Stats(main_prof)
        for prof in profilers:
            stats.add(prof)
        stats.dump_stats(os.path.join(out, "main.prof"))
        t = os.times()
        Path(out, "main.cpu").write_text(f"{t.user + t.system}\n")

    from waypost.scheduler import stepserver
    plain_init = stepserver.StepServer.__init__

    def shimmed(self, command):
        import waypost  # (this process's tree, which the server's sys.path may not find first)
        src = os.path.dirname(os.path.dirname(os.path.abspath(waypost.__file__)))
        plain_init(self, [sys.executable, "-S", os.path.abspath(__file__), "--server-shim", out, src])

    stepserver.StepServer.__init__ = shimmed
    atexit.register(dump)
    threading.setprofile(thread_start)
    main_prof = cProfile.Profile(time.thread_time)
    main_prof.enable()
    sys.argv = ["snakemake", *argv]
    runpy.run_module("snakemake", run_name="__main__", alter_sys=True)


# --- CPU by process, from perf sched ---------------------------------------------------
TASK = re.compile(r"^\s*(?P<comm>.+?)\[(?P<tid>\d+)(?:/(?P<pid>\d+))?\]\s+(?P<parent>-?\d+)\s+\d+\s+(?P<run>[\d.]+)")


def perf_tasks(data: str) -> list[dict]:
    """Every task ``perf sched timehist -s`` lists: comm, tid, pid, parent, run ms."""
    out = subprocess.run(["perf", "sched", "timehist", "-i", data, "-s"], capture_output=True, text=True)
    tasks = []
    for line in out.stdout.splitlines():
        m = TASK.match(line)
        if m:
            tid = int(m["tid"])
            tasks.append({"comm": m["comm"].strip(), "tid": tid, "pid": int(m["pid"] or tid),
                          "parent": int(m["parent"]), "ms": float(m["run"])})
    return tasks


def by_chain(tasks: list[dict], root: int) -> dict[str, tuple[float, int]]:
    """CPU ms and process count of ``root``'s tree, by chain of names from it
    (a thread counts with its process; a process that exec'd shows once per name)."""
    process_of = {t["tid"]: t["pid"] for t in tasks}   # (a fork's parent is the thread that forked)
    parent = {}
    comms = collections.defaultdict(list)
    for t in tasks:
        if t["tid"] == t["pid"]:
            parent.setdefault(t["pid"], process_of.get(t["parent"], t["parent"]))
        comms[t["pid"]].append(t["comm"])

    def chain(pid: int) -> str | None:
        names = []
        while pid != root:
            if pid not in parent or len(names) > 20:
                return None
            names.append("/".join(dict.fromkeys(comms[pid])))
            pid = parent[pid]
        return " > ".join(["main", *reversed(names)])

    totals: dict[str, list] = collections.defaultdict(lambda: [0.0, set()])
    for t in tasks:
        where = chain(t["pid"])
        if where is not None:
            totals[where][0] += t["ms"]
            totals[where][1].add(t["pid"])
    return {k: (v[0], len(v[1])) for k, v in sorted(totals.items(), key=lambda kv: -kv[1][0])}


def perf_run(name: str, cmd: list[str], cwd: Path, jobs: int, out: Path) -> dict[str, tuple[float, int]]:
    data = str(out / f"{name}.perf")
    proc = subprocess.Popen(["perf", "sched", "record", "-q", "-o", data, "--", *cmd], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{name} under perf failed:\n{err.decode()[-2000:]}")
    tasks = perf_tasks(data)
    # The measured command is perf's child; Snakemake's main process is the one running cmd[0].
    perf_children = [t for t in tasks if t["tid"] == t["pid"] and t["parent"] == proc.pid]
    if not perf_children:
        raise SystemExit(f"{name}: no task of perf's child in perf's record")
    return by_chain(tasks, perf_children[0]["pid"])


def chain_table(results: dict[str, dict], jobs: int) -> str:
    lines = ["| process (chain of names from Snakemake's main process) | " +
             " | ".join(f"{n}: ms/job | {n}: processes/job" for n in results) + " |",
             "| --- |" + " ---: | ---: |" * len(results)]
    keys = list(dict.fromkeys(k for r in results.values() for k in r))
    for key in keys:
        cells = []
        for r in results.values():
            ms, n = r.get(key, (0.0, 0))
            cells += [f"{ms / jobs:.2f}", f"{n / jobs:.2f}" if key != "main" else "1 (all)"]
        lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    totals = [f"{sum(ms for ms, _ in r.values()) / jobs:.2f} | " for r in results.values()]
    lines.append("| **total** | " + " | ".join(t + "" for t in totals).rstrip("| ") + " |")
    return "\n".join(lines)


# --- the report ---------------------------------------------------------------------
def counted(prof: str, jobs: int) -> list[str]:
    import pstats
    stats = pstats.Stats(prof).stats
    lines = []
    for label, (names, suffix) in COUNTED.items():
        for name in (names,) if isinstance(names, str) else names:
            found = [nc for (filename, _line, func), (_cc, nc, *_rest) in stats.items()
                     if func == name and filename.endswith(suffix)]
            if found:
                break
        calls = sum(found)
        lines.append(f"- {label}: {calls / jobs:.2f} per job")
    return lines


def scheduler_passes(prof: str) -> int:
    import pstats
    return sum(nc for (filename, _line, func), (_cc, nc, *_rest) in pstats.Stats(prof).stats.items()
               if func == "_finish_jobs" and filename.endswith("scheduling/job_scheduler.py"))


def profile_run(cmd_args: list[str], workdir: Path, jobs: int, out: Path) -> None:
    from common import PYTHON, own_time_table, profile_table

    for old in out.glob("runner-*.prof"):
        old.unlink()
    start = time.perf_counter()
    with open(out / "snakemake.log", "wb") as log:
        subprocess.run([PYTHON, os.path.abspath(__file__), "--main-profiled", str(out), *cmd_args], cwd=workdir,
                       check=True, stdout=log, stderr=subprocess.STDOUT)
    print(f"\n## cProfile, {jobs} jobs ({time.perf_counter() - start:.1f} s under the profiler)\n")
    import pstats
    main_prof = str(out / "main.prof")
    print(f"Main process: {float((out / 'main.cpu').read_text()) * 1000 / jobs:.2f} ms CPU per job under "
          f"the profiler; scheduler passes (`JobScheduler._finish_jobs` calls): {scheduler_passes(main_prof)}\n")
    print(own_time_table(main_prof, top=15) + "\n")
    total, entry, table = profile_table(main_prof, top=12)
    print(f"waypost's code in the main process: {entry:.2f} of {total:.2f} s\n\n{table}\n")
    runners = sorted(out.glob("runner-*.prof"))
    if not runners:
        print("(no runner profiles: did the steps go through the step server?)")
        return
    merged = pstats.Stats(str(runners[0]))
    for path in runners[1:]:
        merged.add(str(path))
    merged.dump_stats(str(out / "runners.prof"))
    for path in runners:
        path.unlink()
    print(f"Forked step runners ({len(runners)}), merged: {1000 * merged.total_tt / len(runners):.2f} ms per "
          "runner under the profiler\n")
    print(own_time_table(str(out / "runners.prof"), top=15) + "\n")
    print(profile_table(str(out / "runners.prof"), top=15)[2] + "\n")
    print("\n".join(counted(str(out / "runners.prof"), len(runners))))


def main() -> None:
    if sys.argv[1:2] == ["--server-shim"]:
        return server_shim(sys.argv[2], sys.argv[3], sys.argv[4:])
    if sys.argv[1:2] == ["--main-profiled"]:
        return main_profiled(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--out", default=None, help="where the profiles go (default: a temporary directory, kept)")
    parser.add_argument("--no-perf", action="store_true", help="skip the CPU-by-process runs")
    parser.add_argument("--no-cprofile", action="store_true", help="skip the cProfile run")
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    from bench_local_profile import WAYPOST_SNAKEFILE, plain_local_cmd, trivial_workdir
    from common import LOCAL_PROFILE, PYTHON, measuring_env

    os.environ.clear()
    os.environ.update(measuring_env())
    out = Path(args.out or tempfile.mkdtemp(prefix="profile-job-"))
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="profile-job-runs-"))
    fresh = iter(range(1000))

    def waypost_args(d: Path) -> list[str]:
        return ["-s", str(WAYPOST_SNAKEFILE), "-d", str(d), "--profile", str(LOCAL_PROFILE),
                "--configfile", str(d / "config.yaml")]

    def workdir(jobs: int) -> Path:
        return trivial_workdir(scratch / f"w{next(fresh)}", jobs)

    try:
        for name in ("waypost", "plain"):   # (warm: bytecode, page cache)
            d = workdir(5)
            cmd = [PYTHON, "-m", "snakemake", *waypost_args(d)] if name == "waypost" else plain_local_cmd(d, True)
            subprocess.run(cmd, cwd=d, check=True, capture_output=True)
        if not args.no_perf and shutil.which("perf"):
            results = {}
            for name in ("waypost", "plain-greedy"):
                d = workdir(args.jobs)
                cmd = [PYTHON, "-m", "snakemake", *waypost_args(d)] if name == "waypost" else \
                    plain_local_cmd(d, greedy=True)
                results[name] = perf_run(name, cmd, d, args.jobs, out)
            print(f"## CPU by process (perf sched), {args.jobs} jobs, ms per job\n")
            print(chain_table(results, args.jobs) + "\n")
        elif not args.no_perf:
            print("(no perf here: CPU by process skipped)\n")
        if not args.no_cprofile:
            d = workdir(args.jobs)
            profile_run(waypost_args(d), d, args.jobs, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nProfiles under {out}")


if __name__ == "__main__":
    main()
