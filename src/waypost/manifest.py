"""The stage manifest: what a stage directory holds, how it came to be, and
whether it is done.

``_manifest.json`` is written last and atomically (temp file + rename in the
same directory), so a reader sees either the previous manifest or the new one,
never half of one; a step killed mid-way leaves no new manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from . import __version__
from .layout import ATTEMPTS, ENGINE_FILES, MANIFEST, RUNNING

SCHEMA_VERSION = 1
STATES = ("SUCCESS", "FAILED", "TIMEOUT", "PREEMPTED", "HWFAILURE", "OOM", "CANCELLED", "SKIPPED")
HASH_CHUNK = 1 << 20


# The run a job belongs to: set by Snakemake's main process (waypost.snakemake),
# inherited by every job of the run; each attempt records it.
RUN_ID_ENV = "WAYPOST_RUN_ID"


def new_run_id() -> str:
    """A new run's id: when and where it started, e.g. 20261130T002512-vm-48213."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{hostname()}-{os.getpid()}"


class ManifestError(ValueError):
    """A manifest that cannot be read or does not have the expected shape."""


def now_iso() -> str:
    """UTC now as ISO 8601 with milliseconds, e.g. 2026-11-29T21:05:55.123+00:00
    (``time`` rather than ``datetime``: the runner starts at every step)."""
    return epoch_to_iso(time.time())


