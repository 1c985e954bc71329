"""Reuse: a job taken from another experiment, directory or bucket instead
of computed.

The job of a reused stage, or of a rule in its own layout, runs the step
runner with ``reuse_from: SOURCE`` in its step spec (a record directory:
another experiment's stage, or the same rule's job of another experiment,
``{root}/_all/{source}/{rule}/{wildcards}``): instead of the step, the
runner brings the source's files (those its manifest lists) into the job
(``take``). Where each goes is the job's answer (``Job.places_of``): a
stage's at the same paths in its stage directory; a rule in its own
layout's onto its own declared outputs position by position (the paths may
differ), its side files beside them. While they come in, the job's
running marker (``_running.json``) is in its record directory, as an
attempt's: a concurrent attempt waits for it, ``waypost status`` shows it
at work.

The files come as copies, never links (a hard link would let a step that
edits its output in place change the source): on disk a reflink where the filesystem makes one
(``stores.local.copy_file``: Btrfs, XFS, ...; the attempt's ``how`` says
``reflinked``), else a full copy (``copied``); from a bucket, a download;
into a bucket, an upload, or a server-side copy from another gs://
location (no bytes through the node: ``copied in the bucket``). Each is
checked against the source manifest's size and sha256 (or listed crc32c),
and the runner writes a manifest of its own with ``reused_from``. Files
arrive under a temporary name and are renamed into place only once checked,
so a killed copy never leaves an output that looks done.

The cost is storage: a reused stage holds its own full copy of each output
(a reflink shares the blocks until either file is rewritten), and in a bucket
a server-side copy is a new object, stored and billed at its full size.

A reuse of a stage of another experiment of the same config waits for it
when that stage is to be made (``StateView.reuse_plan``): the run makes it
first, then takes it.
"""

from __future__ import annotations

import os
import sys
import time

from waypost import scheduler, stores
from waypost.model import layout, manifest, records
from waypost.model.job import Job, Unplaceable
from waypost.state import lifecycle


def read_source(location: str) -> records.Manifest:
    """The source stage's manifest (``manifest.load``: every path it lists
    inside the source stage dir); ManifestError when there is none or it
    can't be read or used."""
    data = stores.manifest_at(location)
    if data is None:
        path = layout.join(location, layout.MANIFEST)
        raise manifest.ManifestError(f"{path}: no manifest (not a finished waypost stage)")
    return data


def source_problem(location: str) -> str | None:
    """Why a location can't be reused (None when it can)."""
    try:
        return unusable(read_source(location), location)
    except manifest.ManifestError as exc:
        return str(exc)


def being_redone(location: str) -> bool:
    """Is a source that can't be reused now on its way: its stage directory
    there without a manifest, but with earlier runs archived (``waypost
    rerun`` moved the last aside) or an attempt at work? A reuse of it waits
    (see ``StateView.reuse_plan``); one of a source not there at all is a
    mistake to say."""
    try:
        tree = stores.over(location)
        life = lifecycle.read(tree, location)
        return layout.MANIFEST not in life.entries and bool(life.live or tree.archives(location))
    except (OSError, manifest.ManifestError):
        return False


def unusable(data: records.Manifest, location: str) -> str | None:
    if data["state"] != "SUCCESS":
        return f"{location}: the source stage is {data['state']}, not SUCCESS"
    if data.get("provisional"):
        return f"{location}: the source stage is provisional (it ran over failed parents)"
    return None


