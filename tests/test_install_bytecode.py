"""waypost is compiled once at install, whatever ``PYTHONDONTWRITEBYTECODE``
says (issue 42): an editable install (``make demo``, ``make test``) compiles
nothing by itself, and where that variable is set (Docker images, CI) every
step runner would compile waypost's modules from source, ~20 ms a job.

The install step here is the Makefile's own ``venv`` target, run in a copy
of the repository with no ``__pycache__`` anywhere, its venv's ``pip
install`` already done (a venv whose ``bin/waypost`` is newer than
``pyproject.toml``, as after a first ``make``)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, step_input


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    return installed_copy(tmp_path_factory.mktemp("install"))


def installed_copy(tmp_path: Path) -> Path:
    """A copy of the repository's Makefile, pyproject.toml and src/, uncompiled,
    after the Makefile's install step ran with PYTHONDONTWRITEBYTECODE=1."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, repo / name)
    shutil.copytree(REPO / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    os.utime(repo / "pyproject.toml", (1e9, 1e9))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "bin" / "waypost").touch()
    assert not list(repo.rglob("*.pyc"))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(["make", "--no-print-directory", "venv", f"VENV={venv}"], cwd=repo, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pip" not in proc.stdout, proc.stdout   # the venv counts as installed: only the compile step ran
    return repo


def stale(source: Path) -> str | None:
    """Why the interpreter would not use ``source``'s cached bytecode, or None."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not cached.exists():
        return f"no {cached.name}"
    data = cached.read_bytes()
    if data[:4] != importlib.util.MAGIC_NUMBER:
        return "another Python's bytecode"
    flags = int.from_bytes(data[4:8], "little")
    if flags & 1:   # hash-based (compileall under SOURCE_DATE_EPOCH)
        fresh = data[8:16] == importlib.util.source_hash(source.read_bytes())
    else:
        stat = source.stat()
        fresh = (int.from_bytes(data[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
                 and int.from_bytes(data[12:16], "little") == stat.st_size & 0xFFFFFFFF)
    return None if fresh else "older than its source"


def tree(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_the_install_step_compiles_every_module_whatever_the_environment_says(installed):
    repo = installed
    package = repo / "src" / "waypost"
    modules = sorted(package.rglob("*.py"))
    assert len(modules) > 50
    problems = {str(m.relative_to(package)): why for m in modules if (why := stale(m))}
    assert not problems, problems


def test_a_step_runner_under_pythondontwritebytecode_compiles_nothing(installed, tmp_path):
    """A real step through the installed copy's runner, started as a job
    starts it (``runner.command``) with ``-v``: each waypost module it imports
    comes from its .pyc ("matches"), none is compiled from source, and
    nothing is written under the package."""
    package = installed / "src" / "waypost"
    before = tree(package)
    stage = tmp_path / "results" / "q" / "x" / "touch_it"
    out = stage / "made.txt"
    launch = package / "runner" / "launch.py"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)   # the copy's waypost, found by launch.py itself
    proc = subprocess.run([sys.executable, "-v", "-S", str(launch)], input=step_input(stage, f"echo y > {out}",
                          outputs=[out]), capture_output=True, env=env, cwd=tmp_path)
    log = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert out.read_text() == "y\n"
    from_source = re.findall(rf"# code object from ({re.escape(str(package))}\S*\.py)$", log, re.M)
    assert not from_source, from_source
    from_cache = re.findall(rf"^# \S+\.pyc matches ({re.escape(str(package))}\S*\.py)$", log, re.M)
    assert str(package / "runner" / "main.py") in from_cache and len(from_cache) > 10, log[-3000:]
    assert tree(package) == before
