"""The state view: the planning's questions, answered from the root as it
is when the DAG is built.

Is a stage's job done (``presence.Presence.done``, asked of its ``Job``)?
Is it to be forced: an attempt left open, a set of inputs that changed,
parts made anew, a rule that ``--forcerun``/``--forceall`` forces upstream?
Which outputs are the default run's targets? Jobs' values are plain dicts of their
wildcards; what it needs from Snakemake it asks ``snake`` (``waypost.planning.wiring.snake``).
"""

from __future__ import annotations

import sys

from waypost import stores
from waypost.model import events, layout, manifest
from waypost.model.job import Job
from waypost.model.records import made_here
from waypost.planning import fanout
from waypost.planning.presence import Presence
from waypost.planning.resolver import Resolver


class StateView:
    def __init__(self, graph, resolver: Resolver, snake, fanout, root: str, mirror: str | None, presence: bool):
        self.graph, self.resolver, self.snake, self.fanout = graph, resolver, snake, fanout
        self.root, self.mirror, self.presence = root, mirror, presence
        # its jobs' records and outputs: whether a job is done (its markers, read once per planning)
        self.root_state = Presence(snake, root, mirror)
        self.markers, self.recorded = self.root_state.markers, self.root_state.recorded
        self._set_changes: dict[str, str | None] = {}   # stage dir → how its set of inputs changed
        self._forced: set | None = None   # see forced_stages
        self._pending: dict = {}   # checkpoint outputs that instances wait for (see stage_outputs)
        self._own: dict[str, tuple] = {}
        self._reuse = None   # see reuse_plan

    # --- files ---------------------------------------------------------------
    def location(self, path: str) -> str:
        """Where a stage file (a path as rules write it) is: on a gs:// root, its URL."""
        return path if self.mirror is None else layout.join(self.root, path)

    def present(self, path: str) -> bool:
        """Does a stage file (a path as rules write it) exist (``Presence.present``)?"""
        return self.root_state.present(self.location(path))

    def job(self, stage: str, values: dict, paths: list[str] | None = None) -> Job:
        """A stage's job (``paths``: its outputs, when made already), its
        record directory and outputs where they are (``location``)."""
        paths = self.outputs(stage, values) if paths is None else paths
        return Job(rule=stage, record_dir=self.location(self.own_files(stage)[0].format(**values)),
                   outputs=tuple(map(self.location, paths)), wildcards=values)

    def own_files(self, stage: str) -> tuple[str, list[tuple[str, bool]]]:
        """``str.format`` patterns of a stage's directory and of its outputs,
        each with whether ``str.format`` fills it (asked at every job: made once)."""
        if stage not in self._own:
            stage_dir = self.graph.own_path(self.graph.stages[stage], "")
            self._own[stage] = (stage_dir.rstrip("/"), self.snake.output_patterns(stage))
        return self._own[stage]

    # --- what is to be redone ------------------------------------------------
    def forced_stages(self) -> set[str]:
        """Stages that Snakemake's ``--forcerun RULE`` / ``--forceall`` force,
        and every stage downstream of them: in presence mode their jobs get
        their inputs, so Snakemake redoes what it documents for those flags."""
        if self._forced is None:
            asked = self.snake.forced_rules()
            if asked is None:   # asked before the DAG settings are known: at parse time
                return set()
            stages = set(self.graph.stages)
            forceall, forcerun = asked
            forced = set(stages) if forceall else {name for name in forcerun if name in stages}
            for stage in list(forced):
                forced |= self.graph.downstream(stage)
            self._forced = forced
        return self._forced

    def needs_inputs(self, stage: str, values: dict, reads: bool) -> bool:
        """Does a job get its inputs (``reads``: its rule has some)?

        In presence mode a job whose outputs are all present is done: it gets
        none, so nothing upstream of it (being rerun, or missing in an
        experiment where its outputs were placed by hand) can make it rerun;
        a job that gets them has an output missing, so it runs whatever their
        timestamps. waypost's own markers count in both modes, whatever
        Snakemake's metadata says (``Presence.marked``): a stage left unfinished is
        forced to run again; a provisional one gets its inputs, so it is
        redone when one of them is. A reused job needs nothing upstream."""
        if self.resolver.reused_from(stage, values):
            return False
        redo, recheck = self.root_state.marked(self.job(stage, values, []))   # (outputs: made when asked of)
        if not reads:   # a stage that reads nothing: only an attempt to redo is said
            return False
        changed = self.graph.stages[stage].gathers and not redo and self.set_changed(stage, values) is not None
        if changed:
            self.snake.force(stage, values)
        # (done, its markers read above: every output there)
        return not (self.presence and not (redo or recheck or changed or stage in self.forced_stages())
                    and not self.root_state.missing(self.job(stage, values)))

    def parts_changed(self, stage: str, values: dict) -> bool:
        """Presence mode: is a done job of a stage made from a checkpoint's
        parts to be redone, because a part it was made from changed (see
        ``fanout.Planning.changed``)? Said once per job; the job is forced."""
        if not self.presence or stage not in self.fanout.after or self.resolver.reused_from(stage, values):
            return False
        stage_dir = self.own_files(stage)[0].format(**values)
        new = not self.fanout.decided(stage_dir)
        why = self.fanout.changed(stage, stage_dir)
        if why and new and not self._set_changes.get(stage_dir):   # (said once; one reason is enough)
            self._say(values, stage, why, "parts_changed")
        if why:
            self.snake.force(stage, values)
        return bool(why)

    def _say(self, values: dict, stage: str, why: str, event: str) -> None:
        name = layout.stage_name(self.graph.pair(values), values["experiment"], stage, values.get("instance"))
        print(f"waypost: {name}: {why}: redone", file=sys.stderr)
        events.note(event, stage=name, change=why)

    def set_changed(self, stage: str, values: dict) -> str | None:
        """For a stage made from a set of instances (``wp.each``): how the
        inputs it would read now differ from those its manifest says it was
        made from (None: the same, or nothing recorded to compare with: no
        manifest, a reused or adopted stage, none recorded). Said once per
        job, in the run's output: in presence and mtime mode alike, such a
        stage is redone."""
        stage_dir = self.own_files(stage)[0].format(**values)
        if stage_dir not in self._set_changes and self.mirror is None and not made_here(self.recorded(stage_dir)):
            self._set_changes[stage_dir] = None   # nothing recorded to compare with: its inputs aren't needed
        if stage_dir not in self._set_changes:
            current = {layout.join(self.root, p) if self.mirror else p for p in self.snake.inputs_now(stage, values)}
            # In a bucket the manifest's object says its set in the listing:
            # read the manifest only when the set differs (or isn't said).
            said = self._listed_input_set(stage_dir)
            data = None if said == manifest.input_set(current) else self.recorded(stage_dir)
            change = None
            if made_here(data):
                recorded = {str(i.get("path")) for i in data.get("inputs") or [] if isinstance(i, dict)}
                # No inputs recorded: not a set the runner made it from (a
                # manifest written by hand or a tool): nothing to compare.
                if recorded and recorded != current:
                    change = (f"made from {len(recorded)} inputs, now {len(current)} "
                              f"({len(current - recorded)} new, {len(recorded - current)} gone)")
                    self._say(values, stage, change, "set_changed")
            self._set_changes[stage_dir] = change
        return self._set_changes[stage_dir]

    def _listed_input_set(self, stage_dir: str) -> str | None:
        """The set of inputs a bucket's manifest object says it records (its
        metadata, in the planning's listing); None on a local root or when it
        says none."""
        if self.mirror is None:
            return None
        info = stores.listed_info(layout.join(self.root, stage_dir, layout.MANIFEST))
        return ((info or {}).get("metadata") or {}).get(manifest.INPUT_SET_KEY)

    # --- the jobs ----------------------------------------------------------------
    def wait_for(self, exc) -> None:
        """Note the checkpoint output that a set of instances waits for
        (``Waiting``): the default targets ask for it."""
        self._pending.setdefault(str(exc.targetfile), exc.targetfile)

    def waited_for(self) -> list:
        pending, self._pending = list(self._pending.values()), {}
        return pending

    def outputs(self, stage: str, values: dict) -> list[str]:
        """A stage job's outputs (paths as rules write them)."""
        return [p.format(**values) if plain else self.snake.fill(p, values) for p, plain in self.own_files(stage)[1]]

    def missing(self, stage: str, values: dict, paths: list[str] | None = None) -> list[str]:
        """The outputs of a stage job (``paths``, when made already) that
        are not there (``Presence.missing``), as rules write them."""
        paths = self.outputs(stage, values) if paths is None else paths
        job = self.job(stage, values, paths)
        path_of = dict(zip(job.outputs, paths))
        return [path_of[location] for location in self.root_state.missing(job)]

    def stage_outputs(self):
        """(stage, job, outputs) of every stage job of ``jobs``."""
        for stage, job in self.jobs():
            yield stage, job, self.outputs(stage, job["wildcards"])

    def jobs(self, everything: bool = False, only: str | None = None):
        """(stage, job) of every stage job of the selected experiments and
        axis values (``everything``: of all of them; ``only``: of one stage),
        where job holds its experiment, pair (the engine's name for its axis
        value), instance, and its wildcards."""
        graph, config = self.graph, self.resolver.config
        select = {} if everything else (config.get("select") or {})
        experiments = [e for e in graph.experiments if e in select.get("experiments", [e])]
        for stage, spec in graph.stages.items():
            if only is not None and stage != only:
                continue
            for experiment in experiments:
                if spec.funnel or not graph.axis_wc:  # a funnel is over all values: not when only some are selected
                    pairs = [] if spec.funnel and select.get("pairs") else [layout.ALL_PAIRS]
                else:
                    pairs = [p for p in graph.axis_values(experiment) if p in select.get("pairs", [p])]
                for pair in pairs:
                    try:
                        instances = graph.instances(stage, experiment, pair) if spec.instances is not None else [None]
                    except self.snake.Waiting as exc:
                        # Instances found by a checkpoint that has not run: what
                        # needs them waits for it (``targets`` asks for its output).
                        self.wait_for(exc)
                        continue
                    for instance in instances:
                        yield stage, {"experiment": experiment, "pair": pair, "instance": instance,
                                      "wildcards": graph.values(experiment, pair, instance)}

    def to_force(self, stage: str) -> bool:
        """Has some job of ``stage`` (a stage whose rule reads nothing) to be
        forced: an attempt left open? Such a rule needs its input function
        only then (``wiring.rules.wire``); so does one whose instances a checkpoint
        finds, which can't be asked before it ran."""
        if fanout.checkpoint_parts(self.graph.stages[stage].instances):
            return True
        return any(self.markers(stage_dir)[0] for stage_dir in self._stage_dirs(stage))

    def inputs_as_written(self, stage: str) -> bool:
        """Can a stage rule that reads something keep its inputs as written,
        with no input function (``wiring.rules.wire``)? Yes where that function
        could only ever give each job its rule's inputs: on a local root,
        nothing of any job of the stage is there (each stage directory
        absent or empty: no output that counts as done, no marker to force
        a job by, no record of a set of inputs), no experiment reuses it,
        and no checkpoint's parts name its instances or decide its redo
        (``fanout.Planning.after``). Its jobs are then planned as plain
        Snakemake plans them, with one callable fewer each."""
        if self.mirror is not None or self.resolver.is_reused(stage) \
                or fanout.checkpoint_parts(self.graph.stages[stage].instances) or stage in self.fanout.after:
            return False
        return all(map(self.root_state.empty, self._stage_dirs(stage)))

    def _stage_dirs(self, stage: str):
        """The stage directory of every job of ``stage``, in every experiment and axis value."""
        dir_pattern = self.own_files(stage)[0]
        for _, job in self.jobs(everything=True, only=stage):
            yield dir_pattern.format(**job["wildcards"])

    def reuse_problems(self) -> list[str]:
        """Why the reuse sources of stages still to be done can't be used:
        each must be a SUCCESS stage, or on its way (see ``reuse_plan``)."""
        problems = self.reuse_plan().problems
        self._pending = {}   # (stages whose instances a checkpoint finds: their reuse is checked by their jobs)
        return problems

    def reuse_plan(self):
        """What the reused jobs still to be done wait for (``reuseplan.ReusePlan``), made once per planning."""
        if self._reuse is None:
            from waypost.planning.reuseplan import ReusePlan
            self._reuse = ReusePlan(self)
        return self._reuse

    def reuse_after(self, stage: str, values: dict) -> list[str]:
        """The source outputs a reused job waits for (``ReusePlan.after``;
        none in a job's own process, which runs what it was given)."""
        if self.snake.job_process or not self.resolver.reused_from(stage, values):
            return []
        return self.reuse_plan().after.get(self.own_files(stage)[0].format(**values), [])

    def waits_for_sources(self, stage: str) -> bool:
        """Does some reused job of ``stage`` wait for its source's outputs?"""
        return not self.snake.job_process and self.resolver.is_reused(stage) and stage in self.reuse_plan().stages

