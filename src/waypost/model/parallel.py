"""Work split over worker processes, for commands that read many stage
directories (the catalog's cold build, ``waypost status``).

Listing directories and parsing JSON in Python is one core's work; on a
machine with more, chunks of it go to worker processes and the caller takes
the results in order as they come. Where no worker process can start, or one
dies, this process does the rest itself.
"""

from __future__ import annotations

import os
import sys


def __getattr__(name: str):
    """``ProcessPoolExecutor``, imported on first use (PEP 562): the step
    runner imports this module (through the stores) and never starts
    workers, and ``concurrent.futures`` with ``multiprocessing`` cost it
    ~20 ms a job."""
    if name == "ProcessPoolExecutor":
        from concurrent.futures import ProcessPoolExecutor
        globals()[name] = ProcessPoolExecutor
        return ProcessPoolExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cpus() -> int:
    """The processors this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def in_workers(load, root: str, parts: list[list], parallel: bool):
    """``load(root, part)`` for each part, in order: in worker processes
    when ``parallel`` and this machine has more than one core, else here."""
    workers = min(cpus(), len(parts), 16) if parallel else 1
    pool = futures = None
    if workers > 1:
        import multiprocessing  # here, as ProcessPoolExecutor (above)
        import threading
        from concurrent.futures.process import BrokenProcessPool
        try:
            # fork is cheapest, but not safe once a thread runs (e.g. gcsfs's, after a gs:// root)
            start = "fork" if threading.active_count() == 1 else "forkserver"
            pool = sys.modules[__name__].ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start))
            futures = [pool.submit(load, root, part) for part in parts]
        except (OSError, RuntimeError, ValueError):   # no worker processes here: load in this one
            futures = None
    try:
        for n, part in enumerate(parts):
            if futures:
                try:
                    yield futures[n].result()
                    continue
                except (BrokenProcessPool, OSError):
                    futures = None
            yield load(root, part)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
