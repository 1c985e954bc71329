"""An imported study written out: ``workflow/Snakefile``, ``config/config.yaml``
(and ``config/points.csv`` for a table of points, ``config/workers.yaml``
for steps with nodes or tasks of their own).

The Snakefile is one a person keeps editing: a rule per step in the spec's
order, its command as the spec writes it with Snakemake's placeholders for
the spec's tokens, the spec's variables as the Snakefile's names.
"""

from __future__ import annotations

import csv
import io
import os

import yaml

from waypost.model import workers as wworkers
from waypost.ops.imports.study import DONE, TOKEN, Rule, Study, variable_name

HEREDOC = "WAYPOST_STEP"

HELPERS = '''

def workspace(rule, gathered=False):
    """$(step.workspace): the directory of the job of `rule` this one reads
    (the directory above all its jobs' when it gathers them)."""
    def of(wildcards, input):
        files = getattr(input, rule)
        path = os.path.dirname(os.path.abspath(files[0] if gathered else files))
        return os.path.dirname(path) if gathered else path
    return of
'''


def snakefile(study: Study, rules: list[Rule], specroot: str) -> str:
    """The Snakefile's text; ``specroot``: the spec's directory, relative
    to the Snakefile's."""
    kind = study.kind.lower()
    lines = [f"# {study.name}: {_one_line(study.description)}" if study.description else f"# {study.name}",
             f"# Imported from {os.path.basename(study.spec)} ({study.kind}) by `waypost import {kind}`: a rule per",
             f"# step of its study, run in the step's own directory ({DONE} says the command ended with 0).",
             "import os", "", "from waypost.snakemake import Pipeline", "", "wp = Pipeline(config, workflow)", "",
             f"# {study.kind} runs each step's command as a plain bash script (no `set -euo pipefail`).",
             'shell.prefix("")', "",
             ]
    lines += [f"{name} = {value}{f'   # {comment}' if comment else ''}" for name, value, comment in
              names_of(study, specroot)]
    if any(rule.rule_params.get(param, "").startswith("workspace(") for rule in rules for param in rule.rule_params):
        lines.append(HELPERS.rstrip("\n"))
    for name, dependency in study.git.items():
        lines += ["", "", _clone_rule(name, dependency)]
    for rule in rules:
        lines += ["", "", _rule(rule)]
    lines += ["", "", "wp.finish()", "", "rule all:", "    default_target: True", "    input: wp.targets", ""]
    return "\n".join(lines)


def names_of(study: Study, specroot: str) -> list[tuple[str, str, str]]:
    """The Snakefile's names for the spec's words: (name, Python
    expression, comment). Variables may name others written before them."""
    names = [("SPECROOT", f'os.path.normpath(os.path.join(workflow.basedir, "{specroot}"))',
              "$(SPECROOT): the spec's directory"),
             ("OUTPUT_PATH", 'os.path.abspath(config["root"])', "$(OUTPUT_PATH): the study's root")]
    if study.kind == "Merlin":
        names.append(("MERLIN_INFO", 'os.path.normpath(os.path.join(workflow.basedir, "..", "config"))',
                      "$(MERLIN_INFO): the study's samples are there"))
    known = {name for name, _, _ in names}
    for name, value in study.variables.items():
        names.append((variable_name(name), _expression(str(value), known), ""))
        known.add(variable_name(name))
    for name, dependency in study.git.items():
        # (a clone Maestro puts in its study's output path goes beside the root, not among its stage directories)
        path = _expression(dependency["path"].replace("$(OUTPUT_PATH)", "dependencies"), known)
        names.append((variable_name(name), f"os.path.abspath({path})", f"env.dependencies.git: {dependency['url']}"))
    return names


def _expression(text: str, known: set[str]) -> str:
    """A value with ``$(NAME)`` tokens as a Python expression: an f-string
    over the names written before it, or a plain string."""
    found = [m for m in TOKEN.finditer(text) if m.group(2) is None and variable_name(m.group(1)) in known]
    if not found:
        return _python_text(text)
    escaped = text.replace("{", "{{").replace("}", "}}")
    body = TOKEN.sub(lambda m: f"{{{variable_name(m.group(1))}}}"
                     if m.group(2) is None and variable_name(m.group(1)) in known else m.group(0), escaped)
    return "f" + _python_text(body)


def _clone_rule(name: str, dependency: dict) -> str:
    """A rule that clones a git dependency where the steps read it."""
    checkout = f" && git -C {{output}} checkout {dependency['tag']}" if dependency.get("tag") else ""
    return "\n".join([f"rule clone_{variable_name(name)}:",
                      f'    "env.dependencies.git: {name}"',
                      f"    output: directory({variable_name(name)})",
                      f'    shell: "git clone {dependency["url"]} {{output}}{checkout}"'])


