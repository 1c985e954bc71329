"""The reference pages are committed with their generated tables (they read
on disk as on the site), made again from the code they describe; `waypost
--help` points to them; the study page shows the example as it is."""

from __future__ import annotations

import difflib
import importlib.util
import subprocess
import sys

from conftest import REPO

DOCS = REPO / "docs"


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_what_the_code_makes(tmp_path):
    generator = hooks()
    pages = generator.pages(str(DOCS))
    assert {"reference/config.md", "reference/cli.md"} <= set(pages)
    generator.write_pages(str(DOCS), str(tmp_path))
    stale = {}
    for page in pages:
        committed, fresh = (DOCS / page).read_text(), (tmp_path / page).read_text()
        if committed != fresh:
            stale[page] = "".join(list(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                                            f"docs/{page} (committed)", "generated now"))[:40])
    assert not stale, ("stale generated reference (run `make reference` and commit the pages):\n"
                       + "\n".join(stale.values()))


def test_the_pages_hold_the_tables_a_reader_looks_for():
    config = (DOCS / "reference" / "config.md").read_text()
    for row in ("| `max_attempts` | integer | `1` |", "| `check_timeout` | number | `60` |",
                "| `grid` |", "| `per_instance` |", "| `cues[].action` | `\"restart\"` \\| `\"rerun\"` \\|"):
        assert row in config, row
    cli = (DOCS / "reference" / "cli.md").read_text()
    for text in ("### `waypost status`", "### `waypost rerun`", "| `--instance` | only this instance", "--check"):
        assert text in cli, text


def test_a_stale_page_is_written_again_and_said(tmp_path):
    generator = hooks()
    page = tmp_path / "reference" / "cli.md"
    page.parent.mkdir()
    page.write_text("# The command\n\n<!-- reference: cli -->\nold text\n<!-- /reference -->\n\nafter\n")
    assert generator.write_pages(str(tmp_path)) == ["reference/cli.md"]
    text = page.read_text()
    assert "old text" not in text and "### `waypost plan`" in text and text.endswith("<!-- /reference -->\n\nafter\n")
    assert generator.write_pages(str(tmp_path)) == []   # current now: left alone


def test_help_points_to_the_reference():
    top = subprocess.run([sys.executable, "-m", "waypost.cli", "--help"], capture_output=True, text=True).stdout
    assert "docs/reference/cli.md" in top and "docs/reference/config.md" in top
    sub = subprocess.run([sys.executable, "-m", "waypost.cli", "rerun", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).stdout
    assert "all options of every command: docs/reference/cli.md" in sub and "docs/reference/config.md" in sub


def test_the_study_page_shows_the_example_as_it_is():
    page = (DOCS / "studies.md").read_text()
    example = REPO / "examples" / "param-study"
    for part in ("workflow/Snakefile", "config/config.yaml"):
        assert (example / part).read_text().rstrip() in page, f"docs/studies.md: examples/param-study/{part} differs"
    lines = sum(len((example / part).read_text().splitlines()) for part in ("workflow/Snakefile", "config/config.yaml"))
    assert lines <= 70, f"the study is {lines} lines of Snakefile and config"
