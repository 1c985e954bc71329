"""The default run's targets: ``rule all``'s ``input: wp.targets``.

presence: the jobs to do (an output missing, an attempt to redo, a set of
inputs or parts that changed, a stage that ``--forcerun``/``--forceall``
forces, one to look at again); mtime: every job, and Snakemake's
timestamps decide. A present output is done, so its job is not even in the
DAG: deleting one intermediate reruns exactly its job.

Of those jobs, the ones another job to do brings into the DAG are left out,
as a plain workflow's ``rule all`` asks only for its last outputs (a list
of every output costs Snakemake a producer lookup, a dependency and a
reason per file). A job is left out only where that changes nothing: a job
that reads it gets its inputs, and each of its missing outputs is read by
a job that will certainly run (forced, or missing outputs of its own), so
Snakemake's search for missing outputs upstream of jobs that run finds
them. ``--batch``, which splits this list, gets all of it.
"""

from __future__ import annotations

import sys

from waypost.planning.holds import Holds


def default_targets(view) -> list[str]:
    """``view``: the planning's ``StateView``."""
    forced = view.forced_stages()
    holds = Holds(view.root, view.mirror is not None, view.graph.stages, view.resolver.policy, view.recorded,
                  view.resolver.reusers, view.reuse_plan().held)
    jobs, skipped, done = [], set(), None   # jobs: (stage, values, outputs, missing, certain)
    for stage, job, paths in view.stage_outputs():
        missing = view.missing(stage, job["wildcards"], paths)
        if holds.held and missing and holds.holds(stage, job["experiment"], job["pair"], job["instance"]):
            skipped.add(stage)
            continue
        values = job["wildcards"]
        try:
            todo, certain = _todo(view, stage, values, bool(missing), stage in forced)
        except view.snake.Waiting as exc:   # its set is found by a checkpoint still to run
            view.wait_for(exc)
            continue
        if todo:
            jobs.append((stage, values, paths, missing, certain))
        elif done is None:
            done = paths[0]
    wanted = [path for *_, paths, _, _ in jobs for path in paths] if view.snake.batching() else _leaves(view, jobs)
    # The outputs of checkpoints whose parts are still to be found: Snakemake
    # runs them first, then asks again (it re-evaluates what depends on them).
    wanted += view.waited_for()
    if not wanted and done is not None:
        # Everything is done: one done output keeps `rule all` a rule with
        # inputs (one without is always run), so Snakemake says "Nothing to be done".
        wanted.append(done)
    if skipped:
        print(f"waypost: on hold, not scheduled, nor what needs them ({', '.join(sorted(skipped))}): "
              + "; ".join(holds.said[:6]) + (" ..." if len(holds.said) > 6 else "")
              + (" (`waypost retry STAGE` to try again now)" if holds.registered else ""), file=sys.stderr)
    return wanted


def _todo(view, stage: str, values: dict, missing: bool, forced: bool) -> tuple[bool, bool]:
    """(is the job to do, will it certainly run: forced, or an output missing).
    In mtime mode every job is to do, and only one with an output missing
    is counted certain (what else runs is Snakemake's to say)."""
    if not view.presence or forced or missing:
        return True, forced or missing
    redo, recheck = view.markers(view.own_files(stage)[0].format(**values))
    certain = redo or (view.graph.stages[stage].gathers and view.set_changed(stage, values) is not None) \
        or (stage in view.fanout.after and view.parts_changed(stage, values))
    return certain or recheck, certain


def _leaves(view, jobs: list) -> list[str]:
    """The outputs of the jobs that no other job brings in (see the module's docstring)."""
    read, read_by_certain = set(), set()
    for stage, values, _, _, certain in jobs:
        if not view.snake.reads(stage) or view.resolver.reused_from(stage, values):
            continue   # (it gets no inputs)
        try:
            inputs = view.snake.inputs_now(stage, values, keep=view.snake.has_input_function(stage))
        except Exception:   # (a checkpoint to wait for, or the rule's own error: Snakemake says it, later)
            continue
        read.update(inputs)
        if certain:
            read_by_certain.update(inputs)
    return [path for _, _, paths, missing, _ in jobs
            if not (read_by_certain.issuperset(missing) if missing else not read.isdisjoint(paths))
            for path in paths]