def _rule(rule: Rule) -> str:
    step = rule.step
    lines = [f"rule {rule.name}:"]
    if step.description:
        lines.append(f"    {_python_text(_one_line(step.description))}")
    if rule.inputs:
        lines.append("    input: " + ", ".join(f"{name}={expr}" for name, expr in rule.inputs.items()))
    if rule.funnel:
        instances = ", funnel=True"
    elif not rule.params:
        instances = ""
    elif rule.every_parameter:
        instances = ", instances=wp.grid"
    else:
        instances = f", instances=wp.grid.per({', '.join(repr(p) for p in rule.params)})".replace("'", '"')
    lines.append(f'    output: done=wp.out("{DONE}"{instances})')
    if rule.rule_params:
        lines.append("    params: " + ", ".join(f"{name}={expr}" for name, expr in rule.rule_params.items()))
    if rule.worker:
        lines.append(f'    resources: worker="{rule.worker}"')
    lines.append("    shell: " + _command_text(rule.command, step.shell))
    return "\n".join(lines)


def _command_text(command: str, interpreter: str | None) -> str:
    return _python_text(wrapped(command, interpreter), raw=True)


def wrapped(command: str, interpreter: str | None) -> str:
    """A step's command as its rule runs it: and ``step.done`` when it
    ended with status 0 (through the interpreter the step names, as a here-document)."""
    body = command.strip("\n")
    if interpreter and interpreter.strip() not in ("/bin/bash", "bash", "/usr/bin/env bash", "/bin/sh", "sh"):
        return f"{interpreter.strip()} <<'{HEREDOC}' && touch {{output.done}}\n{body}\n{HEREDOC}"
    return f"(\n{body}\n) && touch {{output.done}}"


def _python_text(value, raw: bool = False) -> str:
    """A Python literal of a string (a raw triple-quoted one for commands:
    their backslashes stay as written)."""
    text = str(value)
    if raw and '"""' not in text and not text.endswith("\\"):
        return f'r"""{text}"""' if "\n" in text or '"' in text else f'r"{text}"'
    if "\n" in text:
        return repr(text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def config_text(study: Study, rules: list[Rule], points_file: str | None) -> str:
    """``config/config.yaml``: the root, the study's points, each step's policy."""
    experiment: dict = {}
    if points_file:
        experiment["table"] = points_file
    elif study.parameters:
        experiment["zip"] = study.parameters
    if study.param_labels and (points_file or study.parameters):
        experiment["labels"] = study.param_labels
    stages = {}
    for rule in rules:
        policy = dict(rule.step.policy)
        if rule.restart:
            policy["restart"] = wrapped(rule.restart, rule.step.shell)
        if policy:
            stages[rule.name] = {"policy": policy}
    config = {"root": study.root, "policy": {"workdir": "stage"}, "experiments": {study.name: experiment}}
    if stages:
        config["stages"] = stages
    header = (f"# {study.name}: imported from {os.path.basename(study.spec)} ({study.kind}) by `waypost import "
              f"{study.kind.lower()}`.\n# Every step runs in its own stage directory (policy.workdir: stage), as "
              f"under {study.kind}.\n")
    return header + yaml.dump(config, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=100)


def points_csv(study: Study) -> str:
    """A table of points (``table:``): a column per parameter, a row per point."""
    out = io.StringIO()
    names = study.parameter_names
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for row in study.table or []:
        writer.writerow([row[name] for name in names])
    return out.getvalue()


def workers_text(classes: dict[str, dict]) -> str:
    """``config/workers.yaml``: waypost's own local pool and an ``onprem``
    Slurm pool (the cluster's default partition), each with a class per
    placement the study's steps ask for (nodes, tasks, a node of their own)."""
    pools = wworkers.load(wworkers.PACKAGE_FILE, check=False)
    pools["pools"].setdefault("onprem", {"executor": "slurm",
                                         "classes": {"cpu": {"cpus": 1, "mem_mb": 1000, "runtime": 60}}})
    for pool in pools["pools"].values():
        local = pool.get("executor") == "local"
        for name, place in classes.items():
            pool["classes"][name] = _worker_class(place, local)
    header = ("# Worker pools (docs/workers.md): waypost's own local pool, a Slurm pool (--profile onprem: add\n"
              "# partition, account or qos to its classes), and a class per placement the imported study's steps\n"
              "# ask for (nodes, procs, exclusive).\n")
    return header + yaml.dump(pools, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=120)


def _worker_class(place: dict, local: bool) -> dict:
    procs = int(place.get("procs") or 1)
    if local:
        return {"cpus": procs, "mem_mb": 1000 * procs, "runtime": 60}
    flags = [f"--nodes={int(place.get('nodes') or 1)}", f"--ntasks={procs}"]
    if place.get("exclusive"):
        flags.append("--exclusive")
    return {"cpus": 1, "mem_mb": 1000, "runtime": 60, "extra": " ".join(flags)}


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (commands) as blocks."""


def _text(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)
