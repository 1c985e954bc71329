"""How a location is spelled: a path (local disk, NFS, a mounted bucket) or a
bucket's URL (``SCHEME://bucket/prefix``, e.g. ``gs://bucket/prefix``, read
through its API). Any ``scheme://`` is spelled as a bucket's URL here: which
schemes are served, and by which client, is the stores' business
(``waypost.stores.registry``; a scheme none serves is one clear line there).
"""

from __future__ import annotations

import os
import posixpath
import re

_URL = re.compile(r"([a-z][a-z0-9+.-]*)://")


def scheme_of(location: str) -> str:
    """The scheme of a location's URL (``gs``), ``""`` for a path."""
    text = str(location)
    if "://" not in text:   # (most locations are paths: no pattern to match)
        return ""
    found = _URL.match(text)
    return found.group(1) if found else ""


def is_bucket_url(location: str) -> bool:
    """Is ``location`` a bucket's URL (read through its API), not a path?"""
    return bool(scheme_of(location))


def prefix_of(location: str) -> str:
    """The scheme part of a bucket's URL (``gs://``); ``""`` for a path."""
    scheme = scheme_of(location)
    return scheme + "://" if scheme else ""


def object_name(location: str) -> str:
    """A bucket's URL without its scheme (``bucket/key``: how its client and
    its local copies name it); a path as it is."""
    return str(location)[len(prefix_of(location)):]


def is_absolute(location: str) -> bool:
    """A bucket's URL or an absolute path (not relative to a working directory)?"""
    return is_bucket_url(location) or os.path.isabs(str(location))


def needs_mirror(location: str) -> bool:
    """Is ``location`` reached only through an API (a bucket's URL), so that
    a step works on a local copy of it (``stores.mirror``), rather than a
    path a step reads and writes itself (disk, NFS, a mounted bucket)?"""
    return is_bucket_url(location)


def split_url(location: str) -> tuple[str, str] | None:
    """(bucket, object name) of a bucket's URL; None for a path."""
    if not is_bucket_url(location):
        return None
    bucket, _, name = object_name(location).partition("/")
    return bucket, name


def join(location: str, *parts: str) -> str:
    """``parts`` below a path or a bucket's URL."""
    if is_bucket_url(location):
        return "/".join([location.rstrip("/"), *parts])
    return os.path.join(location, *parts)


def absolute(location: str) -> str:
    """One spelling of a location: a bucket's URL without a trailing slash,
    or an absolute, normalised path."""
    return location.rstrip("/") if is_bucket_url(location) else os.path.abspath(location)


def resolve(base: str, location: str) -> str:
    """``location`` as it is when absolute (a URL or an absolute path), else
    below ``base``; normalised (``..`` and ``.`` undone)."""
    if is_absolute(location):
        return normalised(location)
    return normalised(join(base, location))


def normalised(location: str) -> str:
    if is_bucket_url(location):
        return prefix_of(location) + posixpath.normpath(object_name(location))
    return os.path.normpath(location)


def below(root: str, location: str) -> str | None:
    """``location`` relative to ``root`` (both paths, or both URLs); None
    when it is not below it."""
    if is_bucket_url(root):
        top = root.rstrip("/")
        return location[len(top) + 1:] if str(location).startswith(top + "/") else None
    rel = os.path.relpath(location, root)
    return None if rel == "." or rel.startswith("..") else rel


def parent(location: str) -> str:
    """The directory holding a file or directory (of a path or a URL)."""
    if is_bucket_url(location):
        return location.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(location)


def shown(location: str) -> str:
    """A location as the commands print it: a path below the working
    directory relative to it, anything else as it is."""
    if is_bucket_url(location) or not os.path.isabs(location):
        return location
    here = os.getcwd().rstrip(os.sep) + os.sep
    return os.path.relpath(location) if location.startswith(here) else location


_declared: dict[str, str] = {}


def declare_mounts(mounts: dict[str, str]) -> None:
    """The config's ``mounts`` (mount point → a bucket's URL, gs://bucket[/prefix]), for this
    process: read with the config, and by a job's runner from its step spec.
    The stores ask ``declared_mounts`` which mounts serve a bucket."""
    _declared.update({os.path.realpath(point): url.rstrip("/") for point, url in mounts.items()})


def declared_mounts() -> dict[str, str]:
    return dict(_declared)
