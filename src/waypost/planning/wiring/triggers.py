"""Snakemake's rerun triggers and what waypost does with them: the
triggers a rule in its own layout's job records with its step spec
(``job_triggers``: params, code, software environment, the set of inputs),
the triggers quieted for the jobs whose completion is the files' business
(``quiet_triggers``), a job whose finished step outlived its driver
(``take_finished_orphans``), and a run a ``stop`` cue ends gracefully
(``stop_on_request``).
"""

from __future__ import annotations

import os
import sys

from waypost.model import manifest
from waypost.model import spec as wspec
from waypost.planning.wiring import internals


def with_triggers(rule, step_param: str) -> None:
    """A rule in its own layout's jobs' spec lines (its ``step_param``)
    carry what Snakemake's rerun triggers compare (``job_triggers``), for
    its record to keep and ``waypost plan`` to compare with what they are
    now (``current_spec``)."""
    expand_params = rule.expand_params

    def params(wildcards, input, output, job, *args, **kwargs):
        found, non_derived = expand_params(wildcards, input, output, job, *args, **kwargs)
        names = internals.names_of(found)
        if step_param in names and job is not None:
            start, _ = names[step_param]
            line = wspec.extend(found[start], {"triggers": job_triggers(job, found, input, non_derived)})
            found[start] = line
            setattr(found, step_param, line)
        return found, non_derived
    rule.expand_params = params


def job_triggers(job, params, input, non_derived: list) -> dict:
    """What Snakemake's rerun triggers compare of a job, as its record keeps
    it: its params (those not made from its files, serialized as Snakemake
    serializes them), its code (a digest of the shell command or ``run:``
    block as written, or of the script's contents) and its software
    environment (its conda env's definition, container, environment
    modules) and the set of its inputs (``input``: all its rule gives it)."""
    serialize = internals.param_serializer(job.dag.workflow) or _serialized_param
    code = _code_of(job, params)
    params = sorted(value for value in map(serialize, non_derived) if isinstance(value, str))
    found = {"params": params, "code": code, "inputs": _input_set(input)}
    software = _software_of(job, params, input)
    if software:
        found["software_env"] = software
    return found


def _input_set(input) -> list[str]:
    """A job's inputs as Snakemake's input trigger compares them: sorted, a
    storage file by its query (its URL), not its local copy."""
    return sorted(str(f.storage_object.query) if getattr(f, "is_storage", False) else str(f) for f in input)


def _serialized_param(value) -> str | None:
    """A param as Snakemake's metadata keeps it, where no persistence is at
    hand (a job's own process): the ``repr`` of a builtin value, else None."""
    plain = (type(None), int, float, bool, str, complex, range, list, tuple, dict, set, frozenset, bytes, bytearray)
    return repr(value) if isinstance(value, plain) else None


def _code_of(job, params) -> dict:
    """A job's code, as Snakemake's code trigger compares it: the rule's
    shell command or ``run:`` block as written (a digest), or its script's
    or notebook's contents (Snakemake compares its time). ``params``: the
    job's, as just expanded: Snakemake formats the script's path with them
    (``Job._path_to_source_file``), and asking the job for them while they
    are being expanded would expand them again, and again."""
    rule = job.rule
    if rule.shellcmd is not None:
        return {"shell": _digest_text(rule.shellcmd)}
    path = rule.script or rule.notebook
    if path:
        try:
            local = internals.script_path_of(job, params, path).get_path_or_uri(secret_free=True)
        except Exception:   # (a remote script: its path alone)
            local = str(path)
        return {"script": str(path), "sha256": _digest_file(local)}
    source = getattr(rule, "run_func_src", None)
    return {"run": _digest_text(source)} if source else {}


def _software_of(job, params, input) -> dict:
    """A job's software environment: its conda env's definition (a digest of
    the file, or the named env), its container image, its environment
    modules. (Its conda env is the rule's, given the params just expanded:
    ``Job.conda_env_spec`` would expand them again.)"""
    found, rule = {}, job.rule
    try:
        conda = rule.expand_conda_env(job.wildcards_dict, params, input)
    except Exception:   # (Snakemake says what is wrong with it when it deploys it)
        conda = None
    if conda:
        source = getattr(conda, "file", None)
        path = source.get_path_or_uri(secret_free=True) if source is not None else None
        found["conda"] = _digest_file(path) if path and os.path.isfile(path) else str(path or conda)
    container = rule.expand_container_img(job.wildcards_dict) if rule.container_img else None
    if container:
        found["container"] = str(container)
    if rule.env_modules:
        found["env_modules"] = [str(m) for m in rule.env_modules]
    return found


