"""Which jobs of rules in their own layout waypost says are done, whatever
Snakemake's timestamps say (``StateView.needs_inputs`` for stages).

- **Presence mode**, where the config asks for it (``rerun_policy: presence``
  written in it): a job is done as a stage's is (``presence.Presence.done``),
  unless ``--forcerun``/``--forceall`` is given at all (then Snakemake's own
  answer), or an output another rule can make too is not this job's by its
  record. Without it such rules keep plain Snakemake's answer, so adding
  waypost to a Snakefile changes no job (docs/own-snakefile.md).
- **An adopted job** (``waypost adopt``: outputs made by hand), in either
  mode: done while its outputs are all there, so an input newer than the
  hand-made file does not make Snakemake overwrite it (the run says so, in
  one line, with how to redo it). Only ``--forceall`` or a ``--forcerun``
  naming its rule redo it, and then its record and its hand-made outputs
  are first set aside in the record's ``.attempts/N/`` (said), before
  Snakemake removes the outputs of a job it runs.

A done job gets no inputs, so nothing upstream (rerun, newer) makes it run
again; its params, resources and priority functions still see them
(``Snake.inputs_for_functions``).
"""

from __future__ import annotations

import os
import sys

from waypost import stores
from waypost.model import layout
from waypost.model.job import Job, outputs_base
from waypost.model.layout import MANIFEST


class OwnPresence:
    """Which jobs of rules in their own layout are done, for one planning
    (``presence``: the config asks for presence mode)."""

    def __init__(self, state, root: str, experiment: str | None, presence: bool = True):
        self.snake, self.root_state = state.snake, state.root_state   # (the planning's ``StateView``'s)
        self.root, self.experiment, self.presence = root, experiment, presence
        self._adopted: dict[str, bool] = {}   # record → done, for adopted jobs decided this planning

    def done(self, rule: str, values: dict, outputs, inputs=None) -> bool:
        """Is a job done: every output there (``outputs``: a list, or a
        function giving it; one that another rule can make too: made by this
        job, as its record says), its record marking nothing to redo or look at
        again, and no ``--forcerun``/``--forceall`` in this run (under
        those, Snakemake's own answer: the rules it forces and every job
        downstream of them)? A record with an attempt to redo forces the
        job. An adopted job: ``adopted_done`` (``inputs``: a function
        giving the job's input paths, for what the run says of it)."""
        asked = self.snake.forced_rules()
        if asked is None:   # (at parse time: nothing is decided yet)
            return False
        experiment, instance = layout.own_job(values, self.experiment)
        record = layout.stage_dir(self.root, layout.ALL_PAIRS, experiment, rule, instance)
        if record in self._adopted or self._adopted_record(record):
            return self.adopted_done(rule, record, instance, _listed(outputs), inputs, asked)
        if not self.presence or asked[0] or asked[1]:
            return False
        outputs = _listed(outputs)
        if not self.root_state.done(Job.in_own_layout(rule, record, outputs, wildcards=values,
                                                      experiment=experiment, instance=instance)):
            return False
        # An output another rule can make too is this job's only if its
        # record says so: else it keeps its inputs, and Snakemake picks the
        # file's producer as it does without waypost (a rule whose inputs it
        # can't find is not one).
        return not self.snake.made_by_another_rule(rule, outputs) or self.root_state.recorded(record) is not None

    def adopted_done(self, rule: str, record: str, instance: str | None, outputs: list[str], inputs,
                     asked: tuple[bool, list[str]]) -> bool:
        """An adopted job (its outputs made by hand, ``waypost adopt``) is
        done while they are all there, even when an input is newer (said in
        default mode, where Snakemake would redo it); ``--forceall`` or a
        ``--forcerun`` naming its rule redo it, its record and outputs set
        aside first (``_set_aside``). Decided once per planning: the input
        function is asked again as the DAG grows."""
        if record in self._adopted:
            return self._adopted[record]
        done = all(map(self.root_state.present, outputs))
        if done and (asked[0] or rule in asked[1]):
            self._set_aside(rule, record, "--forceall" if asked[0] else "--forcerun")
            done = False
        elif done and not self.presence and inputs is not None:
            newer = _newer_input(inputs(), outputs)
            if newer:
                print(f"waypost: {outputs[0]}: adopted by hand; its input {newer} is newer: kept "
                      f"(`waypost rerun {rule}{f' --instance {instance}' if instance else ''}` to redo it)",
                      file=sys.stderr)
        self._adopted[record] = done
        return done

    def _set_aside(self, rule: str, record: str, flag: str) -> None:
        """Before a forced adopted job runs: its record and its hand-made
        outputs into the record's ``.attempts/N/`` (as ``waypost rerun``
        sets a job aside), since Snakemake removes the outputs of a job it
        runs. A run that runs no job (a dry run, ``--touch``, ``--dag``,
        ``--summary``) only says it would."""
        name = record if stores.is_bucket_url(record) else os.path.relpath(record)
        if not self.snake.runs_jobs():
            print(f"waypost: {name}: adopted by hand; {flag} redoes it: its record and outputs would be set "
                  f"aside in its .attempts/ first", file=sys.stderr)
            return
        archived = _keep_aside(record, self.root_state.recorded(record))
        print(f"waypost: {name}: adopted by hand; {flag} redoes it: its record and outputs set aside in "
              f"{archived} first", file=sys.stderr)

    def _adopted_record(self, record: str) -> bool:
        """Is a job's record an adopted one? Asked of every job in either
        mode, so a manifest on disk is read whole (and checked) only when
        its text says ``"adopted": true`` as waypost writes it (most don't)."""
        if not stores.is_bucket_url(record):
            try:
                with open(os.path.join(record, MANIFEST), "rb") as text:
                    if _ADOPTED_TEXT not in text.read():
                        return False
            except OSError:
                return False
        return _is_adopted(self.root_state.recorded(record))


