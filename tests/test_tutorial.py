"""The tutorial (docs/tutorial.md) is run as written, so it cannot rot.

Its fenced blocks are read in order:

- a block titled with a path (```` ```python title="scripts/train.py" ````)
  writes that file; a title ``PATH, above LINE`` inserts the block into PATH
  before the line that reads LINE;
- a ``console`` block's ``$ `` lines are commands (a line ending in ``\\``
  goes on), run with bash in the directory the previous one left; each must
  exit 0, and the lines shown under it must appear in its output, in order
  (``...`` skips any lines, ``…`` inside a line matches any text);
- other blocks are illustrations and are not run.

A section (``## ...``) holding ``<!-- tutorial: needs slurm -->`` or
``<!-- tutorial: needs gcs -->`` runs only where that service is (always in
CI); those sections start from where the sections before them left off.

``python tests/test_tutorial.py [SECTION...]`` runs it outside pytest and
prints every command's real output (for writing the page).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TUTORIAL = REPO / "docs" / "tutorial.md"
FENCE = re.compile(r"^```(\S*)([^\n]*)\n(.*?)^```$", re.S | re.M)
NEEDS = re.compile(r"<!-- tutorial: needs (\w+) -->")


@dataclass
class Section:
    title: str
    needs: str | None
    steps: list = field(default_factory=list)   # ("file", path, anchor, text) | ("cmd", command, expected)


def sections(text: str) -> list[Section]:
    found: list[Section] = []
    for part in re.split(r"^(?=## )", text, flags=re.M):
        title = part.splitlines()[0].lstrip("# ").strip() if part.startswith("## ") else "(intro)"
        need = NEEDS.search(part)
        section = Section(title, need.group(1) if need else None)
        for lang, info, body in FENCE.findall(part):
            titled = re.search(r'title="([^"]+)"', info)
            if titled:
                path, _, anchor = titled.group(1).partition(", above ")
                section.steps.append(("file", path, anchor or None, body))
            elif lang == "console":
                section.steps += _commands(body)
        found.append(section)
    return found


def _commands(body: str) -> list[tuple]:
    steps, command, expected, going_on = [], None, [], False
    for line in body.splitlines():
        if going_on:
            command += "\n" + line
            going_on = line.endswith("\\")
        elif line.startswith("$ "):
            if command is not None:
                steps.append(("cmd", command, expected))
            command, expected, going_on = line[2:], [], line.endswith("\\")
        elif command is not None:
            expected.append(line)
    if command is not None:
        steps.append(("cmd", command, expected))
    return steps


def _normal(line: str) -> str:
    return " ".join(line.split())


def missing_output(expected: list[str], actual: str) -> str | None:
    """The first shown line not found (in order) in the real output, or None."""
    lines = [_normal(line) for line in actual.splitlines() if line.strip()]   # blank lines don't count
    at, gap = 0, True            # the shown lines start anywhere in the output
    for want in expected:
        if want.strip() in ("...", "…"):
            gap = True
            continue
        if not want.strip():
            continue
        pattern = re.compile("^" + ".*?".join(map(re.escape, _normal(want).split("…"))) + "$")
        for index in range(at, len(lines) if gap else min(at + 1, len(lines))):
            if pattern.match(lines[index]):
                at, gap = index + 1, False
                break
        else:
            return want
    return None


class Reader:
    """Follows the tutorial in one directory, as a reader's shell would."""

    def __init__(self, workdir: Path, env: dict, echo: bool = False):
        self.cwd, self.env, self.echo = workdir, env, echo

    def run(self, section: Section) -> None:
        for step in section.steps:
            if step[0] == "file":
                self.write(*step[1:])
            else:
                self.command(*step[1:], section=section.title)

    def write(self, path: str, anchor: str | None, text: str) -> None:
        target = self.cwd / path
        if anchor:
            lines = target.read_text().splitlines(keepends=True)
            where = [i for i, line in enumerate(lines) if line.strip() == anchor]
            assert len(where) == 1, f"{path}: no single line {anchor!r} to insert above"
            lines[where[0]:where[0]] = [text, "\n"]
            target.write_text("".join(lines))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

    def command(self, command: str, expected: list[str], section: str) -> None:
        marker = "__WAYPOST_TUTORIAL_CWD__"
        proc = subprocess.run(["bash", "-c", f"set -eo pipefail\n{command}\necho {marker}\"$PWD\""],
                              cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=900)
        out = proc.stdout + proc.stderr
        text, _, cwd = proc.stdout.rpartition(marker)
        output = text + proc.stderr
        if self.echo:
            print(f"$ {command}\n{output.rstrip()}\n[exit {proc.returncode}]\n", flush=True)
        assert proc.returncode == 0, f"[{section}] `{command}` exited {proc.returncode}:\n{out[-6000:]}"
        self.cwd = Path(cwd.strip())
        if self.echo:
            return
        lost = missing_output(expected, output)
        assert lost is None, f"[{section}] `{command}`: the tutorial shows\n  {lost}\nbut it printed:\n{output[-6000:]}"


