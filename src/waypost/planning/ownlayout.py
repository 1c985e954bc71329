"""The Snakefile's rules that are not stages, as ``wp.finish()`` wires them:
each rule in its own layout (a ``shell:``, ``script:`` or ``run:`` rule
with outputs and no ``wp.out``) becomes a step with a record of its own,
or stays plain Snakemake's, said in one line with why
(docs/own-snakefile.md). The wiring itself, on Snakemake's objects, is
``waypost.planning.wiring.rules``'s; this module decides what each rule
gets from the pipeline's config, state and step lines."""

from __future__ import annotations

import sys

from waypost.model import layout
from waypost.model import workers as wworkers
from waypost.planning.ownpresence import OwnPresence
from waypost.planning.wiring.bucket import as_plain_on_the_bucket, fetch_checkpoint_folders
from waypost.planning.wiring.jobfiles import (
    flagged_positions,
    input_dirs_of,
    input_records_of,
    log_files_of,
    own_dirs_of,
)
from waypost.planning.wiring.rules import own_layout_refusal, wire_own_layout, wire_own_presence, wire_own_reuse


def assigned_class(resolver, snake, rule: str) -> str:
    """The worker class of a rule that names none: workers.yaml's ``assign``
    (by the rule's name, then by its own resources), else the default."""
    return (wworkers.assigned_class(resolver.workers, rule, snake.own_resources(rule))
            or wworkers.DEFAULT_CLASS)


def wire_rules_in_own_layout(wp, runner_line: str, step_param: str) -> list[str]:
    """Make each rule of the ``Pipeline`` ``wp`` in its own layout
    (``own_layout_refusal`` says which are not) a step with a record of
    its own: the rules wired. A job's record is in its experiment: the
    config's one, or, where it declares several, the job's
    ``{experiment}`` wildcard's (a rule without one stays plain
    Snakemake's: which experiment its jobs belong to can't be told), the
    step spec in its param ``step_param``. On a
    gs:// root their files are the bucket's, below the root (Snakemake's
    default storage): the step runs on their local copies and the runner
    stores the outputs, then the manifest last, as for a stage."""
    experiments = wp.graph.experiments
    experiment = experiments[0] if len(experiments) == 1 else None
    wired, plain = [], {}
    for rule in wp.snake.job_rules(wp.graph.stages):
        refusal = _refusal(wp.snake, rule, experiment)
        if refusal:
            plain[rule] = refusal
            if wp.mirror:
                as_plain_on_the_bucket(wp.snake, rule)
            continue
        _wire_one(wp, rule, runner_line, step_param, experiment)
        wired.append(rule)
    if plain and not wp.snake.job_process and not wp.facts_only:
        print("waypost: run as plain Snakemake runs them, with no waypost record: "
              + ", ".join(f"{rule} ({why})" for rule, why in plain.items()), file=sys.stderr)
    _wire_files_reuse_and_presence(wp, wired, experiment)
    return wired


def _refusal(snake, rule: str, experiment: str | None) -> str | None:
    """Why ``rule`` stays plain Snakemake's, or None."""
    refusal = own_layout_refusal(snake, rule)
    if refusal is None and experiment is None and "experiment" not in snake.wildcards_of(rule):
        return "no {experiment} wildcard, and the config declares several experiments"
    return refusal


def _wire_one(wp, rule: str, runner_line: str, step_param: str, experiment: str | None) -> None:
    snake = wp.snake
    flags = {flag: flagged_positions(snake, rule, flag) for flag in ("temp", "touch", "update")}
    wire_own_layout(snake, rule, runner_line, step_param, wp.mirror,
                    wp.lines.own_layout_function(rule, experiment, flags, own_dirs_of(snake, rule),
                                                 log_files_of(snake, rule), snake.rule_retries(rule)))
    wp.lines.default_class[rule] = snake.worker_class(rule) or assigned_class(wp.resolver, snake, rule)


def _wire_files_reuse_and_presence(wp, wired: list[str], experiment: str | None) -> None:
    """The wired rules' side files and input records, their reuse from
    another experiment of the config, and their presence answers."""
    snake = wp.snake
    if wp.mirror:   # (a step on a gs:// root gets the side files beside its inputs too)
        wp.lines.input_dirs = input_dirs_of(snake, wired)
        for rule in snake.target_rules(wp.graph.stages):   # (``touch()`` outputs: Snakemake's)
            as_plain_on_the_bucket(snake, rule, runs=False)
        fetch_checkpoint_folders()
    else:   # (an input a job here made is described with its record: parents.describe_inputs)
        wp.lines.input_records = input_records_of(snake, wired, _record_of(wp.root, experiment))
    if wp.facts_only:
        return
    if experiment is None:   # one experiment of this config reusing another's jobs
        for rule in wired:
            wire_own_reuse(snake, rule, _reused_job(wp.config, wp.resolver, rule))
    # (presence mode, and adopted jobs in either mode)
    done = OwnPresence(wp.state, wp.root, experiment, wp.config_read.own_presence).done
    for rule in wired:
        wire_own_presence(snake, rule, done)


def _record_of(root: str, experiment: str | None):
    """A function of a rule in its own layout and a job's wildcards: the
    job's record directory (``experiment`` None: its ``{experiment}``
    wildcard's)."""
    def record_of(rule: str, values: dict) -> str:
        job_experiment, instance = layout.own_job(values, experiment)
        return layout.stage_dir(root, layout.ALL_PAIRS, job_experiment, rule, instance)
    return record_of


def _reused_job(config: dict, resolver, rule: str):
    """A function of a job's wildcards (a rule in its own layout, the
    config declaring several experiments): the wildcards of the job of
    another experiment of this config that its experiment reuses it
    from (its ``{experiment}`` the source's), or None."""
    def source_of(values: dict) -> dict | None:
        experiment = values.get("experiment")
        if experiment not in config["experiments"]:
            return None
        source = resolver.reuse_experiment(experiment, layout.ALL_PAIRS, rule)
        return None if source is None else {**values, "experiment": source}
    return source_of
