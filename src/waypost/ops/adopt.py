"""``waypost adopt``: files a user put by hand where a job writes them (a
teacher trained elsewhere, a table made once) become that job's outputs,
done, with a record that says so (``adopted``), their checksums, and who
adopted them and why. Then the job is done in presence mode, shown as
adopted, and can be the source of another experiment's reuse.

One operation over the ``Job`` (``adopt_job``): no attempt at work in its
record directory, and not a SUCCESS the pipeline made unless forced; what
the record directory held beside the adopted files (an earlier manifest,
adopted or not, and its logs) archived into ``.attempts/<n>/`` as a
rerun's; the outputs described through the job's store (on a gs:// root the
objects are read for their sha256, their crc32c is the listing's); the
record written. Only how the job is named differs:

- a stage by its experiment, pair and instance (``stage_job``): its
  outputs are the files its stage directory holds;
- a rule in its own layout by its wildcards (``own_job``): its outputs are
  the rule's output patterns (as the last parse of the workflow recorded
  them: ``own_outputs`` in the workflow's facts) filled with them, where the
  rule writes them, every one of which must be there; its record is in the
  job's directory under the root (``{root}/_all/{experiment}/{rule}/{wildcards}``).
"""

from __future__ import annotations

import getpass
import os
import re
import socket

from waypost import stores
from waypost.model import layout, locations, manifest, records, trust
from waypost.model.config import check_names
from waypost.model.job import Job
from waypost.ops.steer import SteerError
from waypost.state import lifecycle

_FIELD = re.compile(r"\{(\w+)\}")


def adopt(config: dict, stage: str, experiment: str, pair: str, instance: str | None = None,
          note: str | None = None, force: bool = False) -> tuple[records.Manifest, dict | None]:
    """Adopt the files put by hand in a stage's directory (``adopt_job``)."""
    return adopt_job(*stage_job(config, stage, experiment, pair, instance), note, force)


def adopt_own(config: dict, rule: str, experiment: str, given: dict[str, str], patterns: list[str],
              note: str | None = None, force: bool = False) -> tuple[records.Manifest, str, dict | None]:
    """Adopt the files at the outputs of the job of ``rule`` (in its own
    layout, outputs ``patterns``) whose wildcards are ``given`` (with
    ``experiment``'s own where its paths carry one) in ``experiment``
    (``adopt_job``). Returns the record, its directory, and what was archived."""
    tree, job = own_job(config, rule, experiment, given, patterns)
    record, replaced = adopt_job(tree, job, note, force)
    return record, job.record_dir, replaced


def adopt_job(tree, job: Job, note: str | None, force: bool) -> tuple[records.Manifest, dict | None]:
    """Write the record of ``job`` (in ``tree``, its store) saying it is
    done, the files at its outputs adopted. What its record directory held
    before (an earlier manifest, its logs) is archived first, as a rerun
    archives a workspace; the files adopted there stay. Returns the record
    and what was archived (``set_aside_records``)."""
    previous = adoptable(tree, job.record_dir, force, job.described_as)
    outputs = tree.describe(job.base, [job.relative(f) for f in _files(tree, job)])
    inside = [o["path"] for o in outputs if locations.below(job.record_dir, job.output_path(o["path"]))]
    replaced = set_aside_records(tree, job.record_dir, inside, previous) if tree.isdir(job.record_dir) else None
    if not stores.is_bucket_url(job.record_dir):
        os.makedirs(job.record_dir, exist_ok=True)
    record = adopted_manifest(experiment=job.experiment, pair=job.pair, stage=job.rule, instance=job.instance,
                              outputs=outputs, note=note, **job.record_fields())
    tree.write_manifest(job.record_dir, record)
    return record, replaced


def _files(tree, job: Job) -> list[str]:
    """The job's outputs as files: a ``directory()`` output's every file
    (sorted; one that is a link to nothing holds none), as a run records them."""
    found = []
    for output in job.outputs:
        if tree.isdir(output):
            found += [name for name in (layout.join(output, rel) for rel in tree.files(output)) if tree.exists(name)]
        else:
            found.append(output)
    return found


