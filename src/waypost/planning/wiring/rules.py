"""How Snakemake's rules become waypost's steps: a stage rule (``wire``,
``wire_inputs``: one input function asking the state view) and a rule in
its own layout (``wire_own_layout``, and for its reused or adopted jobs
``wire_own_reuse``, ``wire_own_presence``), each given its job's step spec
as a hidden param (``_set_step_param``) and a run function that runs the
step (``steps``, ``runblocks``).
"""

from __future__ import annotations

from snakemake.io import is_flagged, strip_wildcard_constraints

from waypost.model import layout
from waypost.model import spec as wspec
from waypost.planning.stagegraph import StageError, presigned
from waypost.planning.wiring import internals, triggers
from waypost.planning.wiring.bucket import (
    benchmark_on_the_bucket,
    flagged_apart,
    map_param_functions,
    named,
    rule_pattern,
)
from waypost.planning.wiring.runblocks import on_local_copies, run_block_func, running_the_block
from waypost.planning.wiring.snake import _FIELD, _PLAIN_FIELDS, Snake, Waiting, local_path, resolve_item
from waypost.planning.wiring.steps import runner_head, script_run_func, shell_run_func


def wire(snake: Snake, stage, runner_line: str, step_param: str, step_function, mirror: str | None) -> str:
    """Make a stage rule a step: its run function runs the step runner
    (``runner_line``, braces doubled as in a rule's command) reading the
    job's step spec (the ``step_param`` param, ``step_function``) and then
    the rule's command as Snakemake formats it; its inputs, as written,
    kept for ``wire_inputs``. Returns the worker class the rule names, if any."""
    rule = snake.workflow.get_rule(stage.name)
    name, graph = rule.name, snake.graph
    own_dir = graph.own_path(stage, "")
    plain = [str(f) for f in rule.output
             if not strip_wildcard_constraints(rule_pattern(f, snake.root)).startswith(own_dir)]
    if plain:
        raise StageError(f"rule {name}: every output of a stage rule is wp.out(...) (in its stage's "
                         f"directory); not: {', '.join(plain)}")
    if rule.shellcmd is None:
        raise StageError(f"rule {name}: a stage rule runs a shell: command (waypost's step runner runs it, "
                         "attempt by attempt); script:, run: and wrapper: are not supported")
    _check_command(rule, step_param)
    wildcards = set(rule.wildcard_names) - {"experiment", "instance", graph.axis_wc}
    if wildcards:
        raise StageError(f"rule {name}: wildcards other than waypost's ({', '.join(sorted(wildcards))}): "
                         "a stage job is one experiment" + (f", {graph.axis.word}" if graph.axis else "")
                         + " and instance")
    items = _input_items(rule, snake.root)
    for _, item in items:
        for entry in (item if isinstance(item, list) else [item]):
            if isinstance(entry, str):
                stage.parents.update(graph.stage_of_path(entry))
    for dependency in rule.dependencies.values():
        if dependency in graph.stages:
            stage.parents.add(dependency)
    unknown = sorted(p for p in stage.parents if p not in graph.stages)
    if unknown:
        raise StageError(f"rule {name}: no stage {', '.join(map(repr, unknown))} (the stages are: "
                         f"{', '.join(graph.stages)})")
    snake.items[name] = items
    _wrap_command(snake, rule, runner_line, step_param, step_function, mirror)
    return snake.worker_class(name)


def own_layout_refusal(snake: Snake, name: str) -> str | None:
    """Why a rule that is not a stage can't be a step with a record of its
    own (``wire_own_layout``), and stays plain Snakemake's; None when it can."""
    rule = snake.workflow.get_rule(name)
    if rule.shellcmd is None and not _runs_a_script(rule):
        kind = next((f"{kind}:" for kind in ("template_engine", "cwl") if getattr(rule, kind, None)), None)
        if kind:
            return kind
        if not snake.job_process and getattr(snake.workflow.execution_settings, "use_threads", False):
            return "run: with --force-use-threads, in this process"
    if not rule.output:
        return "no outputs"
    if not layout.is_valid_name(name):
        return f"its name is no directory name ({layout.NAME_RULE})"
    if rule.shadow_depth:
        return "shadow:"
    flagged = flagged_apart(rule, snake.root)
    if flagged:
        return f"{flagged} outputs"
    deployment = getattr(snake.workflow, "deployment_settings", None)
    if deployment is not None and any(getattr(method, "name", "") == "APPTAINER"
                                      for method in deployment.deployment_method) \
            and (rule.container_img or getattr(snake.workflow, "global_container_img", None)):
        return "runs in a container"
    return None


