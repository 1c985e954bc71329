"""A stage job's step spec, as the one line of JSON its step runner reads.

The part of the line a job's stage settings decide is the same for every
job of its scope (``Resolver.scope``): encoded once per scope. A grid
point's line is its scope's with the point's settings and their hash put
in, unless the point sets one of the engine's keys (``policy``, ``worker``,
…): then it is its own.
"""

from __future__ import annotations

import json
import os

from waypost.model import config as wconfig
from waypost.model import layout, paramsets
from waypost.model import spec as wspec
from waypost.planning.resolver import Resolver
from waypost.planning.stagegraph import StageError, presigned


class StepLines:
    """``code_version(stage)`` and ``shell(stage)`` (how Snakemake's ``shell``
    runs the stage's command) come from whoever knows the rules."""

    def __init__(self, resolver: Resolver, code_version, shell, mirror: str | None):
        self.resolver = resolver
        self.config = resolver.config
        self._code_version = code_version
        self._shell = shell
        self.mirror = mirror
        self.default_class: dict[str, str] = {}   # stage → the worker class its rule names
        # On a gs:// root, a function of a job's inputs: their directories
        # that a rule in its own layout's job writes alone (wiring.jobfiles.input_dirs_of).
        self.input_dirs = None
        # A function of a job's inputs: those a job of a rule in its own
        # layout may have made, with their record directories (wiring.jobfiles.input_records_of).
        self.input_records = None
        self._lines: dict[tuple, object] = {}

    def params_function(self, stage: str):
        """A params function giving a stage job's step spec line."""
        graph = self.resolver.graph

        def spec_line(wildcards, input, output):
            experiment = wildcards.experiment
            pair = graph.pair(wildcards)
            instance = wildcards.get("instance")
            own = {"stage_dir": layout.stage_dir(self.config["root"], pair, experiment, stage, instance),
                   "pair": pair, "inputs": list(input), "outputs": list(output)}
            if instance:
                own["instance"] = instance
            beside = self.input_dirs(input) if self.input_dirs else None
            if beside:   # (an input a rule in its own layout made: its side files come down with it)
                own["input_dirs"] = beside
            source = self.resolver.reuse_location(experiment, pair, stage, instance)
            if source:
                own["reuse_from"] = source
            return wspec.extend(self.scope_line(stage, experiment, pair, instance), own)
        return presigned(spec_line)

    def own_layout_function(self, rule: str, experiment: str | None, flagged: dict[str, list[int]], own_dirs,
                            log_files, retries: int = 0):
        """A params function giving the step spec line of a job of a rule in
        its own layout: its record in the rule's stage directory of its
        experiment (``layout.ALL_PAIRS``), under a name its wildcards make
        (``layout.own_job``: ``experiment`` None, the config declares
        several: its ``{experiment}`` wildcard's); its outputs where the
        rule puts them (``flagged``: the positions of its ``temp()``
        outputs, which Snakemake removes later, of its ``touch()`` ones,
        which it makes once the job ended, and of its ``update()`` ones,
        which the job updates where they are; ``own_dirs(output)``: the
        directories only the job writes, and the others; ``log_files(values)``:
        its log files; ``retries``: the rule's own ``retries:``)."""
        root = self.config["root"]
        encoded: dict[str, str] = {}   # experiment → the encoded fields its settings decide

        def spec_line(wildcards, input, output):
            values = dict(wildcards.items())
            job_experiment, instance = layout.own_job(values, experiment)
            if job_experiment not in encoded:
                if job_experiment not in self.config["experiments"]:
                    raise StageError(f"rule {rule}: a job with experiment={job_experiment!r}, which the config "
                                     f"does not declare (expected one of: {', '.join(self.config['experiments'])})")
                encoded[job_experiment] = wspec.encode(self.fields(rule, job_experiment, layout.ALL_PAIRS))
            own = {"stage_dir": layout.stage_dir(root, layout.ALL_PAIRS, job_experiment, rule, instance),
                   "pair": layout.ALL_PAIRS, "inputs": list(input), "outputs": list(output),
                   "own_layout": True, "wildcards": values}
            if instance:
                own["instance"] = instance
            if retries:
                own["rule_retries"] = retries
            for flag, field in (("temp", "temporary"), ("touch", "touched"), ("update", "updated")):
                if flagged[flag]:
                    own[field] = [output[i] for i in flagged[flag]]
            mine, shared = own_dirs(output)
            if mine:
                own["own_dirs"] = mine
            if shared:
                own["shared_dirs"] = shared
            made = self.input_records(input) if self.input_records else None
            if made:
                own["input_records"] = made
            beside = self.input_dirs(input) if self.input_dirs else None
            if beside:
                own["input_dirs"] = beside
            logs = log_files(values)
            if logs:
                own["log_dirs"] = sorted({os.path.dirname(f) for f in logs} - {""})
                if self.mirror:
                    own["log_files"] = logs
            source = self.resolver.reuse_location(job_experiment, layout.ALL_PAIRS, rule, instance)
            if source:   # (the same job of another experiment, or a record directory: waypost.state.reuse)
                own["reuse_from"] = source
            return wspec.extend(encoded[job_experiment], own)
        return presigned(spec_line)

    def scope_line(self, stage: str, experiment: str, pair: str, instance: str | None = None) -> str:
        """The encoded fields a job's stage settings decide."""
        resolver = self.resolver
        scope = resolver.scope(experiment, pair, instance)
        point = resolver.point(experiment, instance)
        values = None if point is None else resolver.points[experiment][point]
        if values is not None and any(key in values for key in paramsets.ENGINE_KEYS):
            key = (stage, experiment, scope, point)
            if key not in self._lines:
                self._lines[key] = wspec.encode(self.fields(stage, experiment, pair, instance))
            return self._lines[key]
        key = (stage, experiment, scope, values is not None)
        found = self._lines.get(key)
        if found is None:
            fields = self.fields(stage, experiment, pair, instance)
            if values is None:
                found = wspec.encode(fields)
            else:
                found = scope_template(fields, resolver.scope_settings(experiment, scope, stage))
            self._lines[key] = found
        if values is None:
            return found
        if found is False:   # (marks that can't be told from the fields' own text)
            return wspec.encode(self.fields(stage, experiment, pair, instance))
        return point_line(found, values)

    def fields(self, stage: str, experiment: str, pair: str, instance: str | None = None) -> dict:
        """The step spec's fields that a job's stage settings decide."""
        resolver = self.resolver
        settings = dict(resolver.stage_settings(experiment, pair, stage, instance))
        engine = {key: settings.pop(key, None) for key in paramsets.ENGINE_KEYS}
        policy = dict(engine["policy"] or {})
        worker_name, spec = resolver.worker(stage, self.default_class.get(stage, "cpu"), experiment, pair, instance)
        runtime = (engine["resources"] or {}).get("runtime", spec.get("runtime"))
        if policy.get("runtime") is None and runtime:
            policy["runtime"] = runtime
        fields = {"stage": stage, "experiment": experiment, "settings": settings, "policy": policy,
                  "config_hash": wconfig.settings_hash(settings), "code_version": self._code_version(stage),
                  "pool": resolver.pool, "worker_class": worker_name, "worker_env": spec.get("env") or {},
                  "shell": self._shell(stage)}
        if stage in resolver.graph.stages and resolver.tolerated(stage, experiment, pair, instance):
            fields["tolerated"] = True
        if self.mirror:
            fields["mirror"] = self.mirror
        if self.config.get("mounts"):
            fields["mounts"] = self.config["mounts"]
        return fields


