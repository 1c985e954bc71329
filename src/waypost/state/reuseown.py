"""Reuse for a rule in its own layout: a job (its rule and wildcards) takes
the outputs of the same job of another experiment (its record under the
same root, ``{root}/_all/{source}/{rule}/{wildcards}``, or a record
directory named in the config) instead of running its command.

The source's declared outputs (its manifest's ``declared``, in the rule's
order) map onto this job's, position by position: the paths may differ (an
experiment whose paths come from its config). A ``directory()`` output
comes whole, and a side file (``"side": true``) comes into the directory of
this job that holds the output at the same position as the source's. Each
file is copied under a temporary name, checked against the source
manifest's size and sha256, then renamed into place; the job's manifest
says ``reused_from``, with one ``reuse`` attempt.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time

from waypost import scheduler, stores
from waypost.model import manifest, records
from waypost.model import spec as wspec
from waypost.model.job import Job, outputs_base
from waypost.state import lifecycle
from waypost.state.reuse import read_source, unusable


class ReuseError(manifest.ManifestError):
    """The source can't be taken: one line, nothing of this job's changed."""


def take(step: wspec.StepSpec) -> int:
    """Run a reuse job of a rule in its own layout (its spec's ``reuse_from``)."""
    # (on a gs:// root the paths are reckoned on the bucket's local copies: the same layout)
    local = functools.partial(stores.local_of, step.mirror) if stores.needs_mirror(step.stage_dir) else str
    job = Job.of_step(step, local)
    name, base, outputs = job.name, job.base, list(job.outputs)
    busy = lifecycle.live_attempt(step.stage_dir, me=os.getpid())
    if busy:
        print(f"waypost: {name}: an attempt is still running in {step.stage_dir} ({busy.where})", file=sys.stderr)
        return 75
    started, started_iso = time.time(), manifest.now_iso()
    temporary = [local(t) for t in step.temporary]
    try:
        data = read_source(step.reuse_from)
        problem = unusable(data, step.reuse_from)
        if problem:
            raise ReuseError(problem)
        copies = _plan(step, data, base, outputs, temporary)
        store = stores.store_for(step.stage_dir, quiet=True)
        if local is str:
            os.makedirs(step.stage_dir, exist_ok=True)
        archived = store.archive(step.stage_dir)
        if archived:
            print(f"waypost: {name}: its earlier record archived in {archived}", file=sys.stderr)
        described = _bring(copies, base, temporary, step.mirror if local is not str else None)
    except (OSError, manifest.ManifestError) as exc:
        print(f"waypost: {name}: can't reuse: {exc}", file=sys.stderr)
        return 1
    attempt = records.attempt(number=1, series=1, action="reuse", state="SUCCESS", exit_code=0, start=started_iso,
                              end=manifest.now_iso(), duration_s=round(time.time() - started, 3),
                              host=manifest.hostname(), run=os.environ.get(manifest.RUN_ID_ENV),
                              job=scheduler.current_job(), command=None,
                              worker={"pool": None, "class": None}, how="copied")
    attempt["decision"] = {"action": "done", "reason": f"reused from {step.reuse_from}"}
    record = records.manifest(
        experiment=step.experiment, pair=step.pair, stage=step.stage, instance=step.instance, state="SUCCESS",
        created=manifest.now_iso(), attempts=[attempt],
        outputs=described, inputs=[],
        settings=data.get("settings") or {}, config_hash=data.get("config_hash") or "",
        code_version=data.get("code_version") or "", reused_from=step.reuse_from,
        run=os.environ.get(manifest.RUN_ID_ENV),
        reused_manifest={k: data.get(k) for k in ("experiment", "pair", "stage", "instance", "created",
                                                  "reused_from", "adopted", "code_version")},
        source_created=data.get("source_created") or data.get("created"), **job.record_fields())
    store.write_manifest(step.stage_dir, record)
    print(f"waypost: {name}: reused from {step.reuse_from} ({len(copies)} file(s) copied, checksums match)",
          file=sys.stderr)
    return 0


def _bring(copies: list[tuple[str, dict]], base: str, temporary: list[str], mirror: str | None) -> list[dict]:
    """Each file copied in, checked (``_plan``'s copies), and the manifest's
    outputs: on disk each under a temporary name, checked against the source
    manifest's size and sha256, then renamed into place; on a gs:// root
    (``mirror``: where its local copies are) into the bucket, server-side
    from a bucket (``bucket.copy_checked``), the source's checksums kept."""
    side = [target for target, entry in copies if entry.get("side")]
    if mirror is None:
        stores.place_checked([(target, entry, entry["source"]) for target, entry in copies],
                      lambda entry, temp: shutil.copyfile(entry["source"], temp))
        return manifest.describe_outputs(base, [target for target, _ in copies], temporary, side)
    names = {target: stores.url_of(mirror, target)[len(stores.SCHEME):] for target, _ in copies}
    fs = stores.filesystem(stores.SCHEME + next(iter(names.values()), "any"))[0]
    stores.copy_checked(fs, [(entry["source"], names[target], entry) for target, entry in copies])
    return [{"path": os.path.relpath(target, base), "size": entry["size"], "sha256": entry["sha256"],
             **({"crc32c": entry["crc32c"]} if entry.get("crc32c") else {}),
             **({"temp": True} if target in temporary else {}), **({"side": True} if entry.get("side") else {})}
            for target, entry in copies]


def _plan(step: wspec.StepSpec, data: records.Manifest, base: str, outputs: list[str],
          temporary: list[str]) -> list[tuple[str, dict]]:
    """(target path, the source manifest's entry) for each file to copy
    (``outputs``, ``temporary``: the job's, as paths)."""
    source = step.reuse_from
    declared = data.get("declared")
    if not isinstance(declared, list) or not data.get("outputs_dir"):
        raise ReuseError(f"{source}: not the record of a rule in its own layout (its manifest lists no "
                         "declared outputs): a stage's directory is reused by a stage rule")
    if len(declared) != len(outputs):
        raise ReuseError(f"{source}: the source job declares {len(declared)} output(s), this one "
                         f"{len(outputs)}: they can't be matched position by position")
    source_base = outputs_base(source, data)
    # where each of the source's declared outputs goes, and the directory it is in
    places = {rel: os.path.relpath(os.path.abspath(out), base) for rel, out in zip(declared, outputs)}
    folders = {os.path.dirname(rel): os.path.dirname(target) for rel, target in places.items()}
    copies = []
    for entry in data.get("outputs", []):
        rel = entry["path"]
        if rel in places:
            target = places[rel]
        elif entry.get("side") and os.path.dirname(rel) in folders:
            target = os.path.join(folders[os.path.dirname(rel)], os.path.basename(rel))
        else:
            inside = next((d for d in declared if rel.startswith(d + "/")), None)   # in a directory() output
            if inside is None:
                continue   # (a side file of a directory this job doesn't have)
            target = places[inside] + rel[len(inside):]
        copies.append((os.path.join(base, target), {**entry, "source": stores.join(source_base, rel)}))
    found = {os.path.relpath(t, base) for t, _ in copies}
    missing = [places[d] for d in declared if places[d] not in found
               and not any(f.startswith(places[d] + "/") for f in found)]
    temporary = {os.path.relpath(os.path.abspath(t), base) for t in temporary}
    missing = [m for m in missing if m not in temporary]
    if missing:
        raise ReuseError(f"{source}: the source job has nothing for {', '.join(missing)}")
    return copies
