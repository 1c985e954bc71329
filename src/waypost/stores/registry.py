"""Which backend serves a location, by its URL's scheme (as fsspec's
``url_to_fs`` picks a filesystem): ``gs://bucket/prefix`` is a bucket read
through its API, and anything else (no scheme) a path: local disk, NFS or a
mounted bucket. A kind of root is one backend module (a ``base.Backend``)
and one line in ``BACKENDS``; the rest of waypost asks ``waypost.stores``,
which asks this."""

from __future__ import annotations

import re

from waypost.stores.base import Backend
from waypost.stores.gsroot import GsRoot
from waypost.stores.pathroot import PathRoot

#: scheme → the backend of its roots ("": a path, and any scheme no backend has)
BACKENDS: dict[str, Backend] = {
    "": PathRoot(),
    "gs": GsRoot(),
}

_SCHEME = re.compile(r"([a-z][a-z0-9+.-]*)://")


def scheme_of(location: str) -> str:
    """The scheme of a location's URL (``gs``), ``""`` for a path."""
    found = _SCHEME.match(str(location))
    return found.group(1) if found else ""


def backend_of(location: str) -> Backend:
    """The backend of the root ``location`` is in (a path's, for a scheme no backend serves)."""
    return BACKENDS.get(scheme_of(location)) or BACKENDS[""]
