"""Snakemake's own test workflows, read from the source distribution of the
Snakemake installed here (its ``tests/`` ships in the sdist on the package
index), and each test's invocation turned into a ``snakemake`` command line.

Which workflows (the rule ``tests/test_snakemake_conformance.py`` runs them
by). A test of Snakemake's ``tests/tests.py`` is taken when it is one call
``run(dpath("DIR"), ...)`` of ``tests/common.py`` and nothing else, and
that call can be said as a command line on this machine. Left out, by
category (``excluded`` says which, per test):

- ``several steps``: the test runs more than once, or checks things of its
  own after the run (one run against ``expected-results/`` is what is
  compared here);
- ``network``, ``container``, ``conda``, ``cluster``, ``storage``: its
  markers, options or Snakefile need the internet, a container runtime,
  conda, a cluster executor or a storage plugin;
- ``not a run``: it makes a report, a DAG, a summary or unit tests, or runs
  with the ``dryrun``/``touch`` executor, not the rules' commands;
- ``expected to fail``: plain Snakemake is to fail on it: nothing to compare;
- ``other platform``/``skipped upstream``: marked so in ``tests.py``;
- ``not a command line``: a keyword (or value) of ``run()`` with no
  command-line equivalent here, or a shell command with redirections.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

VERSION = importlib.metadata.version("snakemake")
CACHE = Path(os.environ.get("WAYPOST_TEST_CACHE") or Path.home() / ".cache" / "waypost-tests")


class SuiteUnavailable(Exception):
    """The sdist could not be fetched (no network, no pip index)."""


def tests_dir() -> Path:
    """Snakemake's ``tests/`` from the sdist of the installed version,
    downloaded once with pip and kept under ``CACHE``. Test processes
    that start together (``make test`` runs three) take turns on a lock:
    one fetches and unpacks, the others then find it whole."""
    top = CACHE / f"snakemake-{VERSION}"
    whole = top / ".unpacked"   # written last: a tree cut short (or missing files) is unpacked again
    if whole.is_file():
        return top / "tests"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not whole.is_file():   # (another process may have unpacked it meanwhile)
            _unpack(top)
            whole.touch()
    return top / "tests"


def _unpack(top: Path) -> None:
    sdist = CACHE / f"snakemake-{VERSION}.tar.gz"
    if not sdist.is_file():
        got = subprocess.run([sys.executable, "-m", "pip", "download", f"snakemake=={VERSION}", "--no-binary", ":all:",
                              "--no-deps", "--no-build-isolation", "--quiet", "-d", str(CACHE)],
                             capture_output=True, text=True, timeout=600)
        if got.returncode != 0 or not sdist.is_file():
            raise SuiteUnavailable(f"pip download snakemake=={VERSION} (sdist) failed: {(got.stderr or got.stdout).strip()[-500:]}")
    partial = CACHE / f".snakemake-{VERSION}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"snakemake-{VERSION}/tests/")]
        tar.extractall(partial, members=members, filter="data")
    shutil.rmtree(top, ignore_errors=True)
    (partial / f"snakemake-{VERSION}").rename(top)
    shutil.rmtree(partial, ignore_errors=True)


# --- reading tests.py ------------------------------------------------------

@dataclass
class Case:
    """One test of ``tests.py``: its workflow directory and command line."""
    name: str                       # the test function's name
    workflow: str                   # its directory under tests/
    args: list[str] = field(default_factory=list)   # snakemake's arguments (without "snakemake")
    snakefile: str | None = None    # the main Snakefile, relative to the directory (None: Snakemake's search)
    check_results: bool = True
    check_md5: bool = True
    excluded: str | None = None     # the category and why, where it is left out


# decorators of tests.py that only say "not on Windows/macOS": this is Linux
_PLATFORM_ONLY = re.compile(r"^(skip_on_windows|pytest\.mark\.skipif\((ON_MACOS|ON_WINDOWS)\b.*)$", re.S)
_DECORATOR_CATEGORY = {"connected": "network", "apptainer": "container", "conda": "conda", "gcloud": "network",
                       "azbatch": "network", "zenodo": "network", "only_on_windows": "other platform",
                       "ci": "skipped upstream", "not_ci": "skipped upstream"}

# run() keywords that are left out by category, as their values say
_KEYWORD_CATEGORY = {
    "shouldfail": "expected to fail", "cluster": "cluster", "cluster_status": "cluster", "nodes": "cluster",
    "deployment_method": "container", "apptainer_args": "container", "container_image": "container",
    "conda_frontend": "conda", "conda_prefix": "conda", "conda_list_envs": "not a run", "conda_create_envs": "not a run",
    "default_storage_provider": "storage", "default_storage_prefix": "storage", "storage_provider_settings": "storage",
    "report": "not a run", "archive": "not a run", "generate_unit_tests": "not a run", "containerize": "not a run",
    "cleanup_metadata": "not a run", "edit_notebook": "not a run", "sigint_after": "several steps",
    "cleanup": "several steps", "tmpdir": "several steps", "no_tmpdir": "several steps",
}
# keywords that make no difference to a run from the command line
_NEUTRAL = {"check_results", "check_md5", "set_pythonpath", "cleanup_scripts", "printshellcmds", "debug_dag"}
# a shell command's options that are a category of their own
_SHELL_CATEGORY = [("--executor", "cluster"), ("--cluster", "cluster"), ("--sdm", "container"),
                   ("--software-deployment-method", "container"), ("--use-conda", "conda"),
                   ("--use-apptainer", "container"), ("--dag", "not a run"), ("--rulegraph", "not a run"),
                   ("--summary", "not a run"), ("--detailed-summary", "not a run"), ("--list-", "not a run"),
                   ("--report", "not a run"), ("--lint", "not a run"), ("--touch", "not a run"),
                   ("--default-storage-provider", "storage"), ("--generate-unit-tests", "not a run"),
                   ("--containerize", "not a run"), ("--archive", "not a run")]
# what in a workflow's own files needs the network or a plugin
_NEEDS = [(re.compile(r"\b(https?|ftp|s3|gs)://"), "network"), (re.compile(r"^\s*wrapper\s*:", re.M), "network"),
          (re.compile(r"\bstorage\s*[.(]"), "storage"), (re.compile(r"\bgithub\s*\("), "network")]


def read_cases(tests: Path) -> list[Case]:
    """Every test of ``tests.py`` that runs a workflow directory, with its
    command line or the reason it is left out."""
    tree = ast.parse((tests / "tests.py").read_text())
    cases = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            case = _case(node)
            if case is not None:
                if case.excluded is None:
                    case.excluded = _needs(tests / case.workflow)
                cases.append(case)
    return cases


def _run_calls(node: ast.FunctionDef) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "run"]


def _case(node: ast.FunctionDef) -> Case | None:
    calls = _run_calls(node)
    if not calls or not calls[0].args:
        return None
    workflow = _dpath(calls[0].args[0])
    if workflow is None:
        return None
    case = Case(node.name, workflow)
    if len(calls) > 1 or len(node.body) != 1 or not isinstance(node.body[0], ast.Expr):
        case.excluded = "several steps: the test runs more than once or checks things of its own"
        return case
    case.excluded = _decorators(node) or _keywords(case, calls[0])
    return case


def _dpath(arg: ast.expr) -> str | None:
    """``dpath("DIR")`` → DIR."""
    if (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "dpath"
            and arg.args and isinstance(arg.args[0], ast.Constant) and isinstance(arg.args[0].value, str)):
        return arg.args[0].value
    return None


def _decorators(node: ast.FunctionDef) -> str | None:
    for decorator in node.decorator_list:
        text = ast.unparse(decorator)
        if _PLATFORM_ONLY.match(text):
            continue
        category = _DECORATOR_CATEGORY.get(text)
        if category is None:
            category = "skipped upstream" if "skip" in text else "not a command line"
        return f"{category}: @{text[:80]}"
    return None


def _literal(value: ast.expr):
    """A keyword's value as Python, where it is one (``dict(a="b")`` too)."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict" and not value.args:
        return {k.arg: ast.literal_eval(k.value) for k in value.keywords}
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "split"
            and not value.args and isinstance(value.func.value, ast.Constant)):   # "a b".split()
        return str(value.func.value.value).split()
    return ast.literal_eval(value)


