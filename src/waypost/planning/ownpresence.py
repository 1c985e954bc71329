"""Presence mode for rules in their own layout: a job whose outputs are all
there is done, as a stage's is (``StateView.needs_inputs``).

Only where the config asks for it (``rerun_policy: presence`` written in
it): without it such rules keep plain Snakemake's answer, so adding waypost
to a Snakefile changes no job (docs/own-snakefile.md). A done job gets no
inputs, so nothing upstream (rerun, newer) makes it run again; its params,
resources and priority functions still see them (``Snake.inputs_for_functions``).
"""

from __future__ import annotations

import os

from waypost import stores
from waypost.model import layout


class OwnPresence:
    """Which jobs of rules in their own layout are done, for one planning."""

    def __init__(self, state, root: str, experiment: str | None):
        self.state, self.root, self.experiment = state, root, experiment

    def done(self, rule: str, values: dict, outputs: list[str]) -> bool:
        """Is a job done: every output there (one that another rule can make
        too: made by this job, as its record says), its record marking nothing to
        redo or look at again, and no ``--forcerun``/``--forceall`` in this
        run (under those, Snakemake's own answer: the rules it forces and
        every job downstream of them)? A record with an attempt to redo
        forces the job."""
        asked = self.state.snake.forced_rules()
        if asked is None or asked[0] or asked[1]:
            return False
        experiment, instance = layout.own_job(values, self.experiment)
        record = layout.stage_dir(self.root, layout.ALL_PAIRS, experiment, rule, instance)
        redo, recheck = self.state.markers(record)
        if redo:
            self.state.snake.force(rule, values)
        if redo or recheck or not all(map(self._there, outputs)):
            return False
        # An output another rule can make too is this job's only if its
        # record says so: else it keeps its inputs, and Snakemake picks the
        # file's producer as it does without waypost (a rule whose inputs it
        # can't find is not one).
        return not self.state.snake.made_by_another_rule(rule, outputs) or self.state.recorded(record) is not None

    def _there(self, path: str) -> bool:
        """Is an output there (on a gs:// root, in the planning's one listing of it)?"""
        if not stores.is_bucket_url(path):
            return os.path.exists(path)
        from waypost.stores import gcs
        name = path[len(stores.SCHEME):].rstrip("/")
        return name in gcs.listing(self.root) or name in gcs.directories(self.root)
