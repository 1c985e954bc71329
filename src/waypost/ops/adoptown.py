"""``waypost adopt`` for a rule in its own layout: files a user put by hand
where the rule writes them (a teacher trained elsewhere, a table made once)
become that job's outputs, done, with a record that says so.

The job is the rule and its wildcards, as in Snakemake. Its outputs are the
rule's output patterns (as the last parse of the workflow recorded them:
``own_outputs`` in the workflow's facts) filled with those wildcards; every
one must be there. Its record, in the job's directory under the root
(``{root}/_all/{experiment}/{rule}/{wildcards}``), is the one a run writes
(``outputs_dir``, ``declared``, ``wildcards``) with ``adopted`` and no
attempt. Then the job is done (``planning.ownpresence``), shown as adopted, and can be
the source of another experiment's reuse. The record is written as a
stage's is (``steer.adopt_job``, over the ``Job``): what the record
directory held before (an earlier manifest and its logs) archived first.
"""

from __future__ import annotations

import os
import re

from waypost import stores
from waypost.model import layout, manifest, records
from waypost.model.config import check_names
from waypost.model.job import Job
from waypost.ops.steer import SteerError, adopt_job

_FIELD = re.compile(r"\{(\w+)\}")


def wildcard_names(patterns: list[str]) -> list[str]:
    """The wildcards of a rule's output patterns, in the order they appear."""
    names: list[str] = []
    for pattern in patterns:
        names += [name for name in _FIELD.findall(pattern) if name not in names]
    return names


def adopt_own(config: dict, rule: str, experiment: str, given: dict[str, str], patterns: list[str],
              note: str | None = None, force: bool = False) -> tuple[records.Manifest, str, dict | None]:
    """Write the record of the job of ``rule`` (in its own layout, outputs
    ``patterns``) whose wildcards are ``given`` (with ``experiment``'s own
    where its paths carry one) in ``experiment``, adopting the files at
    its outputs (``steer.adopt_job``). Returns the record, its directory,
    and what was archived."""
    check_names(config, experiment)
    root = config["root"]
    on_bucket = stores.needs_mirror(root)   # (its patterns are then below the root, as the rule wrote them)
    tree = stores.store_for(root) if on_bucket else None
    values, outputs = _job_outputs(rule, experiment, given,
                                   [stores.join(root, p) for p in patterns] if on_bucket else patterns, tree)
    several = len(config["experiments"]) > 1
    experiment, instance = layout.own_job(values, None if several else experiment)
    record_dir = layout.stage_dir(root, layout.ALL_PAIRS, experiment, rule, instance)
    tree = tree or stores.store_for(record_dir)
    job = Job.in_own_layout(rule, record_dir, outputs if on_bucket else [os.path.abspath(o) for o in outputs],
                            wildcards=values, experiment=experiment, pair=layout.ALL_PAIRS, instance=instance)
    record, replaced = adopt_job(tree, job, lambda: _described_in(tree, job) if on_bucket
                                 else manifest.describe_outputs(job.base, list(job.outputs)), note, force)
    return record, record_dir, replaced


def _described_in(tree, job: Job) -> list[dict]:
    """The manifest's outputs of files in a bucket (``tree``), as
    ``manifest.describe_outputs`` describes local ones: a ``directory()``
    output's every object."""
    described = []
    for url in job.outputs:
        names = [stores.join(url, rel) for rel in tree.files(url)] if tree.isdir(url) else [url]
        for name in names:
            sha256, crc32c = tree.digests(name)
            described.append({"path": job.relative(name), "size": tree.size(name),
                              "sha256": sha256, **({"crc32c": crc32c} if crc32c else {})})
    return described


def _job_outputs(rule: str, experiment: str, given: dict[str, str], patterns: list[str],
                 tree=None) -> tuple[dict[str, str], list[str]]:
    """The job's wildcards (every one of its rule's, in their order) and its
    outputs, which must all be there (``tree``: in a bucket's store, the
    patterns its URLs); else SteerError, one line."""
    names = wildcard_names(patterns)
    values = {**given, **({"experiment": experiment} if "experiment" in names else {})}
    unknown = sorted(set(values) - set(names))
    missing = [name for name in names if name not in values]
    if unknown or missing:
        raise SteerError(f"adopt {rule}: its jobs' wildcards are {', '.join(names) or 'none'}"
                         + (f"; give {', '.join(f'{name}=VALUE' for name in missing)}" if missing else "")
                         + (f"; it has no {', '.join(unknown)}" if unknown else "") + "; nothing adopted")
    values = {name: str(values[name]) for name in names}
    outputs = [_FIELD.sub(lambda m: values[m.group(1)], pattern) for pattern in patterns]
    absent = [path for path in outputs if not (tree.exists(path) or tree.isdir(path) if tree else os.path.exists(path))]
    if absent:
        raise SteerError(f"adopt {rule}: put its outputs where the rule writes them first; missing: "
                         f"{', '.join(absent)}; nothing adopted")
    return values, outputs
