"""A Maestro study spec (``maestro run study.yaml [--pgen pgen.py]``) read
into a ``Study``: its ``description``, ``env`` (variables, labels,
dependencies), ``study`` steps and ``global.parameters``, or the points a
parameter generator makes.

What a step's ``run`` says and waypost keeps: ``cmd``, ``depends``,
``restart`` (run after a timeout: a cue on ``cmd.TIMEOUT``), ``walltime``
(the policy's ``runtime``), ``nodes``/``procs``/``exclusive`` (a worker
class). A key it can't keep is one line of ``Study.notes``.
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import types

import yaml

from waypost.ops.imports.study import SpecError, Step, Study, rule_name

#: Maestro's $(LAUNCHER), with its optional [nodes, procs] breakdown.
LAUNCHER = re.compile(r"\$\(LAUNCHER\)(\[[^\]]*\])?")
#: Keys of a step's ``run`` kept as they are or mapped; others are noted.
RUN_KEYS = frozenset({"cmd", "depends", "restart", "walltime", "nodes", "procs", "exclusive", "shell",
                      "restart_limit"})
#: Keys of a step's ``run`` that only tune a scheduler waypost's worker class covers.
SCHEDULER_KEYS = {"cores per task", "gpus", "tasks per rs", "rs per node", "bind", "bind gpus", "reservation",
                  "qos", "priority", "cpus per task", "use_mpi", "batch"}


def read_yaml(path: str, kind: str) -> dict:
    """A spec file's mapping; SpecError for a file that is missing or not YAML."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = yaml.safe_load(f)
    except OSError as exc:
        raise SpecError(f"{path}: can't be read ({exc.strerror or exc}): expected a {kind} spec") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise SpecError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("study"), list) or not spec["study"]:
        raise SpecError(f"{path}: expected a {kind} spec: a mapping with a `study:` list of steps")
    return spec


def read(path: str, pgen: str | None = None, pargs: list[str] | None = None) -> Study:
    spec = read_yaml(path, "Maestro")
    return study_of(spec, path, "Maestro", pgen, pargs)


def study_of(spec: dict, path: str, kind: str, pgen: str | None = None, pargs: list[str] | None = None,
             run_keys: frozenset = frozenset()) -> Study:
    """The parts Maestro and Merlin share: description, env, steps,
    parameters. ``run_keys``: the keys of a step's ``run`` the caller reads too."""
    description = spec.get("description") or {}
    if not isinstance(description, dict) or not description.get("name"):
        raise SpecError(f"{path}: description.name: required (the study's name)")
    study = Study(kind=kind, spec=path, name=rule_name(str(description["name"])),
                  description=str(description.get("description") or ""),
                  steps=[_step(path, i, s, RUN_KEYS | run_keys) for i, s in enumerate(spec["study"])])
    _environment(study, spec.get("env") or {})
    if "batch" in spec:
        study.notes.append(f"{path}: batch: the scheduler is waypost's profile's (--profile onprem: Slurm); its "
                           "partition, account and qos are config/workers.yaml's onprem pool (docs/workers.md)")
    _parameters(study, spec.get("global.parameters"), path)
    if pgen:   # (its env.find(name).value is the variable as the YAML holds it, a mapping too)
        _generated(study, pgen, pargs or [], _variables(spec.get("env") or {}))
    for step in study.steps:
        _launcher(study, step)
    return study


def _variables(env: dict) -> dict:
    """``env.variables`` by name, each as the YAML holds it."""
    return {str(k): v for k, v in (env.get("variables") or {}).items()}