def wire_own_layout(snake: Snake, name: str, runner_line: str, step_param: str, mirror: str | None,
                    step_function) -> None:
    """Make a rule in its own layout (a plain ``shell:``, ``script:``,
    ``notebook:`` or ``wrapper:`` rule with outputs, where the rule puts
    them; ``own_layout_refusal`` says None) a step as ``wire`` makes a stage
    rule one: the step runner around its command (for a script, the command
    Snakemake runs it with: ``script_run_func``), its job's record in a
    directory of its own. Its inputs, outputs and everything else stay as
    written."""
    rule = snake.workflow.get_rule(name)
    if mirror:
        benchmark_on_the_bucket(snake, rule)
        for f in rule.output:   # (Snakemake write-protects its local copy after the job: it must stay)
            if is_flagged(f, "protected") and is_flagged(f, "storage_object"):
                f.flags["storage_object"].keep_local = True
    if rule.shellcmd is None:
        if mirror:   # (the block or script sees its files' local copies, as a command does)
            map_param_functions(rule, mirror)
        if running_the_block(name):   # (the process the step runs a ``run:`` block in: plain Snakemake's)
            rule.restart_times = 0   # (the job's retries are the run's, as a ``shell:`` job's step's are)
            if mirror:
                rule.run_func = on_local_copies(rule.run_func, mirror)
            return
        if step_param in internals.names_of(rule.params):
            raise StageError(f"rule {name}: the param name {step_param!r} is waypost's own")
        head, runner = runner_head(runner_line), runner_line.format()
        rule.run_func = script_run_func(snake.local_steps, rule.run_func, head, runner, step_param, mirror) \
            if _runs_a_script(rule) else run_block_func(snake, rule.run_func, name, head, runner, step_param, mirror)
        _set_step_param(rule, step_param, step_function, with_triggers=True)
        return
    _check_command(rule, step_param)
    _wrap_command(snake, rule, runner_line, step_param, step_function, mirror, with_triggers=True)


def _runs_a_script(rule) -> bool:
    """Does a rule run a script Snakemake writes out and runs with ``shell``
    (``script:``, ``notebook:``, ``wrapper:``; a local one: no container
    image, whose interpreter would be the image's)?"""
    return bool(rule.script or rule.notebook or rule.wrapper)


def _set_step_param(rule, step_param: str, step_function, with_triggers: bool = False) -> None:
    """Give a rule's jobs their step spec (``step_function``) as a param
    Snakemake evaluates when it evaluates the rule's own (its functions, at
    the same time, in every process that plans the job), but kept out of the
    params the job shows: each job's params hold it as an attribute only
    (``_hide``), so ``{params}`` in a command or a ``message:``, and the
    params a script or block sees, are plain Snakemake's. ``with_triggers``
    (a rule in its own layout): the spec carries what the rerun triggers
    compare (``triggers.with_triggers``)."""
    rule.set_params(**{step_param: step_function})
    if with_triggers:
        triggers.with_triggers(rule, step_param)
    expand_params = rule.expand_params

    def expand(*args, **kwargs):
        params, non_derived = expand_params(*args, **kwargs)
        _hide(params, step_param)
        return params, non_derived
    rule.expand_params = expand


def _hide(params, name: str) -> None:
    """Take the param ``name`` out of a job's params, leaving it only as
    their attribute ``name`` (their other names and positions kept)."""
    names = internals.names_of(params)
    index, _ = names.pop(name, (None, None))
    if index is None:   # (evaluated without its functions)
        return
    del params[index]
    for other, (start, end) in list(names.items()):
        if start > index:
            names[other] = (start - 1, None if end is None else end - 1)


def wire_own_reuse(snake: Snake, name: str, source_of) -> None:
    """A rule in its own layout whose jobs an experiment of this config takes
    from another one of it (``source_of(values)``: the source job's
    wildcards, or None): such a job's inputs are its source job's outputs,
    so the source is made first (or again, when it is redone), and nothing
    upstream of the job itself is needed. Its functions still see the
    inputs its rule gives (``Snake.inputs_for_functions``)."""
    from snakemake.io import IOFile
    from snakemake.iocontainers import InputFiles
    rule = snake.workflow.get_rule(name)
    expand_input = rule.expand_input

    def expand(wildcards, groupid=None):
        source = None if snake.keeping else source_of(dict(wildcards.items()))
        if source is None:
            return expand_input(wildcards, groupid)
        mark_done(snake, snake.emptied_key(name, wildcards))
        return InputFiles(toclone=[IOFile(str(f), rule=rule) for f in rule.expand_output(source)[0]]), {}, {}, False
    rule.expand_input = expand
    _keep_inputs_for_functions(snake, rule)