def point_line(template: tuple, values: dict) -> str:
    """A grid point's line from its scope's template (``scope_template``) and the
    point's values."""
    head, middle, tail, base, hash_first = template
    settings = {**base, **values}
    blob = wconfig.settings_json(settings)
    digest = wconfig.settings_hash(settings, blob)
    return head + (digest + middle + blob if hash_first else blob + middle + digest) + tail


def scope_template(fields: dict, scope_settings: dict) -> tuple | bool:
    """A scope's encoded fields cut around its settings and their hash:
    (head, middle, tail, the scope's settings without the engine's keys,
    whether the hash comes first); False where the marks can't be found
    (once each) in the line."""
    marks = {"settings": "\x00waypost-settings\x00", "config_hash": "\x00waypost-hash\x00"}
    line = wspec.encode({**fields, **marks})
    at = {name: line.index(json.dumps(mark)) for name, mark in marks.items()}
    first, second = sorted(marks, key=at.get)
    one, two = json.dumps(marks[first]), json.dumps(marks[second])
    head, rest = line[:at[first]], line[at[first] + len(one):]
    if line.count(one) != 1 or line.count(two) != 1:
        return False
    middle, tail = rest.split(two, 1)
    quote = '"'   # the hash is a JSON string, its mark's quotes stay around it
    if first == "config_hash":
        head, middle = head + quote, quote + middle
    else:
        middle, tail = middle + quote, quote + tail
    base = {key: value for key, value in scope_settings.items() if key not in paramsets.ENGINE_KEYS}
    return head, middle, tail, base, first == "config_hash"
