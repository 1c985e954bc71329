"""The local step server's process (``waypost.scheduler.stepserver`` is
the main process's side, and says why):

    python -S .../waypost/runner/launch.py --serve FD DIR

accepts steps on the listening socket ``FD`` (bound in the directory ``DIR``,
which it removes as it ends) and forks a runner for each
(``forked.Forked``), with the job's standard output and error, directory,
umask and environment; it answers each with the runner's exit status once
the runner has ended (a pidfd per runner says when). It ignores the
terminal's signals (they reach the runners themselves, in the same process
group) and ends when its standard input closes (the main process ended)
and its runners have.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket

from waypost.runner.forked import Forked, forkable, preload
from waypost.scheduler import stepserver

#: what the terminal or a kill of the run's process group sends: the runners
#: take them, and the server stays to say how they ended
IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def serve(listen_fd: int, directory: str) -> int:
    from waypost.runner import main as _runner  # noqa: F401  (imported once, for every forked runner)

    preload()

    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    listener = socket.socket(fileno=listen_fd)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(0, selectors.EVENT_READ, "parent")
    running: dict[int, tuple[Forked, socket.socket]] = {}   # pidfd → its runner, and who waits for it
    accepting = True
    while accepting or running:
        for key, _ in selector.select():
            if key.data == "accept":
                _accept(listener, selector, running)
            elif key.data == "parent":
                if not os.read(0, 4096):   # the main process ended: take no more steps
                    selector.unregister(0)
                    selector.unregister(listener)
                    listener.close()
                    accepting = False
            else:
                _ended(key.fd, selector, running)
    import shutil
    shutil.rmtree(directory, ignore_errors=True)
    return 0


def _accept(listener: socket.socket, selector, running: dict) -> None:
    conn, _ = listener.accept()
    try:
        conn.settimeout(30)
        body, head, fds = stepserver.read_request(conn)
    except (OSError, EOFError, ValueError):
        conn.close()
        return
    if not forkable(body):
        _close(fds)
        _answer(conn, stepserver.ALONE)
        return
    keep = {conn.fileno(), listener.fileno(), selector.fileno(), *running,
            *(other.fileno() for _, other in running.values())}

    def setup() -> None:
        """In the runner: the job's files, directory, umask and environment."""
        for target, fd in zip((1, 2), fds):
            os.dup2(fd, target)
        for fd in (*fds, *keep):   # (none of the server's files stay open in the runner)
            try:
                os.close(fd)
            except OSError:
                pass
        os.chdir(head["cwd"])
        os.umask(head["umask"])
        os.environ.clear()
        os.environ.update(head["env"])
    child = Forked(body, IGNORED, setup)
    _close(fds)
    pidfd = os.pidfd_open(child.pid)
    running[pidfd] = (child, conn)
    selector.register(pidfd, selectors.EVENT_READ, "runner")


def _ended(pidfd: int, selector, running: dict) -> None:
    child, conn = running.pop(pidfd)
    selector.unregister(pidfd)
    os.close(pidfd)
    _answer(conn, child.wait())


def _answer(conn: socket.socket, status) -> None:
    try:
        stepserver.send_status(conn, status)
    except OSError:
        pass   # (the main process is gone: no one to tell)
    conn.close()


def _close(fds) -> None:
    for fd in fds:
        os.close(fd)