def take(step) -> int:
    """Run a reuse job: the runner's work when the step spec has ``reuse_from``.
    One sequence for every job: no attempt at work in its record directory;
    the source checked; the earlier record archived; the running marker
    written while the files come in, each checked, then renamed into place
    (``bring``); the manifest, saying ``reused_from``; the marker gone. Only
    where each source file goes depends on the job (``Job.places_of``)."""
    remote, _, _ = stores.workspace_for(step)  # a gs:// record: its engine files, locally
    if remote:
        remote.input_dirs = []   # (a reuse reads no input: nothing beside its inputs comes down either)
        remote.pull([])
    job = Job.of_step(step, remote.local_of if remote else str)
    name, record_dir, source = job.name, job.record_dir, step.reuse_from
    busy = lifecycle.live_attempt(record_dir, me=os.getpid())
    if busy:
        print(f"waypost: {name}: an attempt is still running in {record_dir} ({busy.where})", file=sys.stderr)
        return 75
    started, started_iso = time.time(), manifest.now_iso()
    temporary = tuple(remote.local_of(t) for t in step.temporary) if remote else tuple(step.temporary)
    try:
        data = _usable_source(source)
        places = job.places_of(source, data, temporary)
        archived = _archive_earlier(remote, record_dir)
    except (manifest.ManifestError, Unplaceable) as exc:
        print(f"waypost: {name}: can't reuse: {exc}", file=sys.stderr)
        return 1
    if archived:
        print(f"waypost: {name}: its earlier record in {record_dir} archived in {archived}", file=sys.stderr)
    running = os.path.join(record_dir, layout.RUNNING)
    marker = records.marker(pid=os.getpid(), host=manifest.hostname(), run=os.environ.get(manifest.RUN_ID_ENV),
                            series=1, series_base=0, outputs=[job.relative(target) for target, _ in places],
                            job=scheduler.current_job(), attempts=[])
    marker.update(job.marker_fields())   # (as an attempt's marker says it: where its outputs are)
    manifest.write_json_atomic(running, records.checked("marker", marker, running), durable=False)
    try:
        how, crc32cs = bring(remote, job, Job.of_record(source, data).base, places)
    except (OSError, manifest.ManifestError) as exc:
        os.unlink(running)
        if remote:
            remote.close()
        print(f"waypost: {name}: can't reuse: {exc}", file=sys.stderr)
        return 1
    record = _reused_manifest(step, job, data, _outputs(job, places, crc32cs, temporary),
                              started, started_iso, how)
    path = manifest.manifest_path(record_dir)
    manifest.write_json_atomic(path, records.checked("manifest", record, path))
    if remote:
        remote.push(list(job.outputs))  # the manifest (the outputs are there already)
    os.unlink(running)
    if remote:
        remote.close()
    print(f"waypost: {name}: reused from {source} ({how}, checksums match)", file=sys.stderr)
    return 0


def _usable_source(source: str) -> records.Manifest:
    """The source stage's manifest; ManifestError when it can't be reused."""
    data = read_source(source)
    problem = unusable(data, source)
    if problem:
        raise manifest.ManifestError(problem)
    return data


def _archive_earlier(remote, record_dir: str) -> str | None:
    """The record directory made, an earlier record in it archived (where
    to, or None); ManifestError for an .attempts that is a link out of it."""
    os.makedirs(record_dir, exist_ok=True)
    if remote:
        return remote.archive()
    return stores.store_for(record_dir, quiet=True).archive(record_dir)


def bring(remote, job: Job, source_base: str, places: list[tuple[str, dict]]) -> tuple[str, dict[str, str]]:
    """The source's files (each entry's ``path`` from ``source_base``) at
    their places in the job (``Job.places_of``), each checked against its
    entry and put in place only once checked: into a gs:// record's bucket
    through its workspace (server-side from a bucket); on a path, the
    store's own copy where each keeps its path from the outputs' base (a
    reflink; through a bucket's mount, a server-side copy), else each
    fetched under a temporary name, then renamed. How, and the crc32c of
    each copy read, by its entry's path."""
    source = stores.store_for(source_base, quiet=True)
    if remote:
        return remote.copy_in(source, source_base, places)
    entries = [entry for _, entry in places]
    if all(target == os.path.join(job.base, entry["path"]) for target, entry in places):
        return stores.store_for(job.base, quiet=True).bring(source, source_base, job.base, entries)
    how, crc32cs = stores.place_checked([(target, entry, layout.join(source_base, entry["path"]))
                                         for target, entry in places],
                                        lambda entry, temp: source.fetch(source_base, entry["path"], temp))
    return " and ".join(sorted(how)) or "nothing", crc32cs


def _outputs(job: Job, places: list[tuple[str, dict]], crc32cs: dict[str, str],
             temporary: tuple[str, ...]) -> list[dict]:
    """The reusing job's manifest's outputs: the source's, at their places
    (paths from the job's outputs' base), its checksums (its crc32c, or the
    copy's where the source recorded none: one recorded before waypost kept
    them)."""
    temp = {os.path.abspath(t) for t in temporary}
    recorded = []
    for target, entry in places:
        crc32c = entry.get("crc32c") or crc32cs.get(entry["path"])
        recorded.append({"path": job.relative(target), "size": entry["size"], "sha256": entry["sha256"],
                         **({"crc32c": crc32c} if crc32c else {}),
                         **({"temp": True} if os.path.abspath(target) in temp else {}),
                         **({"side": True} if entry.get("side") else {})})
    return recorded


