"""The step spec: the one record the planner hands the step runner for a job.

What a stage job runs with Snakemake's shell (wired by ``Pipeline.finish``;
the rule's ``shell:`` stays its own, which Snakemake shows) is::

    exec PYTHON -S .../waypost/runner/launch.py <<'WAYPOST_STEP_…'
    {"waypost_step": 1, "stage": …, "inputs": […], …}      ← the spec, one line of JSON
    the rule's own command, formatted by Snakemake          ← to the end of the here-document
    WAYPOST_STEP_…

so the runner reads everything from its standard input: the spec (built once
per job in Snakemake's main process, ``encode``), then the command, of any
length, never as one argument of a command line (Linux caps one at 128 KiB).
The runner writes the command into the attempt's script and runs it with the
spec's ``shell``: Snakemake's executable, prefix and suffix, as plain
Snakemake would (``set -euo pipefail`` for bash).

The class is typed by a table, not by ``dataclasses``: the runner starts at
every step and ``dataclasses`` imports ``inspect`` (several milliseconds).
"""

from __future__ import annotations

import json

from waypost.model.errors import WaypostError

VERSION = 1
MAGIC = "waypost_step"
# Ends the here-document that carries a job's step (a rule whose command
# holds this line is refused when the pipeline is read).
DELIMITER = "WAYPOST_STEP_9c1e7f3a"
# Set, for the Snakemake process the step runner runs a ``run:`` job's block
# in, to its rule's name (as JSON; ``planning.wiring.runblocks.run_block_func``): there
# the block runs as in plain Snakemake. That process's command is the step's.
RUN_BLOCK_ENV = "WAYPOST_RUN_BLOCK"


def here_document(step: bytes) -> tuple[bytes, bytes] | None:
    """(first line, here-document) of a job's step as a shell runs it (the
    runner's line, the spec's line and the command, the delimiter's line);
    None where the step does not end with the delimiter's line."""
    head, _, rest = step.partition(b"\n")
    end = b"\n" + DELIMITER.encode() + b"\n"
    cut = rest.find(end)
    if cut < 0 or rest[cut + len(end):].strip():
        return None
    return head, rest[:cut + 1]   # (every line before the delimiter's)


class SpecError(WaypostError, ValueError):
    """A step spec that can't be read: one clear line."""


#: field → (type, default); a field without a default (``REQUIRED``) must be there.
REQUIRED = object()
FIELDS: dict[str, tuple[type | tuple, object]] = {
    "stage": (str, REQUIRED),
    "experiment": (str, REQUIRED),
    "pair": (str, REQUIRED),
    "instance": ((str, type(None)), None),
    "stage_dir": (str, REQUIRED),         # where the stage lives: a path, or a gs:// URL
    "mirror": ((str, type(None)), None),  # with a gs:// root: where its files are copied (gs://B/K at MIRROR/B/K)
    "mounts": (dict, {}),                 # the config's mounts: mount point → the gs:// bucket[/prefix] it serves
    "inputs": (list, []),                 # as Snakemake names them (gs:// URLs on a bucket root)
    "outputs": (list, []),
    "settings": (dict, {}),
    "policy": (dict, {}),                 # the stage's control policy, as configured (waypost.model.policy)
    "config_hash": (str, ""),
    "code_version": (str, ""),
    "tolerated": (bool, False),           # a downstream funnel accepts this stage's failure
    "pool": (str, "local"),
    "worker_class": (str, ""),
    "worker_env": (dict, {}),             # the worker class's declared GPUS/WORKSPACE
    "reuse_from": ((str, type(None)), None),  # take the stage from this stage directory instead
    "shell": (dict, {}),                  # {"executable", "prefix", "suffix"}: Snakemake's shell
    "restart_command": ((str, type(None)), None),   # the policy's restart command, formatted as the command is
    # A rule in its own layout: its outputs are where the rule puts them, and
    # ``stage_dir`` holds only its record (named by its rule and wildcards).
    "own_layout": (bool, False),
    "wildcards": (dict, {}),
    "temporary": (list, []),   # its temp() outputs, which Snakemake removes once their consumers ran
    "touched": (list, []),     # its touch() outputs: made (touched) once the step succeeded, as Snakemake does
    # the rule's own ``retries:`` (not a profile's): Snakemake runs a failed job
    # again that many times, and each is one more attempt of its series
    "rule_retries": (int, 0),
    "updated": (list, []),     # its update() outputs: left where they are for the job to update, as Snakemake does
    "own_dirs": (list, []),    # its outputs' directories that only it writes: what else it leaves there is its too
    # its outputs' other directories, each with the patterns (regexes) of the files rules declare there:
    # a file it leaves there that none declares is said, not taken
    "shared_dirs": (dict, {}),
    "log_dirs": (list, []),    # the directories of its log files (made by the runner, as Snakemake makes them)
    "log_files": (list, []),   # on a gs:// root, its log files' local copies: they go up as the step ends
    # on a gs:// root, its inputs' directories that the job that made them writes alone:
    # what else is there (side files) comes down with the inputs
    "input_dirs": (list, []),
    # its inputs that a job of a rule in its own layout may have made, each with the
    # record directories of the jobs that could have (``parents.describe_inputs``)
    "input_records": (dict, {}),
    # what Snakemake's rerun triggers compare of the job: params, code,
    # software environment (planning.wiring.triggers.job_triggers), for its record
    "triggers": (dict, {}),
}
DEFAULT_SHELL = {"executable": "/bin/bash", "prefix": "set -euo pipefail; ", "suffix": ""}


