"""Stage directories whose manifest cannot be trusted, found and set aside.

A stage is not done when its ``_manifest.json`` is unreadable (truncated,
corrupt), or says SUCCESS while an output it lists is missing, has another
size, or (with checksums) another sha256. Such a stage's files are archived
under ``.attempts/<n>/`` (never deleted), so its outputs are gone and the next
run redoes it. Checksums are cached by (path, size, mtime) in
``.waypost/verified.json``, so a big unchanged model is hashed once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from . import layout, manifest

CACHE = os.path.join(".waypost", "verified.json")


@dataclass
class Problem:
    stage_dir: str
    what: str
    archived: str | None = None


def manifests_under(root: str, max_depth: int = 6):
    """Every stage directory with a manifest under ``root`` (not archives)."""
    def walk(directory: str, depth: int):
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return
        if any(e.name == layout.MANIFEST for e in entries):
            yield directory
        if depth < max_depth:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and not entry.name.startswith((".", "_logs")):
                    yield from walk(entry.path, depth + 1)
    yield from walk(root, 0)


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


def check(stage_dir: str, cache: ChecksumCache | None) -> str | None:
    """What is wrong with a stage dir's manifest, or None."""
    if os.path.exists(os.path.join(stage_dir, layout.RUNNING)):
        return None  # an attempt is (or was) under way: the runner deals with it
    try:
        data = manifest.read(stage_dir)
    except manifest.ManifestError as exc:
        return str(exc)
    if data is None or data["state"] != "SUCCESS":
        return None
    for out in data.get("outputs", []):
        path = os.path.join(stage_dir, out["path"])
        if not os.path.exists(path):
            return f"{out['path']} is missing"
        if os.path.getsize(path) != out.get("size"):
            return f"{out['path']} has {os.path.getsize(path)} bytes, the manifest says {out.get('size')}"
        if cache is not None and cache.sha256(path) != out.get("sha256"):
            return f"{out['path']} does not match its checksum"
    return None


def verify(root: str, checksums: bool = True, repair: bool = True) -> list[Problem]:
    """Check every manifest under ``root``; archive the untrustworthy stages."""
    cache = ChecksumCache() if checksums else None
    problems = []
    for stage_dir in manifests_under(root):
        what = check(stage_dir, cache)
        if what:
            problem = Problem(stage_dir, what)
            if repair:
                problem.archived = manifest.archive_workspace(stage_dir)
            problems.append(problem)
    if cache:
        cache.save()
    return problems
