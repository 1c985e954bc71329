"""A planning on a bucket mount waits for what its mount lists late.

A node's mount may list a stage directory as it was for as long as its
caches keep the listing (rclone's ``--dir-cache-time``, gcsfuse's stat and
type caches). The planning reads the stage's state through the bucket's
API, but Snakemake looks at the outputs through the mount: a stale listing
would have it redo what another node has just done. So a stage directory
whose manifest the bucket shows written within a mount's cache time
(``mounted.SETTLE_S``) is waited for until this node's mount lists it too.
"""

from __future__ import annotations

import sys
import time

from waypost import stores
from waypost.model.layout import MANIFEST, join


class MountLag:
    """One planning's waits: ``SETTLE_S`` at most in all, and said once if
    the mount still lags then (the rest of the planning waits no more)."""

    def __init__(self):
        self._until: float | None = None   # (time.monotonic(); 0: given up)

    def wait_for(self, life) -> None:
        """Wait until the mount lists ``life``'s stage directory as the
        bucket does, if the bucket shows its manifest written lately."""
        if MANIFEST not in life.entries:
            return
        try:
            written = life.store.mtime(join(life.dir, MANIFEST))
        except OSError:
            return
        if time.time() - written >= stores.SETTLE_S:
            return
        if self._until is None:
            self._until = time.monotonic() + stores.SETTLE_S
        listed = stores.settle(life.dir, [name for name in life.entries if not name.startswith(".")],
                                until=self._until)
        if not listed and self._until > 0:
            self._until = 0.0
            print(f"{stores.lagging(life.dir)}; Snakemake may take what another node just made for missing",
                  file=sys.stderr)
