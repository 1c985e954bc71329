"""``waypost adopt`` for a rule in its own layout: files a user put by hand
where the rule writes them (a teacher trained elsewhere, a table made once)
become that job's outputs, done, with a record that says so.

The job is the rule and its wildcards, as in Snakemake. Its outputs are the
rule's output patterns (as the last parse of the workflow recorded them:
``own_outputs`` in the workflow's facts) filled with those wildcards; every
one must be there. Its record, in the job's directory under the root
(``{root}/_all/{experiment}/{rule}/{wildcards}``), is the one a run writes
(``outputs_dir``, ``declared``, ``wildcards``) with ``adopted`` and no
attempt. Then the job is done in presence mode, shown as adopted, and can be
the source of another experiment's reuse. What the record directory held
before (an earlier manifest and its logs) is archived first, as a stage's
adopt archives it.
"""

from __future__ import annotations

import os
import re

from waypost import stores
from waypost.model import layout, manifest, records
from waypost.model.config import check_names
from waypost.ops.steer import SteerError, adoptable, adopted_manifest, set_aside_records

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
    its outputs. Returns the record, its directory, and what was archived."""
    check_names(config, experiment)
    values, outputs = _job_outputs(rule, experiment, given, patterns)
    several = len(config["experiments"]) > 1
    experiment, instance = layout.own_job(values, None if several else experiment)
    record_dir = layout.stage_dir(config["root"], layout.ALL_PAIRS, experiment, rule, instance)
    tree = stores.store_for(record_dir)
    previous = adoptable(tree, record_dir, force, "job with its own record")
    base = os.path.commonpath([os.path.dirname(os.path.abspath(path)) for path in outputs])
    described = manifest.describe_outputs(base, [os.path.abspath(path) for path in outputs])
    replaced = set_aside_records(tree, record_dir, [], previous) if tree.isdir(record_dir) else None
    os.makedirs(record_dir, exist_ok=True)
    record = adopted_manifest(
        experiment=experiment, pair=layout.ALL_PAIRS, stage=rule, instance=instance, outputs=described, note=note,
        outputs_dir=os.path.relpath(base, os.path.abspath(record_dir)), wildcards=values,
        declared=[os.path.relpath(os.path.abspath(path), base) for path in outputs])
    tree.write_manifest(record_dir, record)
    return record, record_dir, replaced


def _job_outputs(rule: str, experiment: str, given: dict[str, str],
                 patterns: list[str]) -> tuple[dict[str, str], list[str]]:
    """The job's wildcards (every one of its rule's, in their order) and its
    outputs, which must all be there; else SteerError, one line."""
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
    absent = [path for path in outputs if not os.path.exists(path)]
    if absent:
        raise SteerError(f"adopt {rule}: put its outputs where the rule writes them first; missing: "
                         f"{', '.join(absent)}; nothing adopted")
    return values, outputs