def stage_job(config: dict, stage: str, experiment: str, pair: str, instance: str | None = None) -> tuple:
    """(its store, the job) of a stage whose files were put in its
    directory by hand: every file there but waypost's own; SteerError when
    there is none, or one is a link out of the directory."""
    check_names(config, experiment, pair, stage, allow_all_pairs=True)
    stage_dir = layout.stage_dir(config["root"], pair, experiment, stage, instance)
    tree = stores.store_for(stage_dir)
    files = [f for f in tree.files(stage_dir)
             if not any(manifest.is_engine_file(part) for part in f.split("/"))]
    if not files:
        raise SteerError(f"{stage_dir}: no files to adopt")
    if tree.links:   # adopt never follows a link out of the stage dir (one that stays inside: its file)
        away = trust.links_out(stage_dir, skip=tuple(layout.ENGINE_FILES))
        if away:
            raise SteerError(f"{stage_dir}: " + "; ".join(f"{rel} is a symbolic link to {real}, outside the stage "
                                                          "directory or to nothing" for rel, real in away)
                             + "; nothing adopted (copy the file in, or hard-link it, instead)")
    return tree, Job(rule=stage, record_dir=stage_dir, outputs=tuple(layout.join(stage_dir, f) for f in files),
                     experiment=experiment, pair=pair, instance=instance)


def own_job(config: dict, rule: str, experiment: str, given: dict[str, str], patterns: list[str]) -> tuple:
    """(its store, the job) of a rule in its own layout named by its
    wildcards (``given``), its outputs (``patterns`` filled with them)
    all there; SteerError, one line, when they are not."""
    check_names(config, experiment)
    root = config["root"]
    on_bucket = stores.needs_mirror(root)   # (its patterns are then below the root, as the rule wrote them)
    tree = stores.store_for(root) if on_bucket else None
    values, outputs = _job_outputs(rule, experiment, given,
                                   [stores.join(root, p) for p in patterns] if on_bucket else patterns, tree)
    several = len(config["experiments"]) > 1
    experiment, instance = layout.own_job(values, None if several else experiment)
    record_dir = layout.stage_dir(root, layout.ALL_PAIRS, experiment, rule, instance)
    return tree or stores.store_for(record_dir), Job.in_own_layout(
        rule, record_dir, outputs if on_bucket else [os.path.abspath(o) for o in outputs],
        wildcards=values, experiment=experiment, pair=layout.ALL_PAIRS, instance=instance)


def wildcard_names(patterns: list[str]) -> list[str]:
    """The wildcards of a rule's output patterns, in the order they appear."""
    names: list[str] = []
    for pattern in patterns:
        names += [name for name in _FIELD.findall(pattern) if name not in names]
    return names


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


def adoptable(tree, directory: str, force: bool, what: str) -> records.Manifest | None:
    """The manifest ``directory`` holds (None: none), where adopt may write
    its own there: no attempt running, and not a SUCCESS the pipeline made
    itself (a ``what``) unless ``force``; else SteerError, nothing changed."""
    life = lifecycle.read(tree, directory)
    if life.live:
        raise SteerError(f"{directory}: an attempt is running ({life.live.where}); nothing was changed")
    previous = life.manifest
    if previous and previous["state"] == "SUCCESS" and not previous.get("adopted") and not force:
        raise SteerError(f"{directory}: already a SUCCESS {what} (use --force to adopt what is there now instead)")
    return previous


def adopted_manifest(*, note: str | None, **fields) -> records.Manifest:
    """The manifest adopt writes: SUCCESS, no attempt, who adopted it and why."""
    return records.manifest(state="SUCCESS", created=manifest.now_iso(), attempts=[], inputs=[], settings={},
                            config_hash="", code_version="", adopted=True,
                            adopted_by=f"{getpass.getuser()}@{socket.gethostname()}", note=note or None, **fields)


def set_aside_records(tree, stage_dir: str, files: list[str],
                      previous: records.Manifest | None) -> dict | None:
    """Before adopt writes its manifest: archive what the stage dir holds
    beside the files it adopts (the earlier manifest, its logs, an
    ``_unfinished`` mark: an adopted stage is done), the way a rerun
    archives a workspace, so the earlier run stays findable. Returns the
    archive (``archive``), what went there (``entries``) and the earlier
    manifest (``manifest``, None without a readable one); None when there
    was nothing."""
    adopted = {f.split("/")[0] for f in files}
    moved = sorted(e for e in tree.entries(stage_dir) if e not in adopted and e != layout.ATTEMPTS)
    try:
        archived = tree.archive(stage_dir, keep=tuple(adopted))
    except manifest.ManifestError as exc:   # an .attempts that is a link out (never archived through)
        raise SteerError(f"{exc}; nothing adopted") from None
    if not archived:
        return None
    return {"archive": layout.join(stage_dir, archived), "entries": moved, "manifest": previous}