class StepSpec:
    """One job's step: who it is, where it works, its policy and worker, its
    inputs and outputs, and ``command``, the rule's command as Snakemake
    formatted it (with local paths for a bucket's files)."""

    __slots__ = (*FIELDS, "command")

    def __init__(self, command: str = "", **values):
        unknown = set(values) - set(FIELDS)
        if unknown:
            raise SpecError(f"step spec: unknown field(s) {', '.join(sorted(unknown))}")
        for name, (kind, default) in FIELDS.items():
            if name in values:
                value = values[name]
            elif default is REQUIRED:
                raise SpecError(f"step spec: {name!r} is missing")
            else:
                value = default.copy() if isinstance(default, (list, dict)) else default
            if not isinstance(value, kind):
                raise SpecError(f"step spec: {name!r} is {type(value).__name__}, expected "
                                + (" or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__))
            setattr(self, name, value)
        if not all(isinstance(p, str) for p in (*self.inputs, *self.outputs)):
            raise SpecError("step spec: 'inputs' and 'outputs' are lists of paths (strings)")
        self.shell = {**DEFAULT_SHELL, **self.shell}
        self.command = command

    def fields(self) -> dict:
        return {name: getattr(self, name) for name in FIELDS}

    def script(self, command: str) -> str:
        """A command as the shell runs it: Snakemake's prefix, the command and
        its suffix, joined as Snakemake's ``shell`` joins them."""
        return " ".join((self.shell["prefix"] or "", command, self.shell["suffix"] or "")).strip() + "\n"

    @property
    def executable(self) -> str:
        return self.shell["executable"] or "/bin/sh"


# What ``json.dumps(..., separators=(",", ":"), sort_keys=True)`` makes, with
# one encoder for every line (``dumps`` with arguments makes one per call).
_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


def encode(fields: dict) -> str:
    """The spec's line (no command): compact JSON, one line whatever it holds."""
    return _ENCODE({MAGIC: VERSION, **fields})


def extend(encoded: str, fields: dict) -> str:
    """``encoded`` (a line of ``encode``) with more fields, none of them in it
    already: what a whole scope shares is encoded once, each job's own part
    per job."""
    return encoded[:-1] + "," + _ENCODE(fields)[1:] if fields else encoded


def decode(line: str | bytes, command: str = "") -> StepSpec:
    """The spec a line holds (and the command that came after it)."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise SpecError(f"step spec: not JSON ({exc})") from None
    if not isinstance(data, dict) or MAGIC not in data:
        raise SpecError("step spec: expected a JSON object with a 'waypost_step' version "
                        "(the runner reads a job's step from its standard input)")
    version = data.pop(MAGIC)
    if version != VERSION:
        raise SpecError(f"step spec: version {version!r}, this waypost reads version {VERSION} "
                        "(a job planned by another waypost version: run it again)")
    return StepSpec(command, **data)


def read(stream: bytes) -> StepSpec:
    """A job's standard input: the spec's line, then the command (the
    here-document's last newline is not the command's)."""
    line, _, command = stream.partition(b"\n")
    text = command.decode()
    return decode(line, text[:-1] if text.endswith("\n") else text)


def write(spec: StepSpec) -> bytes:
    """What ``read`` reads back: a runner started by hand or by the executor."""
    return (encode(spec.fields()) + "\n" + spec.command + "\n").encode()
