"""A rule in its own layout's jobs' files, as the step runner needs them:
its log files, the directories only its job writes (``own_dirs_of``), the
records of the jobs that made its inputs (``input_records_of``) and the
directories of them those jobs write alone (``input_dirs_of``), and its
outputs with a flag (``flagged_positions``).
"""

from __future__ import annotations

import os
import re

from snakemake.io import is_flagged

from waypost import stores
from waypost.planning.wiring.bucket import named
from waypost.planning.wiring.snake import Snake


def log_files_of(snake: Snake, name: str):
    """A function of a job's wildcards: its rule's log files (on a gs://
    root, their local copies). The step runner makes their directories
    where no Snakemake process of the job's own does (``needs_own_process``),
    and on a gs:// root stores them in the bucket."""
    logs = list(snake.workflow.get_rule(name).log)

    def log_files(values: dict) -> list[str]:
        return [str(f.apply_wildcards(values)) for f in logs]
    return log_files


def own_dirs_of(snake: Snake, name: str):
    """A function of a job's outputs (its rule's, in order) giving the
    directories of them that only this job writes, and the others.

    Its own: where the rule's pattern names every wildcard of the rule (no
    other job of the rule writes there) and no other rule's output, log or
    benchmark could be (nor the inside of another rule's ``directory()``),
    a wildcard without a constraint taken as one path component. The files
    a job leaves there beside its outputs are its own (side files). The
    others (shared), each with the patterns (regexes) of every rule's files
    that could be there: a file the job leaves there that none declares is
    said (``runner.workspace.OutputsInPlace.left_in_shared``)."""
    rule = snake.workflow.get_rule(name)
    wildcards = set(rule.wildcard_names)
    owned = [not is_flagged(f, "directory") and wildcards <= set(_FIELD_NAMES.findall(os.path.dirname(str(f))))
             for f in rule.output]
    places = _declared_places(snake)
    foreign = [rx for other, dir_rx, _, inside in places if other != name for rx in (dir_rx, inside) if rx]
    declared = [(dir_rx, file_rx) for _, dir_rx, file_rx, _ in places]

    def own_dirs(outputs) -> tuple[list[str], dict[str, list[str]]]:
        found, shared = [], {}
        for mine, path in zip(owned, outputs):
            directory = os.path.dirname(str(path)) or "."
            if directory in found or directory in shared:
                continue
            if mine and not any(rx.match(directory) for rx in foreign):
                found.append(directory)
            else:
                shared[directory] = sorted({file_rx for dir_rx, file_rx in declared
                                            if dir_rx.match(stores.normalised(directory))})
        return found, shared
    return own_dirs


def input_records_of(snake: Snake, rules: list[str], record_of):
    """A function of a job's inputs giving, for each that a job of one of
    ``rules`` (rules in their own layout) could make, the record
    directories of those jobs (``record_of(rule, wildcards)``), as
    Snakemake finds a file's producer (``Rule.is_producer``, its wildcards
    from ``Rule.get_wildcards``). The runner takes the one whose manifest
    lists the file (``parents.describe_inputs``): where several rules could
    make it, Snakemake's rule order chose which did."""
    candidates = [snake.workflow.get_rule(name) for name in rules]

    def input_records(inputs) -> dict[str, list[str]]:
        found = {}
        for path in dict.fromkeys(map(str, inputs)):
            records = [record_of(rule.name, rule.get_wildcards(path)) for rule in candidates
                       if rule.is_producer(path)]
            if records:
                found[path] = records
        return found
    return input_records


def input_dirs_of(snake: Snake, rules: list[str]):
    """A function of a job's inputs giving the directories of them that a
    job of one of ``rules`` (rules in their own layout) writes alone
    (``own_dirs_of``): what else is there is that job's too (its side files,
    the ``decoder.yml`` beside a model), which a step on a gs:// root gets
    with its inputs, as it sees them on disk."""
    import re

    from snakemake.io import regex_from_filepattern
    owned = []   # (rule, the regex of a directory of its outputs that its jobs each write alone)
    for name in rules:
        rule = snake.workflow.get_rule(name)
        wildcards = set(rule.wildcard_names)
        owned += [(name, re.compile(_one_component(regex_from_filepattern(os.path.dirname(named(f)) or "."))))
                  for f in rule.output if not is_flagged(f, "directory")
                  and wildcards <= set(_FIELD_NAMES.findall(os.path.dirname(str(f))))]
    places = _declared_places(snake)

    def input_dirs(inputs) -> list[str]:
        found = []
        for directory in dict.fromkeys(os.path.dirname(str(i)) for i in inputs):
            owners = {name for name, rx in owned if rx.match(directory)}
            if len(owners) == 1 and not any(rx.match(directory) for other, dir_rx, _, inside in places
                                            if other not in owners for rx in (dir_rx, inside) if rx):
                found.append(directory)
        return found
    return input_dirs


def _declared_places(snake: Snake) -> list[tuple]:
    """Every rule's output, log and benchmark patterns, read once per
    workflow: (rule, its directory's regex, the file's regex, the regex of
    the inside of a ``directory()`` output or None)."""
    if snake.declared_places is None:
        from snakemake.io import regex_from_filepattern

        def compiled(pattern: str):
            return re.compile(_one_component(regex_from_filepattern(pattern or ".")))
        places = []
        for rule in snake.workflow.rules:
            for f in [*rule.output, *rule.log, *([rule.benchmark] if rule.benchmark else [])]:
                # (on a gs:// root, as its jobs' files are named: their URLs)
                pattern = str(f.storage_object.query) if is_flagged(f, "storage_object") else str(f)
                places.append((rule.name, compiled(os.path.dirname(pattern)),
                               _one_component(regex_from_filepattern(pattern)),
                               compiled(pattern) if is_flagged(f, "directory") else None))
        snake.declared_places = places
    return snake.declared_places


def _one_component(regex: str) -> str:
    """A wildcard without a constraint taken as one path component: it
    could span directories, but a pattern that means to says so."""
    return re.sub(r"(\(\?P<\w+>)\.\+\)", r"\1[^/]+)", regex)


_FIELD_NAMES = re.compile(r"\{\s*(\w+)")   # a wildcard's name in a pattern (constraint or not)


def flagged_positions(snake: Snake, name: str, flag: str) -> list[int]:
    """Where a rule's outputs flagged ``flag`` are among its outputs
    (``temp``: Snakemake removes them once their consumers ran; ``touch``:
    it makes them once the job ended); a job's outputs are its rule's, in
    order (the flags are the rule's: a params function's ``output`` has none)."""
    return [i for i, f in enumerate(snake.workflow.get_rule(name).output) if is_flagged(f, flag)]
