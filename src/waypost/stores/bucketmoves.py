"""Moving and copying objects in a bucket server-side: a stage's workspace
into its ``.attempts/<n>/`` (resumable), and a reused stage's outputs in,
each source checked against its manifest first and each server-side copy
by its crc32c."""

from __future__ import annotations

import json
import os

from waypost.model import manifest
from waypost.model.layout import ARCHIVING, ATTEMPTS
from waypost.model.locations import is_bucket_url, object_name
from waypost.stores.base import StageStore, archive_number


def archive_objects(fs, path: str, listing: dict[str, dict], keep: tuple[str, ...] = (),
                    uploads: dict[str, str] | None = None) -> tuple[str | None, list[str]]:
    """Move a stage directory's workspace in the bucket into ``.attempts/<n>/``
    server-side (a rewrite per object, nothing downloaded), all but the
    entries in ``keep``. ``path`` is the stage dir (bucket/key), ``listing``
    its objects (relative name → info, archives included); ``uploads``
    (relative name → local file) go up straight into the archive instead of
    their bucket copies (``move_into_archive``). Returns ``.attempts/<n>``
    (None when there was nothing to archive) and the relative names moved
    out of the workspace."""
    remote = [rel for rel in listing if not rel.startswith(ATTEMPTS + "/") and rel.split("/")[0] not in keep]
    return move_into_archive(fs, path, listing, path, remote, uploads or {}), remote


def move_into_archive(fs, record: str, listing: dict[str, dict], source: str, remote: list[str],
                      uploads: dict[str, str], into: str | None = None) -> str | None:
    """Move the objects ``remote`` (names relative to ``source``, bucket/key)
    into the ``.attempts/<n>/`` of the record directory ``record`` (whose
    objects ``listing`` lists, archives included), each at its name there,
    server-side; ``uploads`` (name → local file) go up straight into it.
    ``into``: an archive made just before (``.attempts/<n>``), to add to.
    Safe to cut short: a note (``layout.ARCHIVING``) goes into the archive
    first and goes last, every copy is made before any delete, and the
    next archive goes on into the same ``<n>``. Returns the archive, or
    ``into`` when there was nothing to move."""
    if not remote and not uploads:
        return into
    if into is None:
        archived = [rel.split("/") for rel in listing if rel.startswith(ATTEMPTS + "/")]
        names = {parts[1] for parts in archived if len(parts) > 2}
        cut = {parts[1] for parts in archived if len(parts) == 3 and parts[2] == ARCHIVING}
        into = f"{ATTEMPTS}/{archive_number(names, cut)}"
    fs.pipe_file(f"{record}/{into}/{ARCHIVING}", json.dumps(sorted({*remote, *uploads})).encode())
    moved = [rel for rel in remote if rel not in uploads]
    if moved:
        fs.copy([f"{source}/{r}" for r in moved], [f"{record}/{into}/{r}" for r in moved])
    if uploads:
        fs.put(list(uploads.values()), [f"{record}/{into}/{r}" for r in uploads])
    if remote:
        fs.rm([f"{source}/{r}" for r in remote])
    fs.rm_file(f"{record}/{into}/{ARCHIVING}")
    return into


def bring_objects(fs, target: str, source: StageStore, source_dir: str,
                  outputs: list[dict]) -> tuple[str, dict[str, str]]:
    """A reused stage's outputs into the stage dir at bucket/key ``target``
    (``copy_checked``): says how, and gives each copy's crc32c where seen."""
    if source.bucket_url is None:   # the source's files are local: checked, then uploaded
        copies = [(source.local_file(source_dir, o["path"]), f"{target}/{o['path']}", o) for o in outputs]
    else:
        base = source.bucket_of(source_dir)
        copies = [(f"{base}/{o['path']}", f"{target}/{o['path']}", o) for o in outputs]
    crc32cs = copy_checked(fs, copies)
    how = "uploaded" if source.bucket_url is None else "copied in the bucket"
    return how, {o["path"]: crc32cs[f"{target}/{o['path']}"] for o in outputs if f"{target}/{o['path']}" in crc32cs}


def _check_listed(url: str, info: dict, out: dict) -> None:
    """An object as its bucket lists it (``info``) against its manifest's
    entry ``out``: its size, and its crc32c where the manifest records one."""
    if info["size"] != out.get("size"):
        raise manifest.ManifestError(f"{url}: differs from its manifest (size {info['size']} vs {out.get('size')})")
    if out.get("crc32c") and info.get("crc32c") != out["crc32c"]:
        raise manifest.ManifestError(f"{url}: differs from its manifest (crc32c {info.get('crc32c')} vs "
                                     f"{out['crc32c']}): replaced since the manifest was written")


def copy_checked(fs, copies: list[tuple[str, str, dict]]) -> dict[str, str]:
    """Each (source: a local path or a bucket's URL, target: bucket/key, the
    source's manifest entry): every source checked against its entry (a
    local file: its size and sha256; in a bucket: the size and crc32c its
    listing has, where the manifest records one: nothing downloaded), then
    copied in (uploaded; server-side), each server-side copy checked against
    its source's crc32c. Nothing is copied unless every source checks out.
    Returns target → crc32c, for the server-side copies."""
    local = [(src, dst, out) for src, dst, out in copies if not is_bucket_url(src)]
    remote = [(object_name(src), src, dst, out) for src, dst, out in copies if is_bucket_url(src)]
    for path, _, out in local:
        if os.path.getsize(path) != out.get("size") or manifest.sha256_file(path) != out.get("sha256"):
            raise manifest.ManifestError(f"{path}: differs from its manifest (size or sha256)")
    found = {name: fs.info(name) for name, _, _, _ in remote}
    for name, url, _, out in remote:
        _check_listed(url, found[name], out)
    if local:
        fs.put([src for src, _, _ in local], [dst for _, dst, _ in local])
    return _copy_server_side(fs, remote, found) if remote else {}


def _copy_server_side(fs, remote: list[tuple[str, str, str, dict]], found: dict[str, dict]) -> dict[str, str]:
    """Copy each (source's name in ``fs``, its URL, target, its entry)
    object in the service, then check each copy's crc32c against its
    source's as listed (``found``): a copy that differs removes them all.
    Target → crc32c."""
    targets = [dst for _, _, dst, _ in remote]
    fs.copy([name for name, _, _, _ in remote], targets)
    copied = [fs.info(t) for t in targets]
    if any(c.get("crc32c") != found[name].get("crc32c") for c, (name, _, _, _) in zip(copied, remote)):
        fs.rm(targets)
        raise manifest.ManifestError(f"{remote[0][1]}: a server-side copy differs from its source (crc32c)")
    return {dst: found[name]["crc32c"] for name, _, dst, _ in remote if found[name].get("crc32c")}