def reader_env(home: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "SNAKEMAKE_PROFILE")}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env['PATH']}", COLUMNS="100",
               TERM="dumb", **(extra or {}))
    return env


# -- pytest ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tutorial() -> list[Section]:
    found = sections(TUTORIAL.read_text())
    assert sum(len(s.steps) for s in found) > 20, "the tutorial has lost its commands"
    return found


@pytest.fixture(scope="module")
def on_this_machine(tutorial, tmp_path_factory) -> Path:
    """The sections that need nothing but this machine, run once."""
    base = tmp_path_factory.mktemp("tutorial")
    (base / "home").mkdir()
    reader = Reader(base, reader_env(base / "home"))
    for section in tutorial:
        if section.needs is None:
            reader.run(section)
    (base / "cwd").write_text(str(reader.cwd.relative_to(base)))
    return base


def test_shown_output_must_appear_in_order():
    printed = "a header\n\nstate: done in 1.2 s\nlast line\n"
    assert missing_output(["state: done in … s", "last line"], printed) is None
    assert missing_output(["a header", "...", "last line"], printed) is None
    assert missing_output(["last line", "a header"], printed) == "a header"           # order counts
    assert missing_output(["a header", "last line"], printed) == "last line"          # no gap without ...
    assert missing_output(["state: failed"], printed) == "state: failed"


def test_the_tutorial_runs_as_written_on_this_machine(on_this_machine):
    assert (on_this_machine / "fits" / "results").is_dir()


def _continue(base: Path, target: Path, tutorial, need: str, extra: dict | None = None) -> None:
    shutil.copytree(base, target, symlinks=True, copy_function=shutil.copy2)
    reader = Reader(target / (base / "cwd").read_text(), reader_env(target / "home", extra))
    ran = [section for section in tutorial if section.needs == need]
    assert ran, f"the tutorial has no section that needs {need}"
    for section in ran:
        reader.run(section)


def test_the_tutorial_on_slurm(on_this_machine, tutorial, tmp_path, slurm_cluster):
    _continue(on_this_machine, tmp_path / "t", tutorial, "slurm")


def test_the_tutorial_in_a_bucket(on_this_machine, tutorial, tmp_path, gcs_emulator):
    bucket = re.search(r"gs://([a-z0-9._-]+)", "".join(
        str(step) for s in tutorial if s.needs == "gcs" for step in s.steps)).group(1)
    from waypost.stores import gcs
    fs, _ = gcs.filesystem("gs://" + bucket)
    if not fs.exists(bucket):
        fs.mkdir(bucket)     # the tutorial says to make it with your cloud's tools
    _continue(on_this_machine, tmp_path / "t", tutorial, "gcs")


if __name__ == "__main__":     # print what each command really prints
    import tempfile
    wanted = sys.argv[1:]
    base = Path(tempfile.mkdtemp(prefix="tutorial-"))
    (base / "home").mkdir()
    reader = Reader(base, reader_env(base / "home"), echo=True)
    for section in sections(TUTORIAL.read_text()):
        if not wanted or section.needs is None or section.needs in wanted:
            print(f"=== {section.title}", flush=True)
            reader.run(section)
    print(f"(left in {base})")