def _keywords(case: Case, call: ast.Call) -> str | None:
    """Fills ``case`` from ``run()``'s keywords; the reason it is left out, if it is."""
    values = {}
    for keyword in call.keywords:
        if keyword.arg in _KEYWORD_CATEGORY and not (keyword.arg == "shouldfail" and _is_false(keyword.value)):
            return f"{_KEYWORD_CATEGORY[keyword.arg]}: {keyword.arg}="
        if keyword.arg == "executor" and _literal_or_none(keyword.value) != "local":
            return f"not a run: executor={ast.unparse(keyword.value)}"
        if keyword.arg in _CALLS:
            values[keyword.arg] = _CALLS[keyword.arg](keyword.value)
            if values[keyword.arg] is None:
                return f"not a command line: {keyword.arg}={ast.unparse(keyword.value)}"
            continue
        try:
            values[keyword.arg] = _literal(keyword.value)
        except (ValueError, TypeError, SyntaxError):
            return f"not a command line: {keyword.arg}={ast.unparse(keyword.value)[:60]}"
    case.check_results = values.pop("check_results", not values.get("shouldfail", False))
    case.check_md5 = values.pop("check_md5", True)
    values.pop("shouldfail", None)
    case.snakefile = values.pop("snakefile", None)
    if "shellcmd" in values:
        return _shell_args(case, values.pop("shellcmd"))
    case.snakefile = case.snakefile or "Snakefile"
    return _api_args(case, values)


