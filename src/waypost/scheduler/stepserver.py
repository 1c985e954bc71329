"""The local step server: how Snakemake's main process starts the step
runners of the jobs it runs itself (its local executor), without starting
an interpreter and importing the runner for each.

Started the first time a run's main process runs a step, the server
(``waypost.runner.server``, a process of its own that has imported the
runner once) forks one runner per step, as a bundle does on a Slurm node.
The main process hands it each step over a Unix socket in a directory only
this user can open: the here-document (the spec's line and the command),
the job's environment and working directory, its umask, and its standard
output and error as file descriptors. So the forked runner sees what a
runner started by Snakemake's ``shell`` would, and the server sends back
its exit status (negative: the signal that ended it).

The server lives in the run's process group, as the runners Snakemake
starts do: a Ctrl-C in the terminal reaches every runner at once, and the
server itself ignores it and reports how each runner ended. It ends when
the main process does (its standard input, a pipe from the main process,
closes), once its runners have.

A step that can't be forked (``waypost.runner.forked.forkable``) is
answered ``alone``: the main process runs it with Snakemake's ``shell``,
as it would without a server. ``WAYPOST_STEP_SERVER=off`` in the
environment turns the server off.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading

from waypost.model.errors import WaypostError

#: ``off`` (or ``0``, ``no``): every step starts its own runner
ENV = "WAYPOST_STEP_SERVER"
#: the server's answer for a step it doesn't fork
ALONE = "alone"
_LENGTH = struct.Struct("!Q")
_FDS = 2   # the step's standard output and error


class ServerGone(WaypostError):
    """The server ended while it ran a step: the step's end is in its record."""


def wanted(environ=None) -> bool:
    """Does this environment let steps go through the server (and can this
    system's processes be waited on as files: ``os.pidfd_open``)?"""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    return value not in ("off", "0", "no", "false") and hasattr(os, "pidfd_open")


def send_request(sock: socket.socket, body: bytes, env: dict[str, str], cwd: str, umask: int, fds) -> None:
    """One step for the server: its here-document, environment, directory,
    umask, and standard output and error (``fds``)."""
    head = json.dumps({"env": env, "cwd": cwd, "umask": umask}).encode()
    payload = _LENGTH.pack(len(head)) + head + body
    socket.send_fds(sock, [_LENGTH.pack(len(payload))], list(fds))
    sock.sendall(payload)


def read_request(conn: socket.socket) -> tuple[bytes, dict, list[int]]:
    """(here-document, {env, cwd, umask}, file descriptors) of one step."""
    data, fds, _, _ = socket.recv_fds(conn, _LENGTH.size, _FDS)
    if len(data) < _LENGTH.size:
        data += _read_exactly(conn, _LENGTH.size - len(data))
    payload = _read_exactly(conn, _LENGTH.unpack(data)[0])
    (size,) = _LENGTH.unpack(payload[:_LENGTH.size])
    head = json.loads(payload[_LENGTH.size:_LENGTH.size + size])
    return payload[_LENGTH.size + size:], head, fds


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the step's request ended early")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_status(conn: socket.socket, status: int | str) -> None:
    conn.sendall(f"{status}\n".encode())


def read_status(sock: socket.socket) -> int | str:
    """The runner's exit status, or ``ALONE``."""
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(64)
        if not chunk:
            raise ServerGone()
        reply += chunk
    text = reply.decode().strip()
    return text if text == ALONE else int(text)


class StepServer:
    """The main process's side: starts the server the first time a step
    asks (``command`` + the listening socket's descriptor is how), then
    hands it steps, one connection each, from any thread."""

    def __init__(self, command: list[str]):
        self._command = command
        self._lock = threading.Lock()
        self._address: str | None = None
        self._process = None
        self._broken = False
        self._umask = 0o022

    def run(self, body: bytes, env: dict[str, str]) -> int | None:
        """Run a step through the server: the runner's exit status; None
        where the server isn't there or doesn't fork this step (run it
        alone). ``ServerGone`` where it ended during the step."""
        address = self._started()
        if address is None:
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(address)
            except OSError:
                self._broken = True   # (it ended: the rest of the run's steps start their own runners)
                return None
            try:
                send_request(sock, body, env, os.getcwd(), self._umask, (1, 2))
            except OSError:   # (it took nothing: it forks once it has read the whole step)
                self._broken = True
                return None
            try:
                status = read_status(sock)
            except OSError:
                raise ServerGone() from None
        return None if status == ALONE else status

    def _started(self) -> str | None:
        with self._lock:
            if self._address is None and not self._broken:
                try:
                    self._start()
                except OSError:
                    self._broken = True
            return None if self._broken else self._address

    def _start(self) -> None:
        import atexit
        import subprocess
        import tempfile

        self._umask = _process_umask()   # (read once: the run's jobs share it)
        directory = tempfile.mkdtemp(prefix="waypost-steps-")
        if len(directory) > 90:   # (a Unix socket's path has ~100 bytes)
            os.rmdir(directory)
            directory = tempfile.mkdtemp(prefix="waypost-steps-", dir="/tmp")
        address = os.path.join(directory, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(address)
            listener.listen(256)
            self._process = subprocess.Popen([*self._command, str(listener.fileno()), directory],
                                             stdin=subprocess.PIPE, pass_fds=(listener.fileno(),))
        finally:
            listener.close()
        self._address = address
        atexit.register(self.stop, directory)

    def stop(self, directory: str | None = None) -> None:
        """No more steps: the server ends once its runners have."""
        import subprocess
        if self._process is not None and self._process.stdin:
            self._process.stdin.close()
            try:   # (it ends once its runners have: on a normal end, at once)
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if directory:
            import shutil
            shutil.rmtree(directory, ignore_errors=True)



def _process_umask() -> int:
    """This process's umask, read without setting it (other threads create
    files meanwhile)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
