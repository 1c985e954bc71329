"""A study as Maestro and Merlin write it, and what each of its steps
becomes: a rule that runs once, once per point, once per value of some
parameters, or over every point (a ``_*`` funnel).

Maestro's rule, which Merlin shares: a step runs per combination of the
parameters its commands name (``$(SIZE)``, ``$(SIZE.label)``, or through a
label of ``env.labels``), and of those its parents run per; a ``depends:
[step_*]`` gathers every job of ``step`` (each one of the parameters this
step keeps). ``$(NAME)`` tokens a study doesn't define stay as written
(the shell reads ``$(...)`` as a command's output, as under Maestro).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from waypost.model import layout, paramsets
from waypost.model.errors import ConfigError

#: ``$(NAME)`` or ``$(NAME.attribute)``, as Maestro's and Merlin's specs write tokens.
TOKEN = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_\-]*)(?:\.([A-Za-z_]+))?\)")
#: The file each imported step writes when its command ended with status 0.
DONE = "step.done"
#: What a rule reads a step's workspace through (``$(step.workspace)``).
WORKSPACE_PARAM = "{}_workspace"


class SpecError(ConfigError):
    """The spec can't be imported; the message names the file and the key."""


@dataclass
class Step:
    """One step of the spec's ``study:``, as written."""
    name: str
    cmd: str
    where: str                           # "study[2] (run-lulesh)": for messages
    description: str = ""
    restart: str | None = None
    depends: list[str] = field(default_factory=list)
    shell: str | None = None             # an interpreter other than bash (Merlin's `shell:`)
    runtime: float | None = None         # minutes (walltime)
    placement: dict = field(default_factory=dict)   # nodes, procs, exclusive
    policy: dict = field(default_factory=dict)      # cues, max_attempts, attempt_delay, ...
    notes: list[str] = field(default_factory=list)  # its keys waypost can't keep, one line each


@dataclass
class Study:
    """A spec, read: its steps, parameters (or table of points) and words."""
    kind: str                             # "Maestro" or "Merlin"
    spec: str                             # the spec's path
    name: str
    description: str
    steps: list[Step]
    variables: dict[str, str] = field(default_factory=dict)   # env.variables, dependency paths
    labels: dict[str, str] = field(default_factory=dict)      # env.labels: name → text with tokens
    parameters: dict[str, list] = field(default_factory=dict)  # name → values, zipped by position
    param_labels: dict[str, str] = field(default_factory=dict)  # name → "SIZE.%%"
    table: list[dict] | None = None       # points from a generator or a samples file, in order
    fixed: dict[str, str] = field(default_factory=dict)        # other tokens → their text in a rule
    root: str = "studies"
    notes: list[str] = field(default_factory=list)            # what to write by hand, one line each
    git: dict[str, dict] = field(default_factory=dict)        # env.dependencies.git: name → path, url, tag
    # Parameters a step takes all or none of, and never from its parents
    # (Merlin's samples), and the tokens that take them.
    group: list[str] = field(default_factory=list)
    group_tokens: set[str] = field(default_factory=set)
    samples_from: str | None = None       # the samples file read (Merlin)

    @property
    def parameter_names(self) -> list[str]:
        if self.table:
            return list(self.table[0])
        return list(self.parameters)


@dataclass
class Rule:
    """What one step becomes."""
    step: Step
    name: str                             # the rule's name
    params: tuple[str, ...]               # the parameters it runs per (the study's order)
    funnel: bool                          # gathers (a `_*`) with no parameter of its own: one job
    inputs: dict[str, str] = field(default_factory=dict)      # name → wp.stage/wp.each expression
    rule_params: dict[str, str] = field(default_factory=dict)  # name → expression
    command: str = ""
    restart: str | None = None
    every_parameter: bool = False         # runs per point (wp.grid), not per some parameters
    worker: str | None = None             # the worker class of its placement


#: Names the generated Snakefile has of its own (a rule or variable of the spec is renamed ``step_NAME``).
RESERVED = frozenset({"all", "wp", "os", "config", "workflow", "rules", "shell", "checkpoints", "workspace",
                      "Pipeline", "input", "output", "params", "wildcards", "threads", "resources", "log", "rule",
                      "jobid", "SPECROOT", "OUTPUT_PATH", "MERLIN_INFO"})


def rule_name(step: str) -> str:
    """A step's name as a rule's (``make-lulesh`` → ``make_lulesh``)."""
    name = re.sub(r"\W", "_", step)
    return f"step_{name}" if not name or name[0].isdigit() or name in RESERVED else name


