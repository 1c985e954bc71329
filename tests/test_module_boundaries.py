"""Where Snakemake is touched: of the parts behind the Snakefile helpers,
only the wiring imports Snakemake, and reading a config (what the
``waypost`` commands do first) does not import it at all."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SRC = REPO / "src" / "waypost"
# The helpers' parts (see waypost.snakemake's docstring): the one module
# that touches Snakemake's objects, and those that ask it.
WIRING = "wiring.py"
ASKING = ("snakemake.py", "stagegraph.py", "resolver.py", "stateview.py", "stepline.py", "codeversion.py",
          "holds.py", "targets.py", "fanout.py", "graph.py", "config.py")


def snakemake_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [name for name in names if name == "snakemake" or name.startswith("snakemake.")]
    return found


def test_only_the_wiring_imports_snakemake():
    assert snakemake_imports(SRC / WIRING)
    assert {name: snakemake_imports(SRC / name) for name in ASKING} == {name: [] for name in ASKING}


def test_reading_a_config_does_not_import_snakemake():
    code = ("import sys\nfrom waypost import graph\n"
            f"graph.load_config({str(REPO / 'config' / 'config.yaml')!r}, {str(REPO / 'workflow')!r})\n"
            "print(sorted(m for m in sys.modules if m == 'snakemake' or m.startswith('snakemake.')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