def _is_false(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and value.value is False


def _literal_or_none(value: ast.expr):
    try:
        return ast.literal_eval(value)
    except ValueError:
        return None


def _batch(value: ast.expr) -> str | None:
    """``Batch("rule", 1, 2)`` → ``rule=1/2``."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Batch" and len(value.args) == 3:
        rule, index, of = (_literal_or_none(a) for a in value.args)
        if isinstance(rule, str) and isinstance(index, int) and isinstance(of, int):
            return f"{rule}={index}/{of}"
    return None


def _rerun_triggers(value: ast.expr) -> list[str] | None:
    """``{RerunTrigger.INPUT}`` → ``["input"]``."""
    if isinstance(value, (ast.Set, ast.List)) and all(
            isinstance(e, ast.Attribute) and getattr(e.value, "id", None) == "RerunTrigger" for e in value.elts):
        return [e.attr.lower().replace("_", "-") for e in value.elts]
    return None


_CALLS = {"batch": _batch, "rerun_triggers": _rerun_triggers}   # keywords whose values are calls, not literals


def _shell_args(case: Case, shellcmd: str) -> str | None:
    """A test's own ``snakemake ...`` command: run as it is (common.py gives
    it no other option)."""
    words = shlex.split(shellcmd)
    if not words or words[0] != "snakemake" or any(w in ("|", ">", "<", "&&", ";") or w.startswith((">", "<"))
                                                     for w in words) or re.search(r"\s[<>|]", shellcmd):
        return f"not a command line: shellcmd={shellcmd!r}"
    harmless = {("--executor", "local"), ("--default-storage-provider", "none")}   # options naming the default
    for at, word in enumerate(words[1:], start=1):
        following = words[at + 1] if at + 1 < len(words) else ""
        for option, category in _SHELL_CATEGORY:
            if word.startswith(option) and (option, following) not in harmless:
                return f"{category}: {word} in shellcmd"
    case.args = words[1:]
    for flag in ("-s", "--snakefile"):
        if flag in case.args:
            case.snakefile = case.args[case.args.index(flag) + 1]
    return None


def _api_args(case: Case, values: dict) -> str | None:
    """``run()``'s keywords as the command-line options that say the same
    (common.py's defaults: 3 cores, no profile)."""
    args = ["--cores", str(values.pop("cores", 3)), "--workflow-profile", "none", "--snakefile", case.snakefile]
    for name, value in values.items():
        option = _API_OPTION.get(name)
        if option is None:
            return f"not a command line: {name}="
        words = option(value)
        if words is None:
            return f"not a command line: {name}={value!r}"
        args += words
    case.args = args
    return None


def _words(values) -> list[str]:
    return [values] if isinstance(values, str) else [str(v) for v in values]


def _config(mapping: dict) -> list[str] | None:
    if not all(isinstance(v, (str, int, float, bool)) for v in mapping.values()):
        return None
    return ["--config", *(f"{k}={v}" for k, v in mapping.items())] if mapping else []


def _nested_resources(mapping: dict) -> list[str]:
    return ["--set-resources", *(f"{rule}:{k}={v!r}" if isinstance(v, str) else f"{rule}:{k}={v}"
                                 for rule, values in mapping.items() for k, v in values.items())]


_API_OPTION = {
    "targets": _words,
    "config": _config,
    "configfiles": lambda v: ["--configfile", *_words(v)] if v else [],
    "until": lambda v: ["--until", *_words(v)] if v else [],
    "omit_from": lambda v: ["--omit-from", *_words(v)] if v else [],
    "forcerun": lambda v: ["--forcerun", *_words(v)] if v else [],
    "forceall": lambda v: ["--forceall"] if v else [],
    "all_temp": lambda v: ["--all-temp"] if v else [],
    "retries": lambda v: ["--retries", str(v)],
    "max_threads": lambda v: ["--max-threads", str(v)],
    "resources": lambda v: ["--resources", *(f"{k}={x}" for k, x in v.items())] if v else [],
    "default_resources": lambda v: ["--default-resources", *_words(v)] if isinstance(v, list) else None,
    "overwrite_resources": lambda v: _nested_resources(v) if v else [],
    "overwrite_scatter": lambda v: ["--set-scatter", *(f"{k}={x}" for k, x in v.items())] if v else [],
    "batch": lambda v: ["--batch", v],
    "rerun_triggers": lambda v: ["--rerun-triggers", *v],
    **{name: (lambda v: []) for name in _NEUTRAL},
}


def _needs(workflow: Path) -> str | None:
    """What the workflow's own files need (the network, a storage plugin),
    read from its Snakefiles, rules and configs."""
    for path in sorted(workflow.rglob("*")):
        if path.is_file() and "expected-results" not in path.parts and (
                path.suffix in (".smk", ".py", ".yaml", ".yml") or path.name.lower() in ("snakefile", "snakefile.py")):
            text = "\n".join(line for line in path.read_text(errors="replace").splitlines()
                             if not line.lstrip().startswith(("#", "$schema")))   # comments, a schema's own URL
            for pattern, category in _NEEDS:
                found = pattern.search(text)
                if found:
                    return f"{category}: {found.group(0).strip()!r} in {path.relative_to(workflow)}"
    return None


# --- running one -----------------------------------------------------------

class Snakemake:
    """Runs ``snakemake`` command lines, each in a fork of one process that
    imported Snakemake once (``snakemake_zygote``)."""

    def __init__(self):
        zygote = Path(__file__).with_name("snakemake_zygote.py")
        self.env = {k: v for k, v in os.environ.items() if k not in ("SNAKEMAKE_PROFILE", "PYTHONPATH")}
        # A workflow whose job runs ``python -m snakemake`` or ``snakemake``
        # (test_list_untracked, test_profile_*) finds this environment's, as
        # in Snakemake's own test runs (and a user's activated venv), even
        # where ``make test`` ran pytest by the venv's path alone.
        bin_dir = os.path.dirname(sys.executable)
        self.env["PATH"] = os.pathsep.join([bin_dir, *(p for p in self.env.get("PATH", "").split(os.pathsep)
                                                       if p and p != bin_dir)])
        self.process = subprocess.Popen([sys.executable, str(zygote)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=self.env)

    def __call__(self, workdir: Path, args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
        log = workdir.parent / f"{workdir.name}.snakemake.log"
        request = {"cwd": str(workdir), "args": args, "env": self.env, "log": str(log), "timeout": timeout}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError("the Snakemake zygote died")
        return subprocess.CompletedProcess(["snakemake", *args], json.loads(answer)["returncode"],
                                           log.read_text(errors="replace"), "")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main_snakefile(workdir: Path, case: Case) -> Path:
    """The Snakefile Snakemake reads: the test's own, else where Snakemake looks."""
    if case.snakefile:
        return workdir / case.snakefile
    for name in ("Snakefile", "snakefile", "workflow/Snakefile", "workflow/snakefile"):
        if (workdir / name).is_file():
            return workdir / name
    raise FileNotFoundError(f"{workdir}: no Snakefile")


def md5sum(path: Path) -> str:
    """common.py's ``md5sum``: the file's bytes with the ends stripped."""
    return hashlib.md5(path.read_bytes().strip(), usedforsecurity=False).hexdigest()


def result_mismatches(workdir: Path, expected: Path, check_md5: bool) -> list[str]:
    """common.py's check of ``expected-results/``: every file there (not
    ``*_WIN``, and none under a name starting with a dot: common.py lists
    them with ``glob``'s ``**``, which skips those) made, and the same after
    stripping both ends."""
    problems = []
    for path in sorted(expected.rglob("*")):
        rel = path.relative_to(expected)
        name = str(rel)
        if not path.is_file() or any(part.startswith(".") for part in rel.parts) or name.endswith("_WIN"):
            continue
        made = workdir / name
        if not made.exists():
            problems.append(f"expected file {name!r} not produced")
        elif check_md5 and (made.is_dir() or md5sum(made) != md5sum(path)):
            found = "a directory" if made.is_dir() else made.read_bytes().strip()[:200]
            problems.append(f"wrong result for {name!r}: found {found!r}, expected {path.read_bytes().strip()[:200]!r}")
    return problems


_JOB = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")


def planned_jobs(dry_run: subprocess.CompletedProcess) -> list[tuple[str, ...]]:
    """A dry run's jobs: each one's rule, outputs and wildcards, sorted."""
    jobs, job = [], None
    for line in (dry_run.stdout + dry_run.stderr).splitlines():
        start = _JOB.match(line)
        if start:
            job = [start.group(1), "", ""]
            jobs.append(job)
        elif job is not None and line.startswith("    output: "):
            job[1] = line.strip()
        elif job is not None and line.startswith("    wildcards: "):
            job[2] = line.strip()
        elif not line.startswith("    "):
            job = None
    return sorted(tuple(j) for j in jobs)


def tail(proc: subprocess.CompletedProcess, lines: int = 25) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])