def plan_rules(study: Study) -> list[Rule]:
    """The study's steps as rules, parents first (the spec's order where it
    can): which parameters each runs per, what it reads, its command."""
    steps = {s.name: s for s in study.steps}
    _distinct(study)
    order = _ordered(study, steps)
    names = study.parameter_names
    rules: dict[str, Rule] = {}
    for step in order:
        own = _named_parameters(study, step)
        parents, funnels = _parents(study, step, steps)
        inherited = {p for parent in parents for p in rules[parent].params if p not in study.group}
        params = tuple(p for p in names if p in own or p in inherited)
        funnel = bool(funnels) and not params
        rule = Rule(step, rule_name(step.name), params, funnel, every_parameter=len(params) == len(names))
        for parent in parents:
            rule.inputs[rules[parent].name] = _reads_one(study, rules[parent], rule)
        for parent in funnels:
            rule.inputs[rules[parent].name] = _reads_each(rules[parent], rule)
        rules[step.name] = rule
    for rule in rules.values():
        _commands(study, rule, rules)
    return list(rules.values())


def _distinct(study: Study) -> None:
    """Each step once, and each as a rule of its own name."""
    seen: dict[str, str] = {}
    for step in study.steps:
        name = rule_name(step.name)
        if name in seen:
            same = "twice" if seen[name] == step.name else f"and {seen[name]!r} both as rule {name}"
            raise SpecError(f"{study.spec}: {step.where}: the step {step.name!r} {same}: name steps apart")
        seen[name] = step.name


def _ordered(study: Study, steps: dict[str, Step]) -> list[Step]:
    """The steps with every parent before its children; a parent the spec
    doesn't have, or a circle, is one SpecError."""
    done: dict[str, None] = {}
    visiting: set[str] = set()

    def visit(step: Step) -> None:
        if step.name in done:
            return
        if step.name in visiting:
            raise SpecError(f"{study.spec}: {step.where}: depends: a circle of steps through {step.name!r}")
        visiting.add(step.name)
        for parent in step.depends:
            name = _funnel_of(parent)
            if name not in steps:
                raise SpecError(f"{study.spec}: {step.where}: depends: {parent!r} is not a step of the study "
                                f"(its steps: {', '.join(steps)})")
            visit(steps[name])
        visiting.discard(step.name)
        done[step.name] = None
    for step in study.steps:
        visit(step)
    return [steps[name] for name in done]


def _parents(study: Study, step: Step, steps: dict[str, Step]) -> tuple[list[str], list[str]]:
    """(parents read one job each, parents gathered by ``_*``): those the
    step depends on, and the steps whose workspace it names (Maestro takes
    their parameters too)."""
    each = [_funnel_of(p) for p in step.depends if _funnel_of(p) != p]
    one = [p for p in step.depends if _funnel_of(p) == p]
    for text in (step.cmd, step.restart or ""):
        for match in TOKEN.finditer(text):
            name = match.group(1)
            if match.group(2) == "workspace" and name in steps and name not in one + each and name != step.name:
                one.append(name)
    return one, each


def _funnel_of(depends: str) -> str:
    """The step a ``depends`` entry names (``run_*``, Merlin's ``run*``: every job of ``run``)."""
    return depends[:-2] if depends.endswith("_*") else depends[:-1] if depends.endswith("*") else depends


def _expanded(study: Study, text: str, seen: tuple = ()) -> str:
    """``text`` with the study's labels (``env.labels``) written out, as
    Maestro does before it looks for parameters."""
    def label(match: re.Match) -> str:
        name, attribute = match.group(1), match.group(2)
        if attribute is None and name in study.labels and name not in seen:
            return _expanded(study, study.labels[name], (*seen, name))
        return match.group(0)
    return TOKEN.sub(label, text)


def _named_parameters(study: Study, step: Step) -> set[str]:
    """The parameters a step's commands name (labels written out)."""
    names = set(study.parameter_names)
    found = set()
    for text in (step.cmd, step.restart or ""):
        for match in TOKEN.finditer(_expanded(study, text)):
            if match.group(1) in names and match.group(2) in (None, "label", "name"):
                found.add(match.group(1))
            if match.group(2) is None and match.group(1) in study.group_tokens:
                found.update(study.group)
    if found & set(study.group):
        found.update(study.group)
    return found


def _instance_pattern(study: Study, params: tuple[str, ...]) -> str:
    """The instance name of a job per ``params``, its values as placeholders."""
    labels = study.param_labels or None
    return "-".join(paramsets.name_part(p, f"{{{p}}}", labels) for p in params)


def _reads_one(study: Study, parent: Rule, child: Rule) -> str:
    """How ``child`` reads its one job of ``parent`` (each of its jobs,
    where the parent runs per parameters the child doesn't take: Merlin's
    samples)."""
    if not set(parent.params) <= set(child.params):
        return _reads_each(parent, child)
    if parent.params and parent.params != child.params:
        return f'wp.stage("{parent.name}", "{DONE}", instance="{_instance_pattern(study, parent.params)}")'
    return f'wp.stage("{parent.name}", "{DONE}")'


