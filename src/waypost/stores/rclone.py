"""What an rclone mount serves: the type of its remote.

The mount table shows an rclone mount's source as ``REMOTE:PATH`` whatever
the remote is (a GCS bucket, S3, a ``hasher`` or ``crypt`` over a local
disk look alike), so the type comes from rclone itself: the process that
serves the mount point (its command line in /proc), the config it was given
(``--config``, else ``RCLONE_CONFIG`` in its environment, else rclone's
default file of its user), and the remote's ``type`` there, or in its
environment (``RCLONE_CONFIG_<REMOTE>_TYPE``, which rclone prefers). An
on-the-fly remote (``:gcs:bucket``) names its type itself. What can't be
read (another user's process, an encrypted config, a mount served from
another namespace) is None: unknown.
"""

from __future__ import annotations

import configparser
import os
import re

GCS_TYPES = ("google cloud storage", "gcs")   # rclone's name of the backend, and its prefix
MOUNT_COMMANDS = ("mount", "cmount", "nfsmount")


def split_source(source: str) -> tuple[str | None, str | None, str]:
    """(remote name, backend named on the fly, path) of a source as the
    mount table shows it: ``name:path``, ``name{xyz}:path`` (a remote with
    options overridden), ``:backend:path`` (a remote made on the fly); a
    connection string's ``,options`` are left out. A source of another
    shape (``--devname``) names neither: (None, None, "")."""
    if source.startswith(":"):
        backend, _, path = source[1:].partition(":")
        return None, _bare(backend), path
    name, colon, path = source.partition(":")
    return (_bare(name), None, path) if colon else (None, None, "")


def _bare(name: str) -> str:
    return re.sub(r"\{[^}]*\}$", "", name.split(",", 1)[0])


def remote_type(point: str, source: str) -> str | None:
    """The type of the remote an rclone mount at ``point`` serves (as in
    rclone's config: ``google cloud storage``, ``s3``, ``hasher``...); None
    when it can't be known."""
    name, backend, _ = split_source(source)
    if backend:
        return backend.lower()
    if not name:
        return None
    for pid, argv, cwd in _servers(point):
        env = _environ(pid)
        found = (env.get(f"RCLONE_CONFIG_{name.upper().replace('-', '_')}_TYPE")
                 or _type_in(_config(pid, argv, cwd, env), name))
        if found:
            return found.strip().lower()
    return None


def _servers(point: str):
    """(pid, argv, working directory) of each rclone process serving a mount at ``point``."""
    real = os.path.realpath(point)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            if not argv or "rclone" not in os.path.basename(argv[0]) or not set(MOUNT_COMMANDS) & set(argv):
                continue
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:   # gone, or not ours to read
            continue
        if any(os.path.realpath(os.path.join(cwd, a)) == real for a in argv[1:] if not a.startswith("-")):
            yield pid, argv, cwd


def _environ(pid: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [item.decode(errors="replace").partition("=") for item in f.read().split(b"\0") if item]
    except OSError:
        return {}
    return {key: value for key, _, value in pairs}


def _config(pid: str, argv: list[str], cwd: str, env: dict[str, str]) -> str | None:
    """The config file the rclone process reads (rclone's own order)."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return os.path.join(cwd, argv[i + 1])
        if arg.startswith("--config="):
            return os.path.join(cwd, arg.split("=", 1)[1])
    if env.get("RCLONE_CONFIG"):
        return os.path.join(cwd, env["RCLONE_CONFIG"])
    home = env.get("HOME") or _home_of(pid)
    beside = os.path.join(os.path.dirname(argv[0]), "rclone.conf") if os.path.isabs(argv[0]) else None
    xdg = env.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else None)
    candidates = [beside, xdg and os.path.join(xdg, "rclone", "rclone.conf"), home and os.path.join(home, ".rclone.conf")]
    return next((c for c in candidates if c and os.path.isfile(c)), None)


def _home_of(pid: str) -> str | None:
    import pwd
    try:
        return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_dir
    except (OSError, KeyError):
        return None


def _type_in(config: str | None, name: str) -> str | None:
    """The ``type`` of section ``name`` of an rclone config file (None: not
    there, unreadable, or encrypted)."""
    if not config:
        return None
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(config)
    except (OSError, configparser.Error, UnicodeDecodeError):
        return None
    return parser.get(name, "type", fallback=None)