def epoch_to_iso(epoch: float) -> str:
    """An epoch time as ``now_iso`` writes times."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch * 1000) % 1000:03d}+00:00"


def iso_to_epoch(text: str) -> float:
    """The epoch time of a UTC time as waypost writes them (``now_iso``)."""
    import calendar
    whole, _, rest = text.partition(".")
    return calendar.timegm(time.strptime(whole[:19], "%Y-%m-%dT%H:%M:%S")) + float("0." + (rest[:3] or "0"))


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)


def sha256_stream(f) -> str:
    """The sha256 of what is left to read in a binary file object."""
    digest = hashlib.sha256()
    while chunk := f.read(HASH_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _crc32c():
    """google_crc32c's ``extend``, imported when first needed (the runner
    starts at every step, and only a success describes outputs); None when
    it can't be imported (the manifest then records no crc32c). A runner
    started without ``site`` (``launch``) looks for it in the site-packages
    of its interpreter's environment, after the standard library and waypost."""
    try:
        import google_crc32c
    except ImportError:
        lib = os.path.join(sys.platlibdir, f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
        for prefix in (os.path.dirname(os.path.dirname(os.path.abspath(sys.executable))), sys.prefix):
            path = os.path.join(prefix, lib)
            if path not in sys.path and os.path.isdir(path):
                sys.path.append(path)
        try:
            import google_crc32c
        except ImportError:
            print("waypost: google-crc32c can't be imported: the manifest records no crc32c", file=sys.stderr)
            return None
    return google_crc32c.extend


def crc32c_text(crc: int) -> str:
    """A CRC32C as GCS lists it: base64 of its 4 big-endian bytes."""
    import binascii  # (base64 is binascii with more imports)
    return binascii.b2a_base64(crc.to_bytes(4, "big"), newline=False).decode()


def digests_stream(f) -> tuple[str, str | None]:
    """(sha256 hex, crc32c as GCS lists it) of what is left to read in a
    binary file object, in one read pass (crc32c None: see ``_crc32c``)."""
    extend = _crc32c()
    digest, crc = hashlib.sha256(), 0
    while chunk := f.read(HASH_CHUNK):
        digest.update(chunk)
        if extend:
            crc = extend(crc, chunk)
    return digest.hexdigest(), extend and crc32c_text(crc)


def digests_file(path: str) -> tuple[str, str | None]:
    with open(path, "rb") as f:
        return digests_stream(f)


def dumps(data: dict) -> str:
    """How waypost writes a manifest (or marker) file."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def describe_outputs(stage_dir: str, paths: list[str]) -> list[dict]:
    """Size, sha256 and crc32c (GCS's checksum, as it lists it: what
    ``waypost verify`` compares on a gs:// root without downloading) of each
    output, with paths relative to the stage dir; both checksums from one read."""
    described = []
    for path in paths:
        sha256, crc32c = digests_file(path)
        described.append({
            "path": os.path.relpath(path, stage_dir),
            "size": os.path.getsize(path),
            "sha256": sha256,
            **({"crc32c": crc32c} if crc32c else {}),
        })
    return described


def hostname() -> str:
    """This machine's name (``socket.gethostname()``, without importing socket)."""
    return os.uname().nodename


def write_json_atomic(path: str, data: dict, durable: bool = True) -> None:
    """Temp file + rename: readers see the old file or the new one. With
    ``durable``, the data is on disk (fsync) before the rename."""
    directory = os.path.dirname(path) or "."
    # A name no other writer uses (pid + clock), created exclusively, readable
    # by everyone the umask allows (tempfile would cost the runner's start ~5 ms).
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{time.monotonic_ns()}.json")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(dumps(data))
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def manifest_path(stage_dir: str) -> str:
    return os.path.join(stage_dir, MANIFEST)


def read(stage_dir: str) -> dict | None:
    """The manifest of a stage directory; None when there is none.

    Raises ManifestError when the file exists but is not a usable manifest.
    """
    path = manifest_path(stage_dir)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"{path}: unreadable manifest ({exc})") from exc
    return parse(text, path)


def parse(text: bytes | str, path: str) -> dict:
    """A manifest from its bytes; ManifestError naming ``path`` if it isn't one."""
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: unreadable manifest ({exc})") from exc
    if not isinstance(data, dict) or data.get("state") not in STATES or not isinstance(data.get("attempts"), list):
        raise ManifestError(f"{path}: not a waypost manifest (missing state or attempts)")
    return data


def verify_outputs(stage_dir: str, data: dict, checksums: bool = True) -> list[str]:
    """Problems with the outputs a manifest lists (missing, size or checksum)."""
    problems = []
    for out in data.get("outputs", []):
        path = os.path.join(stage_dir, out["path"])
        if not os.path.exists(path):
            problems.append(f"{out['path']}: missing")
        elif os.path.getsize(path) != out.get("size"):
            problems.append(f"{out['path']}: size {os.path.getsize(path)} != {out.get('size')}")
        elif checksums and sha256_file(path) != out.get("sha256"):
            problems.append(f"{out['path']}: checksum differs")
    return problems


def build(*, experiment: str, pair: str, stage: str, instance: str | None, state: str,
          attempts: list[dict], outputs: list[dict], inputs: list[dict], settings: dict,
          config_hash: str, code_version: str, reused_from: str | None = None,
          adopted: bool = False, run: str | None = None) -> dict:
    return {
        "schema": SCHEMA_VERSION,
        "experiment": experiment,
        "pair": pair,
        "stage": stage,
        "instance": instance,
        "state": state,
        "created": now_iso(),
        "run": run,
        "attempts": attempts,
        "outputs": outputs,
        "inputs": inputs,
        "settings": settings,
        "config_hash": config_hash,
        "code_version": code_version,
        "reused_from": reused_from,
        "adopted": adopted,
        "waypost_version": __version__,
    }


def workspace_entries(stage_dir: str) -> list[str]:
    """What attempts left in the stage dir (everything but the archive)."""
    try:
        return sorted(e for e in os.listdir(stage_dir) if e != ATTEMPTS)
    except FileNotFoundError:
        return []


def archive_workspace(stage_dir: str, keep: tuple[str, ...] = ()) -> str | None:
    """Move everything in the stage dir (but ``keep``) into ``.attempts/<n>/``;
    never delete. Returns the archive path relative to the stage dir, or None
    if there was nothing to archive."""
    entries = [e for e in workspace_entries(stage_dir) if e not in keep]
    if not entries:
        return None
    attempts_dir = os.path.join(stage_dir, ATTEMPTS)
    os.makedirs(attempts_dir, exist_ok=True)
    n = 1 + max((int(e) for e in os.listdir(attempts_dir) if e.isdigit()), default=0)
    target = os.path.join(attempts_dir, str(n))
    os.makedirs(target)
    for entry in entries:
        os.rename(os.path.join(stage_dir, entry), os.path.join(target, entry))   # same directory tree
    return os.path.relpath(target, stage_dir)


# A ``_running.json`` whose heartbeat (its mtime, refreshed every minute by
# the runner while the step runs) is older than this counts as left by a
# runner that is gone, from any host. Until then a runner that can't be asked
# (another host, no Slurm job; sacct not answering) may still be at work.
LEASE_S = float(os.environ.get("WAYPOST_LEASE_SECONDS", "600"))


def attempt_in_flight(stage_dir: str, me: int | None = None) -> tuple[bool, str | None]:
    """Is there an attempt under way in this stage dir (``_running.json``)?
    See ``marker_in_flight``; (False, None) when there is no marker."""
    try:
        with open(os.path.join(stage_dir, RUNNING), "rb") as f:
            text = f.read()
            age = time.time() - os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return False, None
    except OSError:
        return False, "gone"
    return marker_in_flight(text, me, age)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def marker_in_flight(text: bytes | str, me: int | None = None, age: float | None = None) -> tuple[bool, str | None]:
    """Is the attempt a ``_running.json`` (its contents; ``age``: seconds
    since its last heartbeat) records under way?

    (True, where): its process (on this host) or its Slurm job is alive, or
    it can't be known yet ("unknown: ..."): a process on another host without
    a Slurm job, or sacct not answering, while the heartbeat is younger than
    the lease; (False, "gone"): its process or job is gone (it was
    interrupted), its heartbeat is older than the lease, or the marker
    can't be read. Whoever gets True must leave the stage alone.
    """
    from . import slurm

    try:
        info = json.loads(text)
    except ValueError:
        return False, "gone"
    pid, host, job = info.get("pid"), info.get("host"), info.get("slurm_job_id")
    if host == hostname() and pid and pid != me:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False, "gone"
        except PermissionError:
            pass
        if _zombie(int(pid)):
            return False, "gone"  # killed, not yet reaped by its parent: it does no more work
        return True, f"pid {pid} on {host}"
    if job and job != os.environ.get("SLURM_JOB_ID"):
        state, raw = slurm.final_state(job)
        if state is None and raw:
            return True, f"Slurm job {job} ({raw})"
        if state is not None:
            return False, "gone"
    if host == hostname() and (not pid or pid == me):
        return False, "gone"
    if age is not None and age > LEASE_S:
        return False, "gone"
    beat = "" if age is None else f", last heartbeat {age:.0f} s ago"
    return True, (f"unknown: pid {pid} on {host}" + (f", Slurm job {job} (sacct did not answer)" if job else "")
                  + f"{beat}; counted as gone once its heartbeat is {LEASE_S:.0f} s old")


def is_engine_file(name: str) -> bool:
    return name in ENGINE_FILES or name.startswith(".tmp-")