def wire_own_presence(snake: Snake, name: str, done) -> None:
    """A rule in its own layout whose jobs waypost may say are done
    (presence mode; an adopted job, ``planning.ownpresence``): a job that
    ``done(rule, values, outputs, inputs)`` (the last two: functions giving
    its paths, asked only when needed) says is done gets no inputs
    (Snakemake then runs it only for a missing output or a forced one),
    while its params, resources and priority functions still see the
    inputs its rule gives (``Snake.inputs_for_functions``). Not in a job's
    own Snakemake process: it runs the job it was given."""
    from snakemake.iocontainers import InputFiles
    if snake.job_process:
        return
    rule = snake.workflow.get_rule(name)
    expand_input = rule.expand_input

    def expand(wildcards, groupid=None):
        if not snake.keeping:
            values = dict(wildcards.items())
            key = snake.emptied_key(name, values)
            if done(name, values, lambda: [named(f) for f in rule.expand_output(values)[0]],
                    lambda: [named(f) for f in expand_input(wildcards, groupid)[0]]):
                mark_done(snake, key)
                return InputFiles(), {}, {}, False
            snake.emptied.discard(key)
        return expand_input(wildcards, groupid)
    rule.expand_input = expand
    _keep_inputs_for_functions(snake, rule)


def _check_command(rule, step_param: str) -> None:
    name = rule.name
    if step_param in internals.names_of(rule.params):
        raise StageError(f"rule {name}: the param name {step_param!r} is waypost's own")
    if wspec.DELIMITER in rule.shellcmd:
        raise StageError(f"rule {name}: its shell command holds {wspec.DELIMITER!r}, the line that ends "
                         "waypost's here-document around it")


def _wrap_command(snake: Snake, rule, runner_line: str, step_param: str, step_function, mirror: str | None,
                  with_triggers: bool = False) -> None:
    name = rule.name
    snake.commands[name] = rule.shellcmd
    # The step runner reads the job's step spec, then the rule's command
    # as Snakemake formats it, from a quoted here-document: no argument
    # carries the command (of any length), and its shell syntax stays the
    # step's. ``exec``: the runner's status is the job's, and a
    # ``shell.suffix()`` is run by the step's script only. The rule's
    # ``shellcmd`` stays the user's: what Snakemake shows of the job (a
    # failure's error block, ``--printshellcmds``, its metadata, reports).
    rule.run_func = shell_run_func(snake, rule.run_func, runner_head(runner_line), runner_line.format(), mirror,
                                   step_param, local_path(rule.basedir))   # (the runner's braces doubled, and as formatted)
    if mirror:
        map_param_functions(rule, mirror)
    _set_step_param(rule, step_param, step_function, with_triggers)
    shell_exec = internals.resource_entries(rule.resources).get("shell_exec")
    if shell_exec is not None:
        if not isinstance(shell_exec.value, str):
            raise StageError(f"rule {name}: resources.shell_exec of a stage rule is a path to a shell, "
                             "not a function")
        snake.shell_exec[name] = shell_exec.value


def wire_inputs(snake: Snake, name: str, state) -> None:
    """Give a wired stage rule (``wire``) its inputs, once every stage rule
    is wired: one input function (``_job_inputs``, asking ``state``, the
    state view), or, where that function could only ever give every job
    the inputs the rule wrote (``StateView.inputs_as_written``), those, for
    Snakemake to fill (fewer callables plan faster). A rule that reads
    nothing needs the function only to force a job whose attempt is still
    open."""
    from snakemake.io import unpack
    rule, items = snake.workflow.get_rule(name), snake.items[name]
    if items:
        function = snake.job_process or not state.inputs_as_written(name)
    else:
        function = not snake.job_process and (state.to_force(name) or state.waits_for_sources(name))
    if not (items or function):
        return
    internals.clear_inputs(rule)
    if function:
        rule.set_input(unpack(_job_inputs(snake, state, name, [label for label, _ in items])))
        snake.input_functions.add(name)
        _keep_inputs_for_functions(snake, rule)
    else:
        wildcards = set(rule.wildcard_names)
        written = _as_written(items, wildcards)
        rule.set_input(**written)
        entries = [entry for item in written.values() for entry in (item if isinstance(item, list) else [item])]
        if all(_fills(entry, wildcards) for entry in entries):
            snake.input_patterns[name] = entries


# The input of a reused job that waits for its source's outputs (StateView.reuse_plan).
REUSE_SOURCE = "_waypost_reuse_source"