def _digest_text(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


_file_digests: dict[tuple, str | None] = {}


def _digest_file(path: str) -> str | None:
    """A file's sha256, read once per size and time in this process."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _file_digests:
        _file_digests[key] = manifest.sha256_file(path)
    return _file_digests[key]


def quiet_triggers(snake) -> None:
    """Have the rerun triggers that compare a job with its metadata in
    ``.snakemake/`` (params, the set of inputs, code, software environment)
    say nothing of the jobs whose completion is the files' business: a
    stage job (waypost's layout: done when its outputs are there, or, in
    mtime mode, newer than its inputs), and a job waypost decided is done
    (``rules.mark_done``: presence mode, a reuse). Every other job (a rule in its
    own layout) is asked as plain Snakemake asks it, with the run's own
    ``--rerun-triggers``. Installed on each DAG's persistence as Snakemake
    builds it."""
    workflow = snake.workflow

    def files_decide(job) -> bool:
        name = job.rule.name
        return name in snake.items or snake.emptied_key(name, job.wildcards) in snake.emptied

    def quiet() -> None:
        persistence = internals.persistence_of(workflow)
        if persistence is not None:
            internals.quiet_persistence_triggers(persistence, files_decide)
        internals.note_files_decide(workflow, files_decide)
    internals.before_each_dag(workflow, quiet)
    internals.quiet_script_dates()


def take_finished_orphans(snake, step_param: str) -> None:
    """A job Snakemake still marks incomplete (``.snakemake/incomplete/``)
    whose step outlived its driver (the driver alone killed, as the OOM
    killer does, its runner not) and recorded SUCCESS after the mark is
    complete: the runner writes that record last, once the outputs are in
    place. Snakemake's ``persistence.incomplete`` says nothing of its
    outputs, so ``rerun-incomplete`` does not redo it. A record older than
    the mark (the runner killed too, or not started) leaves the job
    incomplete, as in plain Snakemake. Installed on each DAG's persistence
    as Snakemake builds it."""
    workflow = snake.workflow

    def take() -> None:
        persistence = internals.persistence_of(workflow)
        if persistence is not None:
            internals.filter_incomplete(persistence,
                                        lambda job, found: _still_incomplete(persistence, job, found, step_param))
    internals.before_each_dag(workflow, take)


def _still_incomplete(persistence, job, found: list, step_param: str) -> list:
    """A job's files still marked incomplete (``found``), or none where its
    record says its step succeeded after they were marked."""
    from waypost.state import lifecycle
    directory = _record_dir(job, step_param) if found else None
    if directory is None:
        return found
    marked = internals.incomplete_marked_at(persistence, found)
    if None not in marked and lifecycle.succeeded_since(directory, max(marked)):
        return []
    return found


def stop_on_request(step_param: str) -> None:
    """A job whose series a ``stop`` cue ended recorded ``stopped_run`` in
    this run: the run then starts no new job and lets the running ones
    finish, as Snakemake's own graceful stop does (a SIGTERM to it:
    ``JobScheduler.exit_gracefully``). Asked as the scheduler handles each
    failed job (in the main process, for every executor); installed once."""
    def handled(scheduler, job) -> None:
        why = next(filter(None, (_stopped_run(one, step_param) for one in getattr(job, "jobs", [job]))), None)
        if why and internals.stop_gracefully(scheduler):
            print(f"waypost: {why}: no new job starts in this run; the running ones finish", file=sys.stderr)
    internals.on_failed_job(handled)


def _stopped_run(job, step_param: str) -> str | None:
    """Why a waypost job's record says a stop cue ended this run (its
    stage's name and the cue); None when it doesn't."""
    from waypost.state import lifecycle
    directory = _record_dir(job, step_param)
    return None if directory is None else lifecycle.stopped_run(directory, os.environ.get(manifest.RUN_ID_ENV))


def _record_dir(job, step_param: str) -> str | None:
    """The directory of a waypost job's record (its step spec's stage
    directory); None for a job waypost doesn't run."""
    line = getattr(job.params, step_param, None)
    if not isinstance(line, str):
        return None
    try:
        return wspec.decode(line).stage_dir
    except wspec.SpecError:
        return None
