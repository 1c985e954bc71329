"""What a planning does with reused jobs whose source is not a SUCCESS now.

A reuse whose source is being redone waits for it, and blocks nothing else:

- a source that is a job of this workflow (another experiment of the config,
  ``Resolver.reuse_experiment``) with outputs missing is one this run makes:
  on a local root the reused job reads its outputs (``after``), so Snakemake
  makes the source first, then the reuse takes it, in the same run; on a
  bucket root (where the job would download what it reads) the reused job
  is held, and a later run takes it;
- a source elsewhere that is being redone there (``reuse.being_redone``:
  archived by a rerun, or an attempt at work) is held with what needs it
  (``holds.Holds``), said in one line; the rest of the run goes on;
- a source not there at all, failed, provisional or untrusted is a mistake
  to fix: ``problems``, and the run stops before any job.
"""

from __future__ import annotations

from waypost.model import events, layout
from waypost.state import reuse


class ReusePlan:
    """Made from the planning's ``StateView`` once, before the DAG."""

    def __init__(self, view):
        self.view = view
        self.after: dict[str, list[str]] = {}   # reused job's stage dir → the source job's outputs
        self.held: dict[tuple, str] = {}        # (experiment, pair, stage, instance) → why
        self.problems: list[str] = []
        self.waits: dict[tuple, list[str]] = {}   # (experiment, stage, source experiment) → where
        self._instances: dict[tuple, set] = {}
        for stage in view.graph.stages:
            if view.resolver.is_reused(stage):
                for _, job in view.jobs(everything=True, only=stage):
                    self._plan(stage, job)
        self.problems = list(dict.fromkeys(self.problems))
        self.stages = {stage for _, stage, _ in self.waits}
        for why in self.held.values():
            events.note("reuse_held", why=why)

    def _plan(self, stage: str, job: dict) -> None:
        view = self.view
        experiment, pair, instance = job["experiment"], job["pair"], job["instance"]
        location = view.resolver.reuse_location(experiment, pair, stage, instance)
        if not location or all(map(view.present, view.outputs(stage, job["wildcards"]))):
            return
        name = layout.stage_name(pair, experiment, stage, instance)
        key = (experiment, pair, stage, instance)
        source = self._source_job(experiment, pair, stage, instance)
        if source is not None:
            origin = view.resolver.reuse_experiment(experiment, pair, stage)
            if view.mirror is None:
                self.after[view.own_files(stage)[0].format(**job["wildcards"])] = source
                self.waits.setdefault((experiment, stage, origin), []).append(
                    "/".join(x for x in (None if pair == layout.ALL_PAIRS else pair, instance) if x))
                events.note("reuse_waits", stage=name, source=origin)
            else:
                self.held[key] = f"{name} waits for {layout.stage_name(pair, origin, stage, instance)}, to be made first"
            return
        problem = reuse.source_problem(location)
        if problem and reuse.being_redone(location):
            self.held[key] = f"{name} waits for {location}, being redone there"
        elif problem:
            self.problems.append(f"{name}: {problem}")

    def _source_job(self, experiment: str, pair: str, stage: str, instance: str | None) -> list[str] | None:
        """The outputs of the job a reused job is taken from, when it is a
        job of this workflow with outputs missing: one this run makes (in
        presence mode; None otherwise)."""
        view = self.view
        source = view.resolver.reuse_experiment(experiment, pair, stage)
        if source is None or not view.presence:
            return None
        if pair != layout.ALL_PAIRS and pair not in view.graph.axis_values(source):
            return None
        if instance is not None:
            key = (stage, source, pair)
            if key not in self._instances:
                self._instances[key] = set(view.graph.instances(stage, source, pair))
            if instance not in self._instances[key]:
                return None
        values = view.graph.values(source, pair, instance)
        return view.outputs(stage, values) if view.missing(stage, values) else None

    def lines(self) -> list[str]:
        """A line per experiment and stage whose reuse waits for its source
        made in this run."""
        return [f"{experiment}/{stage}" + (f" ({', '.join(where)})" if any(where) else "")
                + f" is reused from {origin}, whose {stage} is to be made: this run makes it first, then takes it"
                for (experiment, stage, origin), where in self.waits.items()]
