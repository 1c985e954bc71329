"""Shared helpers of the benchmarks: the machine, timing, the reference-shape
config and its file tree, and the rows of the report.

Only the standard library (plus waypost itself and PyYAML, both in the venv).
Every measure is a wall-clock time of a real process (``subprocess`` +
``time.perf_counter``); comparisons run A and B alternately in one loop, so
both see the same machine state, and report medians.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
SNAKEFILE = REPO / "workflow" / "Snakefile"
PLAIN_SNAKEFILE = BENCH / "plain" / "Snakefile"
LOCAL_PROFILE = REPO / "profiles" / "local"
ONPREM_PROFILE = REPO / "profiles" / "onprem"
PYTHON = sys.executable              # the venv's python (make bench runs us with it)
BIN = Path(PYTHON).parent


def log(message: str) -> None:
    """Progress on stderr, with the time since the driver started."""
    print(f"[bench {time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


_T0 = time.perf_counter()


# --- the machine --------------------------------------------------------------
def machine() -> dict:
    """Cores, memory, CPU model (from /proc/cpuinfo), OS, Python, Snakemake."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = int(line.split()[1]) / 1024 / 1024
                    break
    except OSError:
        pass
    try:
        import snakemake
        snakemake_version = snakemake.__version__
    except ImportError:
        snakemake_version = "?"
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1) if mem_gib else None,
        "cpu_model": model,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "snakemake": snakemake_version,
    }


def git_revision() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def code_fingerprint() -> str:
    """A hash of the code under test (engine, workflow, rules, profiles,
    config, the benchmarks themselves), to tell whether it changed mid-run."""
    digest = hashlib.sha256()
    for top in ("src", "workflow", "rules", "profiles", "config", "benchmarks"):
        for path in sorted((REPO / top).rglob("*")):
            # Prose (*.md) and results (*.json) are not code under test.
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".md", ".json"):
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


class Interference:
    """CPU time the rest of the machine used while we measured: the busy time
    in /proc/stat minus our own (this process and its children). Large values
    mean something else ran alongside (a test suite, say) and the numbers are
    suspect."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]                      # idle + iowait
        busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
        t = os.times()
        return busy, t.user + t.system + t.children_user + t.children_system

    def others_seconds(self) -> float:
        busy, ours = self._sample()
        return max(0.0, (busy - self.start[0]) - (ours - self.start[1]))


# A fixed amount of pure-Python work, timed in a fresh interpreter: how fast
# the machine is at the moment. This shared machine's speed drifts (the same
# loop has taken from 0.28 to 0.49 s within a day), and a part run in a slow
# phase is slower in absolute seconds and noisier in its ratios.
SPEED_PROBE = ("import time; t = time.perf_counter(); x = 0\n"
               "for i in range(3_000_000): x += i * i\n"
               "print(time.perf_counter() - t)")


def machine_speed_ms(runs: int = 3) -> float:
    """The probe's median time in ms (lower is faster)."""
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", SPEED_PROBE], capture_output=True, text=True, check=True)
        times.append(1000 * float(out.stdout))
    return median(times)


# --- timing -------------------------------------------------------------------
@dataclass
class Timed:
    """One timed run of a command."""
    seconds: float
    returncode: int
    output: str          # stdout + stderr (the tail only, when big)
    cpu_s: float = 0.0   # user + system CPU of the process and every descendant it waited for
    rss_mib: float = 0.0  # the peak resident memory of the largest of them


# Variables some CI environments (this one included) set that a user's shell
# does not, and that change what is measured: PYTHONDONTWRITEBYTECODE makes
# every Python process compile waypost's modules from source (Snakemake's, from
# pip, come with bytecode), PYTHONUNBUFFERED makes every write to stdout a
# system call. The measured processes run without them.
UNSET_FOR_MEASURING = ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")


def measuring_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in UNSET_FOR_MEASURING}
    return {**env, **(extra or {})}


def timed(cmd: list[str], cwd: str | Path | None = None, env: dict | None = None,
          timeout: float = 900, keep_output: bool = True) -> Timed:
    """Run ``cmd`` to completion and return its wall time.

    Output goes to a temporary file (not a pipe the parent must drain), so the
    measured process never waits on us. The wait is a plain blocking
    ``wait4()``: ``subprocess.run(timeout=...)`` polls with sleeps of up to
    50 ms, which would add up to 50 ms to every measure. A timer kills the
    process at ``timeout`` instead. ``wait4`` also gives the rusage of the
    process and every descendant it waited for: their CPU, and the peak RSS
    of the largest (for `waypost plan`, its Snakemake dry run).
    """
    import threading

    with tempfile.TemporaryFile(mode="w+b") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=measuring_env(env), stdout=out, stderr=subprocess.STDOUT)
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        seconds = time.perf_counter() - start
        proc.returncode = returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        if seconds >= timeout:
            raise subprocess.TimeoutExpired(cmd, timeout)
        text = ""
        if keep_output:
            out.seek(0)
            text = out.read().decode(errors="replace")
    return Timed(seconds, returncode, text, cpu, usage.ru_maxrss / 1024)