def _environment(study: Study, env: dict) -> None:
    """``env``: its variables (``OUTPUT_PATH`` is the root), labels and dependencies."""
    variables = _variables(env)
    output_path = variables.pop("OUTPUT_PATH", None)
    if output_path is not None:
        study.root = os.path.normpath(str(output_path)) if "$(" not in str(output_path) else study.root
        study.fixed["OUTPUT_PATH"] = "{OUTPUT_PATH}"
    study.variables = {k: str(v) for k, v in variables.items()}
    study.labels = {str(k): str(v) for k, v in (env.get("labels") or {}).items()}
    study.fixed["WORKSPACE"] = "$WAYPOST_STAGE_DIR"
    study.fixed["SPECROOT"] = "{SPECROOT}"
    _dependencies(study, env.get("dependencies") or {})
    for key in env:
        if key not in ("variables", "labels", "dependencies", "sources"):
            study.notes.append(f"{study.spec}: env.{key}: not read by waypost import; write what it sets up by hand")


def _step(path: str, index: int, raw, known: frozenset) -> Step:
    where = f"study[{index}]"
    if not isinstance(raw, dict) or not raw.get("name") or not isinstance(raw.get("run"), dict):
        raise SpecError(f"{path}: {where}: expected a step with a name and a run: mapping")
    run = raw["run"]
    where = f"{where} ({raw['name']})"
    if not isinstance(run.get("cmd"), str):
        raise SpecError(f"{path}: {where}: run.cmd: required (the step's command)")
    depends = run.get("depends") or []
    if not isinstance(depends, list):
        raise SpecError(f"{path}: {where}: run.depends: expected a list of steps")
    step = Step(name=str(raw["name"]), cmd=run["cmd"], where=where, description=str(raw.get("description") or ""),
                restart=run.get("restart"), depends=[str(d) for d in depends], shell=run.get("shell"))
    if run.get("walltime"):
        step.runtime = _minutes(path, where, run["walltime"])
        step.policy["runtime"] = step.runtime
    step.placement = {k: run[k] for k in ("nodes", "procs", "exclusive") if run.get(k)}
    if step.restart:   # (Maestro restarts a step after a timeout, up to its --rlimit: 1)
        step.policy["cues"] = [{"action": "restart", "when": "cmd.TIMEOUT"}]
        step.policy["max_attempts"] = 1 + int(run.get("restart_limit", 1) or 1)
    step.notes = [_unread(path, where, key) for key in run if key not in known]
    return step


def _unread(path: str, where: str, key: str) -> str:
    if key in SCHEDULER_KEYS:
        return f"{path}: {where}: run.{key}: not mapped; set it in config/workers.yaml's class for the step"
    return f"{path}: {where}: run.{key}: not read by waypost import; write its effect by hand"


def _minutes(path: str, where: str, walltime) -> float:
    """``HH:MM:SS`` (or ``MM:SS``, or seconds) in minutes."""
    text = str(walltime).strip()
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        raise SpecError(f"{path}: {where}: run.walltime: {text!r}: expected HH:MM:SS") from None
    if len(parts) == 1:   # (a bare number: minutes, as Slurm's --time reads it)
        return parts[0]
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + part
    return round(seconds / 60, 4)


def _dependencies(study: Study, dependencies: dict) -> None:
    """``paths`` are names for paths; ``git`` a rule that clones the
    repository where Maestro would (``path/name``), read by the steps that
    name it."""
    for i, item in enumerate(dependencies.get("paths") or []):
        if not isinstance(item, dict) or "name" not in item or "path" not in item:
            raise SpecError(f"{study.spec}: env.dependencies.paths[{i}]: expected a name and a path")
        study.variables[str(item["name"])] = str(item["path"])
    for i, item in enumerate(dependencies.get("git") or []):
        if not isinstance(item, dict) or not all(k in item for k in ("name", "path", "url")):
            raise SpecError(f"{study.spec}: env.dependencies.git[{i}]: expected a name, a path and a url")
        name = str(item["name"])
        where = os.path.join(str(item["path"]), name)
        study.git[name] = {"path": where, "url": str(item["url"]), "tag": item.get("tag")}
    for key in dependencies:
        if key not in ("paths", "git"):
            study.notes.append(f"{study.spec}: env.dependencies.{key}: not read by waypost import; fetch it by hand")


