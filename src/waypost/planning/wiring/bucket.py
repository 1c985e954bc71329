"""The bucket hand-off: on a gs:// root, what Snakemake stores and fetches
itself and what waypost's step runner does (waypost's storage plugin leaves
the files of a job with a record to the runner), and the local copies a
job's functions and steps work on.

A rule that runs as plain Snakemake runs it has its files' storage objects
swapped for ones Snakemake fetches and stores itself (``as_plain_on_the_bucket``);
a checkpoint's ``directory()`` output is fetched whole as the Snakefile asks
for it (``fetch_checkpoint_folders``); a params function sees its job's
files' local copies (``map_param_functions``, ``local_files``).
"""

from __future__ import annotations

import inspect
import os

from snakemake.exceptions import WorkflowError
from snakemake.io import is_flagged

from waypost import stores
from waypost.planning.wiring import internals


def planning_mirror(workflow, root: str) -> str:
    """For a run over a gs:// root: check that Snakemake stores stage
    files there through waypost's plugin, and that the bucket is there;
    returns the local copy of the bucket (a path)."""
    settings = workflow.storage_settings
    prefix = (getattr(settings, "default_storage_prefix", None) or "").rstrip("/")
    if getattr(settings, "default_storage_provider", None) != stores.PROVIDER or prefix != root.rstrip("/"):
        raise WorkflowError(f"root {root} is a bucket: run Snakemake with "
                            f"{' '.join(stores.snakemake_options(root))} (or those two keys in the profile; "
                            "see docs/buckets.md in waypost's manual)")
    try:
        stores.check_bucket(root)
    except stores.StorageError as exc:
        raise WorkflowError(str(exc)) from None
    stores.register_root(root)
    return os.path.abspath(str(workflow.storage_registry.default_storage_provider.local_prefix))


def flagged_apart(rule, root: str) -> str | None:
    """The first flag (``pipe()``, ``service()``, ``storage()``) of a rule's
    outputs that keeps its jobs from a record; None without one (on a gs://
    root, its files are storage objects in the root's bucket: those are waypost's)."""
    flagged = sorted({flag for f in rule.output for flag in ("pipe", "service", "storage_object")
                      if is_flagged(f, flag) and not (flag == "storage_object" and _in_the_root(f, root))})
    return f"{flagged[0].replace('_object', '')}()" if flagged else None


def as_plain_on_the_bucket(snake, name: str, runs: bool = True) -> None:
    """On a gs:// root, a rule that runs as plain Snakemake runs it (no
    record: ``own_layout_refusal``): its files, in the bucket, are fetched
    and stored by Snakemake itself around its jobs, as with any storage
    plugin (waypost's plugin leaves that to the step runner, for the rules
    it records), and its jobs see their local copies. Its declared files
    are given such storage objects now; those its functions give, as each
    job is made (its path modifiers). A rule that runs nothing (``runs``
    False: a target rule, one that only touches its outputs) has only its
    outputs so: its inputs are never fetched."""
    rule = snake.workflow.get_rule(name)
    for files in (rule.input, rule.output, rule.log) if runs else (rule.output,):
        _retrieve(files, snake.root)
    if runs:
        benchmark_on_the_bucket(snake, rule)
    for kind in ("input_modifier", "output_modifier", "log_modifier") if runs else ():
        modifier = getattr(rule, kind, None)
        if modifier is not None:
            setattr(rule, kind, _Retrieving(modifier, snake.root))


def benchmark_on_the_bucket(snake, rule) -> None:
    """On a gs:// root, a rule's ``benchmark:`` file is Snakemake's to
    store in the bucket (it measures the job and writes the file after it),
    whether or not the job's step has a record."""
    if rule.benchmark is not None:
        _retrieve([rule.benchmark], snake.root)
    if getattr(rule, "benchmark_modifier", None) is not None:
        rule.benchmark_modifier = _Retrieving(rule.benchmark_modifier, snake.root)


def _retrieve(files, root: str) -> None:
    """Each of a rule's files in the root's bucket ``_retrieved``, in place."""
    for f in files:
        if not callable(f) and is_flagged(f, "storage_object") and _in_the_root(f, root) \
                and not f.flags["storage_object"].retrieve:
            internals.replace_file(f, _retrieved)


def fetch_checkpoint_folders() -> None:
    """On a gs:// root: once a checkpoint's job is done, the local copy of
    each of its ``directory()`` outputs is made the bucket's as the
    Snakefile asks for it (``checkpoints.NAME.get(...)``), so that a
    ``glob_wildcards`` over it finds what the job wrote, on any machine and
    however many of the copy's files Snakemake removed since (it removes a
    storage input's local copy once its jobs are done). Once per output per
    process."""
    fetched = set()

    def fetch(job) -> None:
        for path in job.output:
            if is_flagged(path, "directory") and is_flagged(path, "storage_object") and str(path) not in fetched:
                fs, name = stores.filesystem(str(path.storage_object.query))
                stores.fetch_folder(fs, name, os.path.abspath(str(path)))
                fetched.add(str(path))
    internals.after_checkpoint_get(fetch)