def check(result: Timed, what: str) -> Timed:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {result.returncode}):\n{result.output[-4000:]}")
    return result


def interleaved(variants: dict, repetitions: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run each variant (name → zero-argument callable returning seconds)
    ``warmup`` times unrecorded, then ``repetitions`` times recorded, A and B
    alternately; the order flips every round (ABBA...) so that a slow drift of
    the machine falls on both alike."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repetitions):
        for name in (names if rep % 2 == 0 else names[::-1]):
            samples[name].append(variants[name]())
    return samples


def median(values: list[float]) -> float:
    return statistics.median(values)


def paired_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of ``a``'s sample over ``b``'s in the same round
    (see ``interleaved``: the two ran back to back). A drift of the machine's
    speed between rounds then moves neither side alone."""
    return median([x / y for x, y in zip(samples[a], samples[b])])


def spread(values: list[float]) -> str:
    """min–max of the samples, for the raw-samples section."""
    return f"{min(values):.3f}–{max(values):.3f}"


# --- the report ---------------------------------------------------------------
@dataclass
class Row:
    """One line of the results table.

    ``value`` and ``baseline`` are in ``unit``; ``ratio`` is value/baseline
    when both exist; ``met`` is None when there is no target.
    """
    measure: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_label: str = ""
    target: str = ""
    met: bool | None = None
    samples: dict = field(default_factory=dict)   # name → list of seconds
    note: str = ""
    paired_ratio: float | None = None   # median of per-round ratios, where the samples were taken in rounds

    @property
    def ratio(self) -> float | None:
        if self.paired_ratio is not None:
            return self.paired_ratio
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline


@dataclass
class Section:
    """What one benchmark script hands the driver."""
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)      # Markdown paragraphs
    skipped: str | None = None                           # why it did not run
    others_cpu_s: float | None = None                    # CPU other processes used meanwhile
    wall_s: float | None = None
    speed_ms: list[float] | None = None                  # machine_speed_ms() before and after
    earlier_run: str = ""                                # kept from an earlier run (``--only`` ran others)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.2f} s"
    if unit == "ms":
        return f"{value:.1f} ms"
    if unit == "ms/MB":
        return f"{value:.2f} ms/MB"
    return f"{value:.3g} {unit}".strip()


def run_parts(title: str, ctx: dict, parts) -> Section:
    """A section made of parts (``part(tmp) -> (rows, notes)``) that share
    one scratch directory, removed afterwards."""
    section = Section(title)
    tmp = Path(tempfile.mkdtemp(prefix="bench-", dir=ctx.get("tmp")))
    failed = []
    try:
        for part in parts:
            try:
                rows, notes = part(tmp)
            except Exception as exc:       # the other parts' rows still count
                log(f"{part.__name__} failed: {exc}")
                failed.append(f"{part.__name__}: {type(exc).__name__}: {str(exc)[-1500:]}")
                continue
            section.rows += rows
            section.notes += notes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        section.notes += [f"**FAILED** {text}" for text in failed]
        raise PartsFailed(section)
    return section


class PartsFailed(Exception):
    """Some parts of a section failed; ``section`` holds the others' rows."""

    def __init__(self, section: Section):
        super().__init__("; ".join(n for n in section.notes if n.startswith("**FAILED**"))[:500])
        self.section = section


def show(section: Section, ctx: dict | None = None) -> None:
    """A section on stdout, for a benchmark run alone; then its scratch removed."""
    if section.skipped:
        print(section.skipped)
    for r in section.rows:
        versus = f" vs {fmt(r.baseline, r.unit)} ratio {r.ratio:.2f}" if r.ratio is not None else ""
        verdict = "" if r.met is None else " met" if r.met else " MISSED"
        print(f"{r.measure}: {fmt(r.value, r.unit)}{versus}{verdict}" + (f" ({r.note})" if r.note else ""))
    for note in section.notes:
        print("\n" + note)
    for path in (ctx or {}).get("cleanup", []):
        shutil.rmtree(path, ignore_errors=True)


# --- the reference shape ---------------------------------------------------------
# The reference pipeline per experiment × pair, with T teachers: 10 + 2T jobs
# (fetch, clean, vocab, backward, mono, T teachers, distill, student,
# T + 2 evaluations, export), plus one report per experiment and `all`.
TEACHERS = 5                    # 20 jobs per experiment × pair
# What every output of a "done" tree holds.
CONTENT = b"x\n"
CONTENT_SHA256 = hashlib.sha256(CONTENT).hexdigest()


def reference_config(pairs: int, experiments: int = 2, teachers: int = TEACHERS) -> dict:
    """A valid config of the reference shape: ``experiments`` experiments of
    ``pairs`` pairs each (pair names shared, as in a real study)."""
    names = [f"en-x{i:03d}" for i in range(pairs)]
    return {
        "root": "results",
        "rerun_policy": "presence",
        "experiments": {f"exp{e}": {"pairs": list(names), "teachers": teachers} for e in range(experiments)},
        # The reference config's stage settings and policies (config/config.yaml).
        **{k: v for k, v in yaml.safe_load((REPO / "config" / "config.yaml").read_text()).items()
           if k in ("policy", "stages")},
    }


def expected_jobs(config: dict) -> int:
    """Jobs of a full run of ``config``, `all` included."""
    total = 1
    for exp in config["experiments"].values():
        total += len(exp["pairs"]) * (10 + 2 * exp["teachers"]) + 1
    return total


def write_config(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def models(teachers: int) -> list[str]:
    return ["backward"] + [f"teacher-{i}" for i in range(teachers)] + ["student"]


def stage_outputs(config: dict):
    """Every stage directory of a full run, with its outputs:
    yields (experiment, pair, stage, instance, [output file names])."""
    for experiment, exp in config["experiments"].items():
        for pair in exp["pairs"]:
            yield experiment, pair, "fetch_corpus", None, ["train.tsv", "mono.txt", "test.tsv"]
            yield experiment, pair, "clean_corpus", None, ["clean.tsv"]
            yield experiment, pair, "train_vocab", None, ["vocab.json"]
            yield experiment, pair, "train_backward", None, ["model.json"]
            yield experiment, pair, "translate_mono", None, ["backtranslated.tsv"]
            for i in range(exp["teachers"]):
                yield experiment, pair, "train_teacher", str(i), ["model.json"]
            yield experiment, pair, "translate_corpus", None, ["distilled.tsv"]
            yield experiment, pair, "train_student", None, ["model.json"]
            for model in models(exp["teachers"]):
                yield experiment, pair, "evaluate", model, ["metrics.json"]
            yield experiment, pair, "export", None, ["package.tar.gz"]
        yield experiment, "_all", "report", None, ["report.md", "report.html"]


def build_done_tree(workdir: Path, config: dict, manifests: bool = True) -> int:
    """Make ``workdir``'s root look like a finished run: every output of every
    stage with a few bytes, all with one timestamp (so plain Snakemake's mtime
    rule sees nothing to redo either) and, with ``manifests``, a minimal valid
    SUCCESS ``_manifest.json`` per stage directory (``records.manifest``).
    Returns the number of stage directories."""
    from waypost.model import manifest, records

    root = workdir / config["root"]
    stamp = time.time() - 3600
    count = 0
    for experiment, pair, stage, instance, files in stage_outputs(config):
        stage_dir = root / pair / experiment / stage / (instance or "")
        stage_dir.mkdir(parents=True, exist_ok=True)
        outputs = []
        for name in files:
            path = stage_dir / name
            path.write_bytes(CONTENT)
            os.utime(path, (stamp, stamp))
            outputs.append({"path": name, "size": len(CONTENT), "sha256": CONTENT_SHA256})
        if manifests:
            attempt = {"number": 1, "series": 1, "action": "cmd", "state": "SUCCESS", "exit_code": 0,
                       "signal": None, "checks": {}, "decision": {"action": "done", "reason": "succeeded"},
                       "start": manifest.now_iso(), "end": manifest.now_iso(), "duration_s": 0.1,
                       "host": "bench", "scheduler": None, "scheduler_job_id": None, "command": ["true"], "workspace": ".",
                       "log": "_logs/attempt-1.log"}
            data = records.manifest(created=manifest.now_iso(), experiment=experiment, pair=pair, stage=stage, instance=instance,
                                  state="SUCCESS", attempts=[attempt], outputs=outputs, inputs=[],
                                  settings={}, config_hash="0" * 16, code_version="bench")
            # Plain writes: fsync per file would only slow the set-up down.
            (stage_dir / manifest.MANIFEST).write_text(json.dumps(data, indent=2) + "\n")
        count += 1
    return count




# --- Snakemake output ---------------------------------------------------------------
JOB_LINE = re.compile(r"^(\w+)\s+(\d+)$")


def job_counts(output: str) -> dict[str, int]:
    """Jobs by rule from a dry run's "Job stats" table ({} for nothing to do)."""
    if "Job stats:" not in output:
        if "Nothing to be done" not in output:
            raise RuntimeError(f"unexpected dry-run output:\n{output[-3000:]}")
        return {}
    table = output.split("Job stats:", 1)[1].split("\ntotal", 1)[0]
    counts = {}
    for line in table.splitlines():
        m = JOB_LINE.match(line.strip())
        if m:
            counts[m.group(1)] = int(m.group(2))
    return counts


def shell_line(cmd: list[str]) -> str:
    return shlex.join(str(c) for c in cmd)


# --- where the time goes ---------------------------------------------------------
# Code that is waypost's: the engine and the reference workflow's rule files.
WAYPOST_CODE = (str(REPO / "src" / "waypost") + "/", str(REPO / "rules") + "/", str(REPO / "workflow") + "/")


def profile_table(prof_path: str | Path, top: int = 12, ours=WAYPOST_CODE) -> tuple[float, float, str]:
    """Summarise a cProfile dump: (total seconds, seconds under waypost's
    entry points, a Markdown table of waypost's functions by cumulative time).

    An *entry point* is a function of ours called from code that is not ours
    (Snakemake calling a rule's input function, say); summing the entry points'
    cumulative time counts each second once. Times are under the profiler,
    which inflates Python-heavy code: read them as shares, not as seconds.
    """
    import pstats

    stats = pstats.Stats(str(prof_path))
    total = stats.total_tt

    def is_ours(func) -> bool:
        return func[0].startswith(ours)

    rows, entry_total = [], 0.0
    for func, (_cc, nc, tt, ct, callers) in stats.stats.items():
        if not is_ours(func):
            continue
        entry = any(not is_ours(caller) for caller in callers) or not callers
        if entry and not any(is_ours(caller) for caller in callers):
            entry_total += ct
        rows.append((ct, tt, nc, func, entry))
    rows.sort(reverse=True)
    lines = ["| function | where | calls | own s | cumulative s | share of run |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for ct, tt, nc, (filename, line, name), entry in rows[:top]:
        where = f"{os.path.relpath(filename, REPO)}:{line}"
        lines.append(f"| `{name}`{' (entry)' if entry else ''} | `{where}` | {nc} | {tt:.2f} | {ct:.2f} "
                     f"| {100 * ct / total:.0f}% |")
    return total, entry_total, "\n".join(lines)


def own_time_table(prof_path: str | Path, top: int = 10) -> str:
    """The functions (anyone's) with the most time of their own, from a
    cProfile dump: shows what the process as a whole is busy with."""
    import pstats

    stats = pstats.Stats(str(prof_path))
    total = stats.total_tt
    rows = sorted(((tt, nc, func) for func, (cc, nc, tt, ct, callers) in stats.stats.items()), reverse=True)
    lines = ["| function | where | calls | own s | share of run |", "| --- | --- | ---: | ---: | ---: |"]
    for tt, nc, (filename, line, name) in rows[:top]:
        where = filename.split("site-packages/")[-1].split("lib/python3")[-1] if filename != "~" else "built-in"
        if filename.startswith(str(REPO)):
            where = os.path.relpath(filename, REPO)
        lines.append(f"| `{name}` | `{where}:{line}` | {nc} | {tt:.2f} | {100 * tt / total:.0f}% |")
    return "\n".join(lines)


def importtime_table(stderr: str, top: int = 10) -> str:
    """The slowest imports (cumulative) from ``python -X importtime``'s stderr."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        # "import time:  <self us> | <cumulative us> | <one space + 2 per nesting level><module>"
        self_us, cumulative_us, name = line[len("import time:"):].split("|", 2)
        rows.append((int(cumulative_us), int(self_us), name[1:]))
    # Only top-level imports (no indentation) add up to the whole.
    top_level = [r for r in rows if not r[2].startswith(" ")]
    rows.sort(reverse=True)
    lines = ["| module | self ms | cumulative ms |", "| --- | ---: | ---: |"]
    for cumulative_us, self_us, name in rows[:top]:
        lines.append(f"| `{name.strip()}` | {self_us / 1000:.1f} | {cumulative_us / 1000:.1f} |")
    total = sum(r[0] for r in top_level) / 1000
    return f"All imports: {total:.0f} ms.\n\n" + "\n".join(lines)
