"""Stage directories whose manifest cannot be trusted, found and set aside.

A stage is not done when its ``_manifest.json`` is unreadable (truncated,
corrupt) or unusable (``manifest.parse``: a path that leaves the stage
directory, a wrong type; none of the files it lists is then read), or says
SUCCESS while an output it lists is missing, is a symbolic link out of the
stage directory (not followed), has another size, or (with checksums) other
contents. Such a stage's files are archived
under ``.attempts/<n>/`` (never deleted), so its outputs are gone and the next
run redoes it. On disk the contents are the sha256, cached by (path, size,
mtime) in ``.waypost/verified.json``, so a big unchanged model is hashed
once. On a gs:// root they are the crc32c GCS lists for each object, compared
with the one the manifest records beside the sha256: nothing is downloaded,
and the archive is a server-side move. A manifest written before waypost
recorded crc32c is checked by size only there (``verify`` counts them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from waypost import stores
from waypost.model import layout, manifest
from waypost.model.job import outputs_base

CACHE = os.path.join(".waypost", "verified.json")
# What verify says of a gs:// root where some stages could be checked by size
# only: their manifests record each output's sha256 but no crc32c (written
# before waypost recorded it); GCS keeps crc32c and md5, not sha256, so
# checking the sha256 would mean downloading every output. Rerunning (or
# `waypost adopt --force`-ing) such a stage records its crc32c.
SIZES_ONLY = ("bucket: {n} stage(s) checked by size only: their manifests record no crc32c "
              "(written before waypost recorded it), and their sha256 would mean downloading every output")
# ... and when the crc32c of every stage was compared.
CRC32C_CHECKED = "bucket: outputs checked by the crc32c GCS lists for each (no output downloaded)"
# ... and with --no-checksums.
NO_CHECKSUMS = "bucket: output sizes checked, not checksums (--no-checksums)"


@dataclass
class Problem:
    stage_dir: str
    what: str
    archived: str | None = None


class ChecksumCache:
    def __init__(self, path: str = CACHE):
        self.path = path
        try:
            with open(path) as f:
                self.data = json.load(f)
        except (OSError, ValueError):
            self.data = {}
        self.dirty = False

    def sha256(self, path: str) -> str:
        st = os.stat(path)
        key = os.path.abspath(path)
        cached = self.data.get(key)
        if cached and cached[0] == st.st_size and cached[1] == st.st_mtime_ns:
            return cached[2]
        digest = manifest.sha256_file(path)
        self.data[key] = [st.st_size, st.st_mtime_ns, digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        if self.dirty:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            manifest.write_json_atomic(self.path, self.data)


class Verified(list):
    """The problems ``verify`` found (a list of Problem), with how many
    finished stages it checked (``checked``) and how many of those by size
    only (``sizes_only``: on a gs:// root, manifests without crc32c; every
    one with ``checksums=False``)."""

    checked = 0
    sizes_only = 0
    listed = False   # contents checked by the crc32c the bucket lists (a bucket root or a known mount)


def check(tree, stage_dir: str, cache: ChecksumCache | None, checksums: bool = True) -> str | None:
    """What is wrong with a stage dir's manifest, or None."""
    return _check(tree, stage_dir, cache, checksums)[0]


def _check(tree, stage_dir: str, cache: ChecksumCache | None, checksums: bool = True) -> tuple[str | None, str | None]:
    """(what is wrong or None, how the outputs were checked: "contents",
    "sizes", or None when they weren't: no finished stage there)."""
    if tree.isfile(layout.join(stage_dir, layout.RUNNING)):
        return None, None  # an attempt is (or was) under way: the runner deals with it
    try:
        data = tree.manifest(stage_dir)
    except manifest.ManifestError as exc:
        what = str(exc)   # (said once: the stage dir heads verify's line)
        return what[len(stage_dir) + 2:] if what.startswith(stage_dir + ": ") else what, None
    if data is None or data["state"] != "SUCCESS":
        return None, None
    outputs = data.get("outputs", [])
    # On a bucket the listing's crc32c, when the manifest records every output's.
    crc = checksums and tree.listed_crc32c and all(out.get("crc32c") for out in outputs)
    how = "contents" if cache is not None or crc else "sizes"
    base = outputs_base(stage_dir, data)   # (a rule in its own layout: where its outputs are)
    for out in outputs:
        problem = _output_problem(tree, base, out, cache, crc)
        if problem:
            return problem, how
    return None, how


def _output_problem(tree, base: str, out: dict, cache: ChecksumCache | None, crc: bool) -> str | None:
    """What is wrong with one output a manifest lists (``out``, relative to
    ``base``), or None: sizes, then the sha256 (``cache``) or the listed
    crc32c (``crc``)."""
    path = layout.join(base, out["path"])
    away = tree.escapes(base, out["path"])
    if away:   # never read (nor sized) out of the stage dir
        return f"{out['path']} is a symbolic link out of its stage directory (to {away})"
    size = tree.size(path)
    if size is None:
        # (a temp() output Snakemake removed once its consumers ran; a side
        # file is not what makes a job done)
        return None if out.get("temp") or out.get("side") else f"{out['path']} is missing"
    if size != out.get("size"):
        return f"{out['path']} has {size} bytes, the manifest says {out.get('size')}"
    if cache is not None and cache.sha256(path) != out.get("sha256"):
        return f"{out['path']} does not match its checksum"
    if crc and tree.crc32c(path) != out["crc32c"]:
        return f"{out['path']} does not match its checksum (crc32c {tree.crc32c(path)}, the manifest says " \
               f"{out['crc32c']})"
    return None


def verify(root: str, checksums: bool = True, repair: bool = True) -> Verified:
    """Check every manifest under ``root``; archive the untrustworthy stages.
    On a gs:// root from one listing and one batch read of the manifests,
    contents by the listed crc32c (sizes only for manifests without it: see
    SIZES_ONLY), a repair being a server-side move."""
    tree = stores.store_for(root)
    cache = ChecksumCache() if checksums and not tree.listed_crc32c else None
    problems = Verified()
    problems.listed = tree.listed_crc32c
    for stage_dir in tree.manifest_dirs():
        what, how = _check(tree, stage_dir, cache, checksums)
        problems.checked += how is not None
        problems.sizes_only += how == "sizes"
        if what:
            problem = Problem(stage_dir, what)
            if repair:
                try:
                    problem.archived = _set_aside(tree, stage_dir)
                except manifest.ManifestError as exc:   # an .attempts that is a link out: not archived through it
                    problem.what += f" (not set aside: {exc})"
            problems.append(problem)
    if cache:
        cache.save()
    return problems


def _set_aside(tree, stage_dir: str) -> str | None:
    """Archive a stage directory, a rule in its own layout's record with its
    outputs (``StageStore.archive_job``)."""
    try:
        data = tree.manifest(stage_dir)
    except manifest.ManifestError:
        data = None
    return tree.archive_job(stage_dir, data)


def summary(verified: Verified, checksums: bool = True) -> str | None:
    """The line that says how a bucket's outputs were checked (None on disk)."""
    if not verified.listed:
        return None
    if not checksums:
        return NO_CHECKSUMS
    return SIZES_ONLY.format(n=verified.sizes_only) if verified.sizes_only else CRC32C_CHECKED