def _reused_manifest(step, job: Job, data: records.Manifest, outputs: list[dict], started: float,
                     started_iso: str, how: str) -> records.Manifest:
    """The reusing job's manifest: one "reuse" attempt, the source's
    outputs, settings and provenance; where its outputs are, for a job
    whose outputs are not in its record (``Job.record_fields``)."""
    source = step.reuse_from
    attempt = records.attempt(number=1, series=1, action="reuse", state="SUCCESS", exit_code=0, start=started_iso,
                              end=manifest.now_iso(), duration_s=round(time.time() - started, 3),
                              host=manifest.hostname(), run=os.environ.get(manifest.RUN_ID_ENV),
                              job=scheduler.current_job(), command=None,
                              worker={"pool": None, "class": None}, how=how)
    attempt["decision"] = {"action": "done", "reason": f"reused from {source}"}
    return records.manifest(
        experiment=step.experiment, pair=step.pair, stage=step.stage, instance=step.instance, state="SUCCESS",
        created=manifest.now_iso(), attempts=[attempt], outputs=outputs, inputs=[],
        settings=data.get("settings") or {}, config_hash=data.get("config_hash") or "",
        code_version=data.get("code_version") or "", reused_from=source,
        run=os.environ.get(manifest.RUN_ID_ENV),
        # The source's own record, so provenance survives the source being deleted.
        reused_manifest={k: data.get(k) for k in ("experiment", "pair", "stage", "instance", "created",
                                                  "reused_from", "adopted", "code_version")},
        # When the work was made, not when it was linked: the source's time
        # (its own source's, when it is a reused copy itself).
        source_created=data.get("source_created") or data.get("created"), **job.record_fields())


def pointers(config: dict, parents: dict[str, set[str]], into: str, source: str, upstream_of: str,
             pairs: list[str] | None = None, source_root: str | None = None) -> tuple[dict, list[str]]:
    """The ``reuse`` entries that make ``into`` take every stage upstream of
    ``upstream_of`` from experiment ``source`` (under ``source_root``, default
    the pipeline's root), and the problems that forbid it (a source stage
    that isn't a finished SUCCESS)."""
    from waypost.model import graph

    chosen = _pointer_pairs(config, parents, into, upstream_of, pairs)
    root = source_root or config["root"]
    stages = [s for s in parents if s in graph.ancestors(parents, upstream_of)]
    entries, problems = {}, []
    tree = stores.store_for(root)  # a bucket: one listing, one batch read of the manifests
    for stage in stages:
        for pair in chosen:
            problems += _source_stage_problems(root, source, pair, stage, tree)
        if source_root:
            entries[stage] = {pair: layout.stage_dir(root, pair, source, stage) for pair in chosen}
        elif pairs:
            entries[stage] = {pair: source for pair in chosen}
        else:
            entries[stage] = source
    return entries, problems


def _pointer_pairs(config: dict, parents: dict[str, set[str]], into: str, upstream_of: str,
                   pairs: list[str] | None) -> list[str]:
    """The pairs of ``into`` that ``pointers`` writes entries for (``pairs``,
    default all of its own); ConfigError for an experiment, stage or pair
    the config doesn't have."""
    from waypost.model import config as wconfig

    experiments = config["experiments"]
    if into not in experiments:
        raise wconfig.ConfigError(f"experiment {into!r} is not in the config; add experiments.{into} "
                                  f"(with its pairs) first")
    if upstream_of not in parents:
        raise wconfig.ConfigError(f"unknown stage {upstream_of!r} (expected one of: {', '.join(parents)})")
    chosen = pairs or experiments[into]["pairs"]
    unknown = [p for p in chosen if p not in experiments[into]["pairs"]]
    if unknown:
        raise wconfig.ConfigError(f"pair(s) {', '.join(unknown)} not in experiment {into!r} "
                                  f"(expected some of: {', '.join(experiments[into]['pairs'])})")
    return chosen


def _source_stage_problems(root: str, source: str, pair: str, stage: str, tree) -> list[str]:
    """Why one stage of the source experiment can't be reused (none when it
    is a finished SUCCESS, every instance too)."""
    from waypost.state import status

    cell = status.stage_cell(root, source, pair, stage, tree)
    cells = [cell, *cell.get("instances", {}).values()]
    unreadable = [c["error"] for c in cells if c.get("error")]   # a manifest waypost won't use: why
    if unreadable:
        return unreadable
    if cell["state"] != "SUCCESS" or any(c.get("provisional") for c in cells):
        return [f"{layout.stage_dir(root, pair, source, stage)}: {cell['state']}"
                + (" (provisional)" if cell["state"] == "SUCCESS" else "")]
    return []


def write_pointers(path: str, into: str, entries: dict, command: str) -> None:
    """Merge ``entries`` into the reuse file of experiment ``into``."""
    import yaml

    from waypost.model import config as wconfig

    existing = wconfig.load_yaml(path) if os.path.exists(path) else {}
    merged = wconfig.merge(existing, {"experiments": {into: {"reuse": entries}}})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = path + ".tmp"
    with open(temp, "w") as f:
        f.write(f"# Reuse pointers of experiment {into}, merged over the config. Written by\n"
                f"#   {command}\n# Delete this file (or an entry) to compute those stages again.\n")
        yaml.safe_dump(merged, f, sort_keys=False)
    os.replace(temp, path)