def _job_inputs(snake: Snake, state, stage: str, names: list[str]):
    """The one input function of a stage rule: none for a job that is done
    or reused (``StateView.needs_inputs``), else its rule's inputs. One
    function per rule, not one per input: Snakemake inspects every callable
    of every job, so fewer callables plan faster."""
    def inputs(wildcards):
        if snake.keeping:   # asked for a job's functions (``Snake.inputs_for_functions``)
            return snake.resolve(stage, wildcards)
        values, key = dict(wildcards.items()), snake.emptied_key(stage, wildcards)
        source = state.reuse_after(stage, values)
        if source:   # a reuse waiting for its source, which this run makes first
            mark_done(snake, key)
            return {**{name: [] for name in names}, REUSE_SOURCE: source}
        if not state.needs_inputs(stage, values, bool(names)):
            mark_done(snake, key)
            return {name: [] for name in names}
        snake.emptied.discard(key)
        return snake.resolve(stage, wildcards)

    if not snake.has_checkpoints():
        return presigned(inputs)

    def waiting(wildcards):
        try:
            if not snake.keeping and state.parts_changed(stage, dict(wildcards.items())):
                snake.emptied.discard(snake.emptied_key(stage, wildcards))
                return snake.resolve(stage, wildcards)
            return inputs(wildcards)
        except Waiting:
            return _waiting_inputs(snake, stage, wildcards)
    return presigned(waiting)


def mark_done(snake: Snake, key: tuple) -> None:
    """A job waypost decided is done (or reused): its input function gave
    none of its inputs (``Snake.emptied``). Snakemake's other rerun triggers
    then say nothing of it (``quiet_triggers``)."""
    snake.emptied.add(key)


def _keep_inputs_for_functions(snake: Snake, rule) -> None:
    """A job's params, resources and priority functions see its inputs
    whether or not the job's input function gave them (``Snake.inputs_for_functions``).
    Once per rule, however many of waypost's input functions it has."""
    if rule.name in snake.keeps_inputs:
        return
    snake.keeps_inputs.add(rule.name)
    expand_params, expand_resources, expand_priority = rule.expand_params, rule.expand_resources, \
        rule.expand_priority

    def params(wildcards, input, *args, **kwargs):
        return expand_params(wildcards, snake.inputs_for_functions(rule, wildcards, input), *args, **kwargs)

    def resources(wildcards, input, *args, **kwargs):
        return expand_resources(wildcards, snake.inputs_for_functions(rule, wildcards, input), *args, **kwargs)

    def priority(wildcards, input, *args, **kwargs):
        return expand_priority(wildcards, snake.inputs_for_functions(rule, wildcards, input), *args, **kwargs)
    rule.expand_params, rule.expand_resources, rule.expand_priority = params, resources, priority


def _waiting_inputs(snake: Snake, stage: str, wildcards) -> dict:
    """A job's inputs when some wait for a checkpoint (instances it finds:
    ``wp.parts``, or the rule's own ``checkpoints.X.get``): each such input
    is the checkpoint's output under its own name, as in plain Snakemake,
    so the job waits for the checkpoint and Snakemake asks again once it ran."""
    resolved = {}
    for name, item in snake.items[stage]:
        try:
            resolved[name] = resolve_item(item, wildcards)
        except Waiting as exc:
            resolved[name] = exc.targetfile
    return resolved


def _as_written(items: list[tuple[str, object]], wildcards: set[str]) -> dict:
    """A rule's inputs (``_input_items``) by name, as its input function would
    give them, for Snakemake to fill: a ``wp.stage`` input that is a
    pattern of the rule's wildcards becomes that pattern (a function costs
    Snakemake more per job than a pattern)."""
    def written(item):
        as_pattern = getattr(item, "as_pattern", None)
        found = as_pattern("instance" in wildcards) if as_pattern else None
        return found if _fills(found, wildcards) else item

    def listed(item: list):
        entries = [written(i) for i in item]
        if not any(callable(entry) for entry in entries):
            return entries
        # Snakemake takes no function inside a list: one function for the list
        return presigned(lambda wildcards: resolve_item(entries, wildcards))
    return {label: listed(item) if isinstance(item, list) else written(item) for label, item in items}


def _fills(pattern, wildcards: set[str]) -> bool:
    """Is ``pattern`` a path that ``str.format`` fills with a job's wildcard
    values, each of its fields one of ``wildcards``?"""
    return isinstance(pattern, str) and bool(_PLAIN_FIELDS.fullmatch(pattern)) \
        and set(_FIELD.findall(pattern)) <= wildcards


def _input_items(rule, root: str) -> list[tuple[str, object]]:
    """A rule's inputs as written, in their order: (name, a pattern or a
    function of the wildcards, or a list of them) each."""
    items, ranges = [], {start: (label, end) for label, (start, end) in internals.names_of(rule.input).items()}
    index = 0
    while index < len(rule.input):
        label, end = ranges.get(index, (None, None))
        end = index + 1 if end is None else end
        group = [rule_pattern(item, root) for item in rule.input[index:end]]
        for item in group:
            if callable(item) and is_flagged(item, "unpack"):
                raise StageError(f"rule {rule.name}: unpack() in a stage rule's input: name its inputs instead")
        # (an unnamed input is one item: Snakemake flattens a list written unnamed)
        items.append((label or f"_{index}", group[0] if end - index == 1 else group))
        index = end
    return items