def _retrieved(path):
    """``path`` (flagged with a storage object of waypost's plugin) flagged
    with one that Snakemake fetches and stores itself instead."""
    from snakemake.io import AnnotatedString

    from snakemake_storage_plugin_waypost import RetrievedStorageObject
    found = path.flags["storage_object"]
    fresh = AnnotatedString(str(path))
    fresh.flags.update(path.flags)
    fresh.flags["storage_object"] = RetrievedStorageObject(query=found.query, provider=found.provider,
                                                           keep_local=found.keep_local, retrieve=True)
    return fresh


class _Retrieving:
    """A rule's path modifier whose gs:// root files are ``_retrieved``."""

    def __init__(self, inner, root: str):
        self.inner, self.root = inner, root

    def modify(self, path, property=None):
        modified = self.inner.modify(path, property)
        if not callable(modified) and is_flagged(modified, "storage_object") and _in_the_root(modified, self.root) \
                and not modified.flags["storage_object"].retrieve:
            return _retrieved(modified)
        return modified

    def __getattr__(self, name):
        return getattr(self.inner, name)


def named(path) -> str:
    """A job's file as its job names it: its path, or on a gs:// root its URL."""
    return str(path.storage_object.query) if is_flagged(path, "storage_object") else str(path)


def _in_the_root(path, root: str) -> bool:
    """Is a rule's file one that Snakemake put in a gs:// root's bucket
    (its default storage, waypost's plugin; not a ``storage()`` of its own)?"""
    found = path.storage_object
    return stores.needs_mirror(root) and str(found.query).startswith(root.rstrip("/") + "/") \
        and type(found).__module__.split(".")[0] == f"snakemake_storage_plugin_{stores.PROVIDER}"


def rule_pattern(path, root: str) -> str:
    """A rule's file as the rule wrote it (on a gs:// root Snakemake makes
    it a storage file whose query is its URL under ``root``)."""
    if is_flagged(path, "storage_object"):
        return path.storage_object.query[len(root.rstrip("/")) + 1:]
    return path


def map_param_functions(rule, mirror: str) -> None:
    """On a bucket root: a params function that takes the job's ``input``
    or ``output`` gets their local copies (``local_files``), as the
    command does, so a path it builds (``--out={output.model}.tmp``) is
    one the step can open."""
    for index, param in enumerate(rule.params):
        if not callable(param):
            continue
        takes = set(inspect.signature(param).parameters) & {"input", "output"}
        if takes:
            rule.params[index] = _with_local_files(param, takes, mirror)
            for name, (start, end) in list(internals.names_of(rule.params).items()):
                if start == index and end is None:
                    internals.set_name(rule.params, name, index)   # a named param is an attribute too


def local_files(files, mirror: str | None):
    """A job's files (a Namedlist of plain strings, as a rule's run function
    or a params function gets them) with each gs:// URL replaced, whole, by
    its local copy under ``mirror``: what the step works on. ``files`` as
    they are on a local root (``mirror`` None)."""
    if not mirror:
        return files
    from snakemake.iocontainers import Namedlist
    return Namedlist(toclone=files, custom_map=lambda f: stores.local_of(mirror, f))


def _with_local_files(function, names: set[str], mirror: str):
    """``function`` (a params function) given its job's files' local copies.
    One that reads an input (its size, its first line) finds it there: where
    the bucket has it, it is fetched as Snakemake fetches a storage input;
    where it doesn't yet (its job has not run), the function's
    FileNotFoundError names the input's URL, which Snakemake takes for an
    input not made yet (the param is evaluated again once it is)."""
    def mapped(*args, **kwargs):
        urls = {stores.local_of(mirror, url): url for url in kwargs.get("input", ())}
        for name in names:
            if name in kwargs:
                kwargs[name] = local_files(kwargs[name], mirror)
        while True:   # (each input fetched at most once: ``urls`` shrinks)
            try:
                return function(*args, **kwargs)
            except FileNotFoundError as exc:
                url = urls.pop(exc.filename, None)
                if url is None:
                    raise
                if not _fetched(url, exc.filename):
                    raise FileNotFoundError(exc.errno, exc.strerror, url) from None
    mapped.__signature__ = inspect.signature(function)
    return mapped


def _fetched(url: str, local: str) -> bool:
    """Fetch an input in the bucket to its local copy; False when the bucket doesn't have it."""
    fs, name = stores.filesystem(url)
    fs.invalidate_cache(name)
    if not fs.exists(name):
        return False
    stores.download(fs, [name], [local])
    return True