def _reads_each(parent: Rule, child: Rule) -> str:
    """How ``child`` gathers ``parent``'s jobs (a ``_*``): every one, or
    each one with its values of the parameters it keeps."""
    if not parent.params:
        return f'wp.stage("{parent.name}", "{DONE}")'
    along = [p for p in parent.params if p not in child.params]
    if not child.params or len(along) == len(parent.params):
        return f'wp.each("{parent.name}", "{DONE}")'
    if not along:
        return f'wp.stage("{parent.name}", "{DONE}")'
    over = repr(along[0]) if len(along) == 1 else repr(along)
    return f'wp.each("{parent.name}", "{DONE}", over={over})'.replace("'", '"')


def _commands(study: Study, rule: Rule, rules: dict[str, Rule]) -> None:
    """The rule's command and restart, the spec's tokens as placeholders."""
    rule.command = _converted(study, rule, rules, rule.step.cmd, f"{rule.step.where}: run.cmd")
    if rule.step.restart:
        rule.restart = _converted(study, rule, rules, rule.step.restart, f"{rule.step.where}: run.restart")


def _converted(study: Study, rule: Rule, rules: dict[str, Rule], text: str, where: str) -> str:
    """``text`` as a rule's command: braces doubled (Snakemake formats the
    command), parameters as ``{params.X}``, variables and SPECROOT as the
    Snakefile's names, a parent's workspace as a param of the rule."""
    names = set(study.parameter_names)

    def token(match: re.Match) -> str:
        name, attribute = match.group(1), match.group(2)
        if name in names and attribute in (None, "label", "name"):
            if attribute == "name":
                return name
            rule.rule_params.setdefault(name, _value_of(rule, name))
            if attribute == "label":
                label = study.param_labels.get(name) or f"{name}.{paramsets.LABEL_VALUE}"
                return label.replace(paramsets.LABEL_VALUE, f"{{params.{name}}}")
            return f"{{params.{name}}}"
        if attribute == "workspace" and name in rules:
            return _workspace(rule, rules[name], where, study)
        if attribute is None and name in study.fixed and "{params." in study.fixed[name]:
            for param in re.findall(r"\{params\.(\w+)\}", study.fixed[name]):
                rule.rule_params.setdefault(param, _value_of(rule, param))
        if attribute is None and name in study.git:
            rule.inputs.setdefault(name, variable_name(name))
            return f"{{input.{name}}}"
        if attribute is None and name in study.fixed:
            return study.fixed[name]
        if attribute is None and name in study.variables:
            return f"{{{variable_name(name)}}}"
        return match.group(0)
    escaped = _expanded(study, text).replace("{", "{{").replace("}", "}}")
    return TOKEN.sub(token, escaped)


def _value_of(rule: Rule, name: str) -> str:
    """A parameter's value as a param of the rule: the point's setting, or,
    in a job per some parameters, its value's text (``wp.dim``)."""
    return f'wp.setting("{name}")' if rule.every_parameter else f'wp.dim("{name}")'


def _workspace(rule: Rule, parent: Rule, where: str, study: Study) -> str:
    """``$(parent.workspace)``: the directory of the parent's job this rule
    reads (of all its jobs, for a ``_*``), as a param of the rule."""
    if parent.name not in rule.inputs:
        study.notes.append(f"{study.spec}: {where}: $({parent.step.name}.workspace) names a step this one "
                           "doesn't depend on; it is left as written: add the step to its depends")
        return f"$({parent.step.name}.workspace)"
    gathered = rule.inputs[parent.name].startswith("wp.each")
    param = WORKSPACE_PARAM.format(parent.name)
    rule.rule_params[param] = f'workspace("{parent.name}"{", gathered=True" if gathered else ""})'
    return f"{{params.{param}}}"


def variable_name(name: str) -> str:
    """A variable of the spec as a name of the Snakefile (its own names
    are kept: ``SPECROOT``, ``OUTPUT_PATH``, ``MERLIN_INFO``, as the spec
    writes them)."""
    return name if name in ("SPECROOT", "OUTPUT_PATH", "MERLIN_INFO", "LAUNCHER") else rule_name(name)


def check_points(study: Study) -> None:
    """The points must make valid instance names, each once."""
    if study.table is not None:
        rows = study.table
    else:
        lengths = {name: len(values) for name, values in study.parameters.items()}
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{name} {n}" for name, n in lengths.items())
            raise SpecError(f"{study.spec}: global.parameters: every parameter has one value per point "
                            f"(lists of one length); these are: {listed}")
        count = next(iter(lengths.values()), 0)
        rows = [{name: values[i] for name, values in study.parameters.items()} for i in range(count)]
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        name = paramsets.name_of(row, study.param_labels or None)
        if not layout.is_valid_name(name):
            raise SpecError(f"{study.spec}: point {i + 1} ({row}) makes the name {name!r}, which is not a "
                            f"valid instance name ({layout.NAME_RULE}): give its parameters labels that make one")
        if name in seen:
            raise SpecError(f"{study.spec}: points {seen[name] + 1} and {i + 1} are both {name!r}: each point once "
                            "(give a parameter a label that tells them apart)")
        seen[name] = i
