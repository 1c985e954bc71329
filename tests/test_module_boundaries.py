"""The package's shape: its layers import downward only, and of the parts
behind the Snakefile helpers only the wiring imports Snakemake; reading a
config (what the ``waypost`` commands do first) does not import it at all."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SRC = REPO / "src" / "waypost"
# The helpers' parts (see waypost.snakemake's docstring): the one module
# that touches Snakemake's objects, and those that ask it.
WIRING = "planning/wiring.py"
ASKING = ("snakemake.py", "planning/stagegraph.py", "planning/resolver.py", "planning/stateview.py",
          "planning/stepline.py", "model/codeversion.py", "planning/holds.py", "planning/targets.py",
          "planning/fanout.py", "model/graph.py", "model/config.py")

# The layers, lowest first (docs/architecture.md). A module may import its
# own layer and those below; layers on one rank don't import each other.
# The package's top (``waypost.snakemake``, the Snakefile's front) may
# import any layer, and no layer imports it.
LAYERS = {"model": 0, "stores": 1, "scheduler": 1, "state": 2, "planning": 3, "runner": 3, "ops": 4, "cli": 5}


def snakemake_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [name for name in names if name == "snakemake" or name.startswith("snakemake.")]
    return found


def waypost_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every waypost module ``path`` imports, anywhere in it
    (a function-level import counts too); ``from waypost.x import name``
    names both ``waypost.x`` and ``waypost.x.name``, so a submodule counts."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "(relative)"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "waypost":
            found += [(node.lineno, node.module), *((node.lineno, f"{node.module}.{a.name}") for a in node.names)]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "waypost"]
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def upward_imports(src: Path) -> list[str]:
    """Every import in the package that goes up, or sideways between layers
    of one rank, or to the package's top, or is relative (which hides where
    it goes)."""
    wrong = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if rel.parts[0] == "template" or len(rel.parts) < 2:
            continue
        here = rel.parts[0]
        for line, module in waypost_imports(path):
            there = layer_of(module)
            if module == "(relative)":
                wrong.append(f"{rel}:{line}: a relative import (spell it waypost.LAYER.module)")
            elif module == "waypost.snakemake" or module.startswith("waypost.snakemake."):
                wrong.append(f"{rel}:{line}: imports the package's top, {module}")
            elif there and there != here and LAYERS[there] >= LAYERS[here]:
                wrong.append(f"{rel}:{line}: {here} imports {module} ({there})")
    return wrong


def test_layers_import_downward_only():
    assert upward_imports(SRC) == []


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check above can fail: a model module that asks a store, a store
    that asks the planning, a runner module that asks the planning (one
    rank) and a function-level import of the CLI are all caught."""
    for rel, text in {"model/shape.py": "from waypost import stores\n",
                      "stores/disk.py": "def f():\n    from waypost.planning import wiring\n",
                      "runner/step.py": "from waypost.planning.fanout import Fanout\n",
                      "ops/tidy.py": "from waypost.cli import main\nfrom waypost.model import states\n",
                      "state/view.py": "from . import lifecycle\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert upward_imports(tmp_path) == [
        "model/shape.py:1: model imports waypost.stores (stores)",
        "ops/tidy.py:1: ops imports waypost.cli (cli)",
        "ops/tidy.py:1: ops imports waypost.cli.main (cli)",
        "runner/step.py:1: runner imports waypost.planning.fanout (planning)",
        "runner/step.py:1: runner imports waypost.planning.fanout.Fanout (planning)",
        "state/view.py:1: a relative import (spell it waypost.LAYER.module)",
        "stores/disk.py:2: stores imports waypost.planning (planning)",
        "stores/disk.py:2: stores imports waypost.planning.wiring (planning)",
    ]


def test_only_the_wiring_imports_snakemake():
    assert snakemake_imports(SRC / WIRING)
    assert {name: snakemake_imports(SRC / name) for name in ASKING} == {name: [] for name in ASKING}


def test_reading_a_config_does_not_import_snakemake():
    code = ("import sys\nfrom waypost.model import graph\n"
            f"graph.load_config({str(REPO / 'workflow')!r}, graph.facts({str(REPO / 'config' / 'config.yaml')!r}, "
            f"{str(REPO / 'workflow')!r}))\n"
            "print(sorted(m for m in sys.modules if m == 'snakemake' or m.startswith('snakemake.')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
