"""The package's shape: its layers import downward only, with no circle
inside a layer; of waypost's modules only the wiring's (``planning/wiring/``)
import Snakemake, and only its ``internals`` touch Snakemake's private parts;
Snakemake's plugins (executor, logger, storage) sit on top, beside the
Snakefile's front; reading a config (what the ``waypost`` commands do
first) does not import Snakemake at all; outside ``stores/``, waypost and
its plugins import the stores' package alone, never one of its modules
(a root's backend is the registry's to pick). Imports are read wherever they are
in a module (a function-level one counts), and ``importlib.import_module``
or ``__import__`` of a literal name counts as one."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

SRC = REPO / "src" / "waypost"
#: Snakemake's plugins for waypost: adapters over waypost's layers, which
#: none of them imports, and which don't import one another. Any package
#: named ``snakemake_KIND_plugin_waypost[_MORE]`` is one (a scheduler's
#: executor adapter beside Slurm's included), checked without being listed.
PLUGINS = tuple(sorted(p.name for p in (REPO / "src").glob("snakemake_*_plugin_waypost*") if p.is_dir()))
#: The executor plugin's modules that are written once for any scheduler
#: (docs/architecture.md): another scheduler's executor adapter
#: (``snakemake_executor_plugin_waypost_NAME``) is built over them, and so
#: may import them; nothing else of a plugin is another's to import.
EXECUTOR_CORE = ("snakemake_executor_plugin_waypost.execution", "snakemake_executor_plugin_waypost.rounds",
                 "snakemake_executor_plugin_waypost.stagejobs", "snakemake_executor_plugin_waypost.bundles")
#: The one package of waypost that touches Snakemake's objects, its plugins'
#: included (the plugins are Snakemake's side), and its one module that
#: touches Snakemake's private parts and globals.
WIRING = "planning/wiring/"
INTERNALS = "planning/wiring/internals.py"

# The layers, lowest first (docs/architecture.md). A module may import its
# own layer and those below; layers on one rank don't import each other.
# The package's top (``waypost.snakemake``, the Snakefile's front) may
# import any layer, and no layer imports it.
LAYERS = {"model": 0, "stores": 1, "scheduler": 1, "state": 2, "planning": 3, "runner": 3, "ops": 4, "cli": 5}
IMPORTERS = {"import_module", "__import__"}   # (importlib's, and the builtin)


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, wherever it is:
    ``from x import name`` names both ``x`` and ``x.name`` (a submodule
    counts); a relative import is ``(relative)``; an ``import_module`` or
    ``__import__`` call names its literal argument, or ``(dynamic)`` when it
    has none the check can read."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "(relative)"))
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, node.module or ""), *((node.lineno, f"{node.module}.{a.name}") for a in node.names)]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.Call) and _called(node.func) in IMPORTERS:
            arg = node.args[0] if node.args else None
            literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            found.append((node.lineno, arg.value if literal else "(dynamic)"))
    return found


def _called(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _top(module: str) -> str:
    return module.split(".")[0]


def is_plugin(name: str) -> bool:
    """Is a top-level package (a module's first name) one of waypost's Snakemake plugins?"""
    return name in PLUGINS or (name.startswith("snakemake_") and "_plugin_waypost" in name)


def _executor_adapter_over_core(plugin: str, module: str) -> bool:
    """A scheduler's executor adapter importing the executor's shared core."""
    return (plugin.startswith("snakemake_executor_plugin_waypost_")
            and any(module == core or module.startswith(core + ".") for core in EXECUTOR_CORE))


def snakemake_imports(path: Path) -> list[str]:
    return [name for _, name in imported_names(path) if _top(name) == "snakemake"]


def waypost_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of waypost, a plugin, a relative one
    or one the check can't read."""
    return [(line, name) for line, name in imported_names(path)
            if _top(name) == "waypost" or name in ("(relative)", "(dynamic)") or is_plugin(_top(name))]


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def upward_imports(src: Path) -> list[str]:
    """Every import in the package that goes up, or sideways between layers
    of one rank, or to the package's top or a plugin, or is relative (which
    hides where it goes), or can't be read. The package's top modules may
    import any layer; only the wiring may import a plugin."""
    wrong = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if rel.parts[0] == "template":
            continue
        here = rel.parts[0] if len(rel.parts) > 1 else None
        for line, module in waypost_imports(path):
            there = layer_of(module)
            if module == "(relative)":
                wrong.append(f"{rel}:{line}: a relative import (spell it waypost.LAYER.module)")
            elif module == "(dynamic)":
                wrong.append(f"{rel}:{line}: an import of a name the check can't read (import it by name)")
            elif is_plugin(_top(module)) and not in_wiring(rel):   # (Snakemake's side: the wiring's to touch)
                wrong.append(f"{rel}:{line}: imports Snakemake's plugin {module}")
            elif here is None:
                continue
            elif module == "waypost.snakemake" or module.startswith("waypost.snakemake."):
                wrong.append(f"{rel}:{line}: imports the package's top, {module}")
            elif there and there != here and LAYERS[there] >= LAYERS[here]:
                wrong.append(f"{rel}:{line}: {here} imports {module} ({there})")
    return wrong


def plugin_imports(src: Path) -> list[str]:
    """Every import in a plugin package (the folders of ``src`` named as
    plugins are) of another plugin (but for a scheduler's executor adapter
    importing the executor's shared core), or of a name the check can't read."""
    wrong = []
    for plugin in sorted(p.name for p in src.iterdir() if p.is_dir() and is_plugin(p.name)):
        for path in sorted((src / plugin).rglob("*.py")):
            for line, module in imported_names(path):
                if module == "(dynamic)":
                    wrong.append(f"{path.relative_to(src)}:{line}: an import of a name the check can't read")
                elif is_plugin(_top(module)) and _top(module) != plugin \
                        and not _executor_adapter_over_core(plugin, module):
                    wrong.append(f"{path.relative_to(src)}:{line}: imports another plugin, {module}")
    return wrong


def store_module_imports(root: Path) -> list[str]:
    """Every import, in waypost outside ``stores/`` or in a plugin (the
    folders of ``root``: ``waypost`` and the plugins'), of one of
    the stores' modules (``waypost.stores.gcs``, ``from waypost.stores
    import gcs``, an ``import_module`` of one): the rest of waypost asks the
    package, ``waypost.stores``, which asks the root's backend
    (``stores/registry.py``)."""
    folder = root / "waypost" / "stores"
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | \
        {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    wrong = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if (rel.parts[0] != "waypost" and not is_plugin(rel.parts[0])) or rel.parts[:2] == ("waypost", "stores") or "template" in rel.parts:
            continue
        found = {(line, ".".join(module.split(".")[:3])) for line, module in imported_names(path)
                 if module.split(".")[:2] == ["waypost", "stores"] and module.count(".") >= 2
                 and module.split(".")[2] in modules}
        wrong += [f"{rel}:{line}: imports {module} (import waypost.stores, the package)" for line, module in sorted(found)]
    return wrong


def in_wiring(rel: Path) -> bool:
    """Is a module (its path in the package) one of the wiring's?"""
    return str(rel).startswith(WIRING)


def module_name(src: Path, path: Path) -> str:
    parts = [src.name, *path.relative_to(src).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def circles(src: Path) -> list[list[str]]:
    """The import circles among the package's modules (each a sorted list of
    two or more modules that import one another, through any path), found
    with Tarjan's strongly connected components. ``from package import
    module`` is an edge to the module alone, not to the package's
    ``__init__``."""
    paths = {module_name(src, p): p for p in src.rglob("*.py") if "template" not in p.relative_to(src).parts}
    edges = {name: set() for name in paths}
    for name, path in paths.items():
        for _, module in imported_names(path):
            if module in paths and module != name:
                edges[name].add(module)
        for node in ast.walk(ast.parse(path.read_text())):   # ``from package import module``: not the package
            if isinstance(node, ast.ImportFrom) and not node.level and node.module in edges[name] and \
                    all(f"{node.module}.{a.name}" in paths for a in node.names):
                edges[name].discard(node.module)
    return _strongly_connected(edges)


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for after in sorted(edges[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in on_stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_layers_import_downward_only():
    assert upward_imports(SRC) == []


def test_plugins_import_waypost_and_no_other_plugin():
    assert plugin_imports(SRC.parent) == []


def test_no_import_circle_in_the_package():
    assert circles(SRC) == []


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check above can fail: a model module that asks a store, a store
    that asks the planning, a runner module that asks the planning (one
    rank), a function-level import of the CLI, an ``importlib`` import of a
    layer above, one of a name it can't read, and an import of a plugin
    (from the package's top too) are all caught."""
    _plant(tmp_path, {"model/shape.py": "from waypost import stores\n",
                      "stores/disk.py": "def f():\n    from waypost.planning import wiring\n",
                      "runner/step.py": "from waypost.planning.fanout import Fanout\n",
                      "ops/tidy.py": "from waypost.cli import main\nfrom waypost.model import states\n",
                      "state/view.py": "from . import lifecycle\n",
                      "state/late.py": "import importlib\ndef f(name):\n    importlib.import_module('waypost.ops.plan')\n"
                                       "    return __import__(name)\n",
                      "front.py": "import snakemake_executor_plugin_waypost\nfrom waypost.cli import main\n"})
    assert upward_imports(tmp_path) == [
        "front.py:1: imports Snakemake's plugin snakemake_executor_plugin_waypost",
        "model/shape.py:1: model imports waypost.stores (stores)",
        "ops/tidy.py:1: ops imports waypost.cli (cli)",
        "ops/tidy.py:1: ops imports waypost.cli.main (cli)",
        "runner/step.py:1: runner imports waypost.planning.fanout (planning)",
        "runner/step.py:1: runner imports waypost.planning.fanout.Fanout (planning)",
        "state/late.py:3: state imports waypost.ops.plan (ops)",
        "state/late.py:4: an import of a name the check can't read (import it by name)",
        "state/view.py:1: a relative import (spell it waypost.LAYER.module)",
        "stores/disk.py:2: stores imports waypost.planning (planning)",
        "stores/disk.py:2: stores imports waypost.planning.wiring (planning)",
    ]


def test_the_plugin_check_sees_a_plugin_importing_another(tmp_path):
    _plant(tmp_path, {"snakemake_logger_plugin_waypost/__init__.py": "from . import x\nfrom waypost.model import events\n",
                      "snakemake_storage_plugin_waypost/__init__.py":
                          "def f():\n    from snakemake_executor_plugin_waypost import bundles\n"})
    assert plugin_imports(tmp_path) == [
        "snakemake_storage_plugin_waypost/__init__.py:2: imports another plugin, snakemake_executor_plugin_waypost",
        "snakemake_storage_plugin_waypost/__init__.py:2: imports another plugin, "
        "snakemake_executor_plugin_waypost.bundles"]


def test_a_second_schedulers_adapter_may_build_on_the_executor_core_alone(tmp_path):
    """Another scheduler's executor adapter (docs/architecture.md: a module
    in ``scheduler/`` and a thin adapter) needs no allowance here: it is
    found by its name, may import the executor's shared core, and nothing
    else of another plugin."""
    _plant(tmp_path, {"snakemake_executor_plugin_waypost_pbs/__init__.py":
                          "from snakemake_executor_plugin_waypost.execution import WaypostExecution\n"
                          "from snakemake_executor_plugin_waypost.rounds import StatusRounds\n"
                          "from snakemake_executor_plugin_waypost.slurm_private import submit\n"
                          "from snakemake_logger_plugin_waypost import LogHandler\n"})
    assert plugin_imports(tmp_path) == [
        "snakemake_executor_plugin_waypost_pbs/__init__.py:3: imports another plugin, "
        "snakemake_executor_plugin_waypost.slurm_private",
        "snakemake_executor_plugin_waypost_pbs/__init__.py:3: imports another plugin, "
        "snakemake_executor_plugin_waypost.slurm_private.submit",
        "snakemake_executor_plugin_waypost_pbs/__init__.py:4: imports another plugin, snakemake_logger_plugin_waypost",
        "snakemake_executor_plugin_waypost_pbs/__init__.py:4: imports another plugin, "
        "snakemake_logger_plugin_waypost.LogHandler"]


def test_only_the_stores_import_their_modules():
    assert store_module_imports(SRC.parent) == []


def test_the_stores_check_sees_an_import_of_a_store_module(tmp_path):
    """An import of a stores module outside ``stores/`` is caught however it
    is spelled (``from waypost.stores import gcs``, ``from
    waypost.stores.mirror import ...``, ``import waypost.stores.gcs``, an
    ``importlib`` import, at function level, in a plugin); the package and
    its names (``store_for``), and the stores' own imports, are not."""
    _plant(tmp_path, {"waypost/stores/__init__.py": "from waypost.stores.registry import backend_of\n",
                      "waypost/stores/registry.py": "", "waypost/stores/gcs.py": "", "waypost/stores/walk.py": "",
                      "waypost/stores/mirror.py": "from waypost.stores import gcs\n",
                      "waypost/stores/local.py": "from waypost.stores import walk\n",
                      "waypost/planning/holds.py": "from waypost import stores\nfrom waypost.stores import SCHEME, gcs\n"
                                                   "from waypost.stores import store_for\n",
                      "waypost/cli/run.py": "def f():\n    from waypost.stores.mirror import snakemake_options\n",
                      "waypost/runner/late.py": "import importlib\nimport waypost.stores\nimport waypost.stores.gcs\n"
                                                "def f():\n    return importlib.import_module('waypost.stores.local')\n",
                      "snakemake_storage_plugin_waypost/__init__.py": "from waypost.stores.gcs import mtime_of\n"
                                                                      "from waypost.stores import listing\n"})
    assert store_module_imports(tmp_path) == [
        "snakemake_storage_plugin_waypost/__init__.py:1: imports waypost.stores.gcs (import waypost.stores, the package)",
        "waypost/cli/run.py:2: imports waypost.stores.mirror (import waypost.stores, the package)",
        "waypost/planning/holds.py:2: imports waypost.stores.gcs (import waypost.stores, the package)",
        "waypost/runner/late.py:3: imports waypost.stores.gcs (import waypost.stores, the package)",
        "waypost/runner/late.py:5: imports waypost.stores.local (import waypost.stores, the package)",
    ]


def test_the_circle_check_sees_a_circle_inside_a_layer(tmp_path):
    """Two model modules importing each other (one at function level), and
    a package's ``__init__`` whose submodule imports a name from it, are
    circles; a submodule imported by ``from package import module`` is
    not one with the package."""
    src = _plant(tmp_path / "waypost", {
        "__init__.py": "",
        "model/__init__.py": "",
        "model/config.py": "def f():\n    from waypost.model import paramsets\n",
        "model/paramsets.py": "from waypost.model import config as wconfig\n",
        "stores/__init__.py": "from waypost.stores.gcs import probe\nSCHEME = 'gs://'\n",
        "stores/gcs.py": "from waypost.stores import SCHEME\n",
        "stores/local.py": "from waypost.stores import walk\n",
        "stores/walk.py": "import os\n"})
    assert circles(src) == [["waypost.model.config", "waypost.model.paramsets"],
                            ["waypost.stores", "waypost.stores.gcs"]]


def test_only_the_wiring_imports_snakemake():
    """Of waypost's modules, the wiring's alone import Snakemake (by name or
    through ``importlib``); the plugins are Snakemake's side."""
    assert snakemake_imports(SRC / INTERNALS)
    found = {str(p.relative_to(SRC)): snakemake_imports(p) for p in sorted(SRC.rglob("*.py"))
             if "template" not in p.relative_to(SRC).parts and not in_wiring(p.relative_to(SRC))}
    assert {name: names for name, names in found.items() if names} == {}


def private_touches(path: Path) -> list[str]:
    """Where a module reads or sets a private member (``x._name``, not a
    dunder) of anything but ``self``, or assigns to an attribute of a name
    it imported from Snakemake (one of its classes or modules: a global of
    Snakemake's replaced)."""
    tree = ast.parse(path.read_text())
    from_snakemake = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
                      if isinstance(node, (ast.Import, ast.ImportFrom))
                      and _top((node.module if isinstance(node, ast.ImportFrom) else node.names[0].name) or "") == "snakemake"
                      for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            found.append((node.lineno, f"{path.name}:{node.lineno}: {ast.unparse(node)}"))
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                root = target
                while isinstance(root, ast.Attribute):
                    root = root.value
                if target is not root and isinstance(root, ast.Name) and root.id in from_snakemake:
                    found.append((node.lineno, f"{path.name}:{node.lineno}: {ast.unparse(target)} ="))
    return [said for _, said in sorted(found)]


def test_only_the_internals_touch_snakemakes_private_parts():
    """Every private part of Snakemake that waypost touches, and every
    global of Snakemake it replaces, is in one module, with the versions
    tested (``planning/wiring/internals.py``)."""
    assert private_touches(SRC / INTERNALS)
    found = [touch for p in sorted((SRC / WIRING).glob("*.py")) if str(p.relative_to(SRC)) != INTERNALS
             for touch in private_touches(p)]
    assert found == []


def test_an_untested_snakemake_is_said_in_one_line():
    from waypost.planning.wiring import internals
    internals.check()   # the installed Snakemake is a tested one
    with pytest.raises(internals.UntestedSnakemake) as raised:
        internals.check("10.1.0")
    assert "\n" not in str(raised.value) and "snakemake 10.1.0 is installed" in str(raised.value)


def test_the_private_check_sees_a_touch(tmp_path):
    """A private member of another object read or set, and a Snakemake
    class's or module's attribute replaced, are caught; ``self``'s own
    private members, dunders and a public attribute of a rule are not."""
    path = _plant(tmp_path, {"rules.py": "import snakemake.script\nfrom snakemake.jobs import Job\n"
                                         "def f(rule, self):\n    rule._input = []\n    self._own = 1\n"
                                         "    Job.outputs_older = None\n    snakemake.script.shell = print\n"
                                         "    rule.expand_input = None\n    return rule.input._names, self.__dict__\n"}) / "rules.py"
    assert private_touches(path) == ["rules.py:4: rule._input", "rules.py:6: Job.outputs_older =",
                                     "rules.py:7: snakemake.script.shell =", "rules.py:9: rule.input._names"]


def test_the_snakemake_check_sees_an_import_anywhere(tmp_path):
    path = _plant(tmp_path, {"runner/steplog.py": "import json\ndef f():\n    import snakemake.io\n"
                                                  "    return __import__('snakemake')\n"}) / "runner" / "steplog.py"
    assert snakemake_imports(path) == ["snakemake.io", "snakemake"]


def test_reading_a_config_does_not_import_snakemake():
    code = ("import sys\nfrom waypost.model import graph\n"
            f"graph.load_config({str(REPO / 'workflow')!r}, graph.facts({str(REPO / 'config' / 'config.yaml')!r}, "
            f"{str(REPO / 'workflow')!r}))\n"
            "print(sorted(m for m in sys.modules if m == 'snakemake' or m.startswith('snakemake.')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