def _keep_aside(record: str, data: dict) -> str | None:
    """Set a job's record aside in its ``.attempts/N/``, with its outputs
    (``StageStore.archive_job``). On disk the outputs are linked there (a
    copy across filesystems), not moved: the DAG being built has seen them,
    and Snakemake removes them itself before it runs the job."""
    tree = stores.store_for(record)
    if stores.is_bucket_url(record):
        return tree.archive_job(record, data)
    archived = tree.archive(record)
    base = outputs_base(record, data)
    for out in data.get("outputs", []):   # (a directory() output: each of its files)
        _link_file(os.path.join(base, out["path"]), os.path.join(record, archived, out["path"]))
    return archived


def _link_file(path: str, into: str) -> None:
    if not os.path.lexists(path):
        return
    os.makedirs(os.path.dirname(into), exist_ok=True)
    try:
        os.link(path, into, follow_symlinks=False)
    except OSError:
        import shutil
        shutil.copy2(path, into, follow_symlinks=False)


# How an adopted record's manifest says so (``manifest.dumps``: indent 2).
_ADOPTED_TEXT = b'"adopted": true'


def _is_adopted(record) -> bool:
    return bool(record) and record.get("state") == "SUCCESS" and bool(record.get("adopted"))


def _listed(outputs) -> list[str]:
    return outputs() if callable(outputs) else outputs


def _newer_input(inputs: list[str], outputs: list[str]) -> str | None:
    """The first of a job's local inputs newer than its oldest output (what
    makes Snakemake's ``mtime`` trigger redo it), or None."""
    local = [path for path in outputs if not stores.is_bucket_url(path)]
    if not local:
        return None
    oldest = min(os.stat(path).st_mtime for path in local)
    for path in inputs:
        try:
            if not stores.is_bucket_url(path) and os.stat(path).st_mtime > oldest:
                return path
        except OSError:
            continue
    return None
