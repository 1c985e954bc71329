"""Stage directories whose manifest cannot be trusted, found and set aside.

A stage is not done when its ``_manifest.json`` is unreadable (truncated,
corrupt), or says SUCCESS while an output it lists is missing, has another
size, or (with checksums) another sha256. Such a stage's files are archived
under ``.attempts/<n>/`` (never deleted), so its outputs are gone and the next
run redoes it. Checksums are cached by (path, size, mtime) in
``.waypost/verified.json``, so a big unchanged model is hashed once. On a
gs:// root only sizes are checked (the sha256 would need every output
downloaded), and the archive is a server-side move.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from . import layout, manifest, stagetree

CACHE = os.path.join(".waypost", "verified.json")
# What verify says of a gs:// root: the manifests record each output's sha256,
# which GCS does not keep (it keeps crc32c and md5): checking it would mean
# downloading every output.
SIZES_ONLY = "gs:// root: output sizes checked, not checksums (that would download every output)"


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


def check(tree, stage_dir: str, cache: ChecksumCache | None) -> str | None:
    """What is wrong with a stage dir's manifest, or None."""
    if tree.isfile(layout.join(stage_dir, layout.RUNNING)):
        return None  # an attempt is (or was) under way: the runner deals with it
    try:
        data = tree.manifest(stage_dir)
    except manifest.ManifestError as exc:
        return str(exc)
    if data is None or data["state"] != "SUCCESS":
        return None
    for out in data.get("outputs", []):
        path = layout.join(stage_dir, out["path"])
        size = tree.size(path)
        if size is None:
            return f"{out['path']} is missing"
        if size != out.get("size"):
            return f"{out['path']} has {size} bytes, the manifest says {out.get('size')}"
        if cache is not None and cache.sha256(path) != out.get("sha256"):
            return f"{out['path']} does not match its checksum"
    return None


def verify(root: str, checksums: bool = True, repair: bool = True) -> list[Problem]:
    """Check every manifest under ``root``; archive the untrustworthy stages.
    On a gs:// root from one listing and one batch read of the manifests,
    sizes only (see SIZES_ONLY), a repair being a server-side move."""
    tree = stagetree.open(root)
    cache = ChecksumCache() if checksums and not tree.remote else None
    problems = []
    for stage_dir in tree.manifest_dirs():
        what = check(tree, stage_dir, cache)
        if what:
            problem = Problem(stage_dir, what)
            if repair:
                problem.archived = tree.archive(stage_dir)
            problems.append(problem)
    if cache:
        cache.save()
    return problems
