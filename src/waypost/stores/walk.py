"""Every manifest of a local root, for the catalog: a walk of the layout's
fixed depth (pair/experiment/stage[/instance], and each ``.attempts/<n>``),
with a stamp per manifest that changes whenever it does, and the reading of
many of them. Big roots are walked and read by worker processes
(``parallel.in_workers``): a cold catalog of 100,000 manifests is otherwise
one core listing directories and parsing JSON.
"""

from __future__ import annotations

import os

from waypost.model import layout, manifest, trust
from waypost.model.parallel import chunks, in_workers

# Below PARALLEL_FROM manifests (about), starting workers costs more than it saves.
PARALLEL_FROM = 5000
PAIRS_PER_CHUNK = 50
MANIFESTS_PER_PAIR = 20   # about: two experiments of ten stages


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"


def _dirs(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return [e for e in it if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def pair_dirs(root: str) -> list[str]:
    """The pair directories of a local root, in name order."""
    return sorted(e.path for e in _dirs(root) if layout.is_valid_name(e.name) or e.name == layout.ALL_PAIRS)


def _scan(path: str, found: dict, stamps: bool) -> dict[str, os.DirEntry] | None:
    """Record a stage (or instance) directory's manifest and its archives'
    (``.attempts/<n>/_manifest.json``) in ``found``; returns its entries."""
    try:
        with os.scandir(path) as it:
            entries = {e.name: e for e in it}
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    if layout.MANIFEST in entries:
        found[path] = _stamp(entries[layout.MANIFEST].stat(follow_symlinks=False)) if stamps else None
    if layout.ATTEMPTS in entries:
        _archives(path, found, stamps)
    return entries


def _archives(path: str, found: dict, stamps: bool) -> None:
    """Record the manifests of a directory's archives (``.attempts/<n>``;
    never through a symbolic link)."""
    attempts = os.path.join(path, layout.ATTEMPTS)
    try:
        with os.scandir(attempts) as it:
            archives = [e.path for e in it if e.name.isdigit() and e.is_dir(follow_symlinks=False)]
    except (NotADirectoryError, FileNotFoundError, PermissionError):
        return
    if archives and os.path.islink(attempts):   # (asked only where there are archives: most have none)
        return
    for archive in archives:
        try:
            st = os.lstat(os.path.join(archive, layout.MANIFEST))
        except (FileNotFoundError, NotADirectoryError):
            continue   # a workspace archived without a manifest of its own
        found[archive] = _stamp(st) if stamps else None


def _scan_instance(path: str, found: dict, stamps: bool) -> None:
    """``_scan`` of a directory one level below a stage's, in two system
    calls rather than a listing (most are instances without archives)."""
    try:
        st = os.lstat(os.path.join(path, layout.MANIFEST))
        found[path] = _stamp(st) if stamps else None
    except (FileNotFoundError, NotADirectoryError):
        pass
    _archives(path, found, stamps)


def manifests_below(pairs: list[str], stamps: bool = True) -> dict[str, str | None]:
    """{stage dir: stamp} for every manifest under local pair directories,
    the archived ones (``.attempts/<n>``) too.

    The layout has a fixed depth, so this lists experiment and stage
    directories (and instance directories one level below, and the
    ``.attempts`` of each) and nothing else: no descent into outputs,
    checkpoints or logs. Without ``stamps`` (a cold build reads every
    manifest anyway, and stamps it as it reads) a stage's manifest costs no
    system call of its own.
    """
    found: dict[str, str | None] = {}
    for pair in pairs:
        for experiment in _dirs(pair):
            for stage in _dirs(experiment.path):
                entries = _scan(stage.path, found, stamps)
                for name, entry in (entries or {}).items():
                    if layout.is_valid_name(name) and entry.is_dir(follow_symlinks=False):
                        _scan_instance(entry.path, found, stamps)
    return found


def read_manifests(locations: list[str]):
    """(location, stamp, bytes or the exception) for local stage dirs. Each
    manifest is stamped from the file it was read from (fstat), so the stamp
    always matches the bytes; one that is a symbolic link, no regular file or
    too big is not read (trust.read_regular)."""
    for location in locations:
        try:
            text, st = trust.read_regular(os.path.join(location, layout.MANIFEST))
            yield location, _stamp(st), text
        except trust.Untrusted as exc:
            yield location, "untrusted", manifest.ManifestError(f"{exc}; {manifest.UNUSED}")
        except OSError as exc:
            yield location, "unreadable", exc


def _listed_pairs(root: str, pairs: list[str]) -> dict[str, str | None]:
    return manifests_below(pairs)


def pair_groups(root: str) -> tuple[list[list[str]], bool]:
    """A local root's pair directories in groups of about 2,000 manifests,
    each walked on its own, and whether there are enough for worker processes."""
    pairs = pair_dirs(root)
    return chunks(pairs, PAIRS_PER_CHUNK), len(pairs) * MANIFESTS_PER_PAIR >= PARALLEL_FROM


def listed(root: str) -> dict[str, str | None]:
    """{stage dir: stamp} of every manifest under a local root."""
    found: dict[str, str | None] = {}
    for part in in_workers(_listed_pairs, root, *pair_groups(root)):
        found.update(part)
    return found