def _parameters(study: Study, parameters, path: str) -> None:
    if not parameters:
        return
    if not isinstance(parameters, dict):
        raise SpecError(f"{path}: global.parameters: expected parameter → {{values, label}}")
    for name, entry in parameters.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("values"), list):
            raise SpecError(f"{path}: global.parameters.{name}: expected values: [...] and a label")
        study.parameters[str(name)] = entry["values"]
        if entry.get("label"):
            study.param_labels[str(name)] = str(entry["label"])


class _ParameterGenerator:
    """Maestro's ``ParameterGenerator``, as much as a pgen function uses of it."""

    def __init__(self):
        self.parameters: dict[str, list] = {}
        self.labels: dict[str, str] = {}
        self.names: dict[str, str] = {}

    def add_parameter(self, key, values, label=None, name=None):
        self.parameters[key] = list(values)
        self.labels[key] = label or f"{key}.%%"
        self.names[key] = name or key


class _Environment:
    """What a pgen function's ``env`` offers: ``env.find(name).value``."""

    def __init__(self, variables: dict):
        self._values = {k: types.SimpleNamespace(name=k, value=v) for k, v in variables.items()}

    def find(self, name):
        return self._values.get(name)


def _generated(study: Study, pgen: str, pargs: list[str], env_values: dict) -> None:
    """The points of a parameter generator (``--pgen``): its
    ``get_custom_generator(env, **kwargs)``, run here with ``--pargs``."""
    kwargs = {}
    for parg in pargs:
        key, sep, value = parg.partition(":")
        if not sep:
            raise SpecError(f"--pargs {parg!r}: expected KEY:VALUE")
        kwargs[key.strip()] = value.strip()
    module = types.ModuleType("maestrowf.datastructures.core")
    module.ParameterGenerator = _ParameterGenerator
    shims = {"maestrowf": types.ModuleType("maestrowf"),
             "maestrowf.datastructures": types.ModuleType("maestrowf.datastructures"),
             "maestrowf.datastructures.core": module}
    saved = {name: sys.modules.get(name) for name in shims}
    sys.modules.update(shims)
    try:
        namespace = runpy.run_path(pgen)
        make = namespace.get("get_custom_generator")
        if not callable(make):
            raise SpecError(f"{pgen}: no get_custom_generator(env, **kwargs) function (Maestro's pgen interface)")
        generator = make(_Environment(env_values), **kwargs)
    except OSError as exc:
        raise SpecError(f"{pgen}: can't be read ({exc.strerror or exc})") from None
    except SpecError:
        raise
    except Exception as exc:   # (the user's generator: its own error, in one line)
        raise SpecError(f"{pgen}: get_custom_generator failed: {type(exc).__name__}: {exc}") from None
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    parameters = getattr(generator, "parameters", None)
    if not isinstance(parameters, dict) or not parameters:
        raise SpecError(f"{pgen}: get_custom_generator returned no parameters")
    if study.parameters:
        study.notes.append(f"{study.spec}: global.parameters: replaced by the points of {pgen}, as Maestro does")
    study.parameters = {}
    count = len(next(iter(parameters.values())))
    study.table = [{key: values[i] for key, values in parameters.items()} for i in range(count)]
    study.param_labels = {k: v for k, v in (getattr(generator, "labels", None) or {}).items() if v}


def _launcher(study: Study, step: Step) -> None:
    """``$(LAUNCHER)`` (with or without its ``[nodes, procs]``) is the
    Snakefile's ``LAUNCHER``: empty (the command as it is) until set."""
    if LAUNCHER.search(step.cmd) or (step.restart and LAUNCHER.search(step.restart)):
        step.cmd = LAUNCHER.sub("$(LAUNCHER)", step.cmd)
        if step.restart:
            step.restart = LAUNCHER.sub("$(LAUNCHER)", step.restart)
        study.variables.setdefault("LAUNCHER", "")
        if not any("$(LAUNCHER)" in note for note in study.notes):
            study.notes.append(f"{study.spec}: $(LAUNCHER): the Snakefile's LAUNCHER, empty (each command runs as "
                               "it is); set it to your MPI launcher (srun, mpirun -n ...) for the steps that use it")
