"""One run of an attempt's command, at the process level: started in a
process group of its own that dies with the runner, its output teed to the
attempt's log, under a time limit, with the runner's signals passed on; then
how it ended (``classify``).

The step dies with its runner, however the runner dies (SIGKILL, the OOM
killer, its driver's process group killed with it): the step's shell has
``PR_SET_PDEATHSIG``, but the kernel clears that for what the shell starts,
so a watchdog (``_watch``: a fork of the runner, in a session of its own so
that a signal to the runner's process group misses it) ends the step's
whole process group when the runner is gone.

The runner starts at every step: this imports nothing beyond ``os``,
``signal``, ``sys``, ``time``, ``ctypes`` and ``stepgroup`` (``select``
when it runs)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from waypost.model.records import StepGroup
from waypost.scheduler import stepgroup

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# While a step runs, its ``_running.json`` is touched this often: a marker
# whose heartbeat is older than the lease (lifecycle.LEASE_S) is taken for one
# whose runner is gone, from any host (see lifecycle.judge).
HEARTBEAT_S = float(os.environ.get("WAYPOST_HEARTBEAT_SECONDS", "60"))
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
WATCHDOG_NAME = b"waypost-watch"   # its name in ps and /proc/PID/comm
# Signals that take a process away without its consent: the machine (or the
# kernel on its behalf) did it, not the step.
HARDWARE_SIGNALS = (signal.SIGKILL, signal.SIGBUS)

# Where the runner is a fork of a ``run:`` job's own Snakemake process
# (``forked.run_here``), its step is the job's block: a call in the step's
# process (forked as for any step) in place of the exec of its command.
_call_instead = None


def call_instead(step) -> None:
    """From now on, each step's process calls ``step()`` (its exit status)
    instead of running its command."""
    global _call_instead
    _call_instead = step


def _prctl(option: int, value) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value)
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the runner dies (even by SIGKILL), so a
    step never outlives its runner and writes outputs nobody records."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _watch(log_fd: int, orphaned=None) -> tuple[int, int] | None:
    """Fork the watchdog of the step about to start: (its pid, the pipe
    on which it is told the step's group), or None when it can't be forked
    (the running marker still names the group: the next attempt ends what
    is left of it, see ``waypost.state.leftovers``). Forked before the step, so
    that the step waits on nothing of its start-up.

    Told the group (``pgid start kill_grace``), it waits for the runner to
    die (``PR_SET_PDEATHSIG``), then ends the group (SIGTERM, then SIGKILL
    after the grace) and says so in the attempt's log (``orphaned``: then
    written whole into the stage directory, where it grows elsewhere). Told nothing (the
    pipe closed first), it exits. The runner kills it once the attempt is
    over."""
    runner = os.getpid()
    told, tell = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(told)
        os.close(tell)
        return None
    if pid:
        os.close(told)
        return pid, tell
    try:   # the watchdog, until os._exit
        wake = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, wake)   # not the runner's handlers: sigwait's
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        for name in os.listdir("/proc/self/fd"):   # Snakemake's pipes, locks: none held
            if int(name) > 2 and int(name) not in (log_fd, told):
                try:
                    os.close(int(name))
                except OSError:
                    pass
        _prctl(PR_SET_NAME, WATCHDOG_NAME)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        words = os.read(told, 200).split()
        if len(words) != 3:   # no step started
            os._exit(0)
        group = {"pgid": int(words[0]), "start": int(words[1]), "kill_grace": float(words[2])}
        while os.getppid() == runner:   # the runner is there (a stray signal: wait on)
            signal.sigwait(wake)
        pids = stepgroup.members(group)
        if pids:
            how = stepgroup.end(group)
            os.write(log_fd, f"waypost: the step's runner (pid {runner}) is gone; ended the step's "
                             f"{stepgroup.describe(group, pids)}: {how}\n".encode())
            if orphaned:
                orphaned()
    finally:
        os._exit(0)


def oom_kills() -> int | None:
    """The OOM-kill counter of this process's memory cgroup (v2 or v1), so an
    attempt the kernel's OOM killer ended is told apart from other kills."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            events = f"/sys/fs/cgroup{path}/memory.events"
        elif "memory" in controllers.split(","):
            events = f"/sys/fs/cgroup/memory{path}/memory.oom_control"
        else:
            continue
        try:
            with open(events) as f:
                for row in f:
                    name, _, value = row.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return None


def _spawn(command: list[str], env: dict, started=None, cwd: str | None = None) -> tuple[int, int]:
    """Start ``command`` (no shell) in a session of its own, with stdout and
    stderr on one pipe: (pid, the pipe's read end). ``started(pid)`` is
    called before the command runs (its process exists, waiting at a gate:
    its group can be recorded and watched before anything of it is at
    work); if it raises, the command never runs. OSError when it cannot
    start (not found, not executable).

    ``subprocess.Popen`` would do it, but the runner starts at every step
    and ``subprocess`` (with ``threading``, ``selectors``, ...) is the largest
    import it would have; one fork and exec of one command is all it needs.
    """
    read_end, write_end = os.pipe()
    error_read, error_write = os.pipe()    # close-on-exec: EOF once the exec worked
    gate_read, gate_write = os.pipe()      # EOF: go on
    runner = os.getpid()
    pid = os.fork()
    if pid == 0:   # the child: only until the exec
        try:
            for signum in (*FORWARDED_SIGNALS, signal.SIGALRM, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_DFL)  # as a shell would leave them (Python ignores SIGPIPE)
            os.setsid()
            _die_with_parent()
            os.close(gate_write)
            os.read(gate_read, 1)
            if os.getppid() != runner:   # the runner died before the gate opened
                os._exit(128 + signal.SIGKILL)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            if cwd is not None:
                os.chdir(cwd)
            if _call_instead is not None:
                for fd in (write_end, error_write, gate_read, read_end):   # (EOF: it started)
                    os.close(fd)
                _call(_call_instead, env)
            os.execvpe(command[0], command, env)
        except BaseException as exc:
            try:
                os.write(error_write, f"{getattr(exc, 'errno', 0) or 0}:{getattr(exc, 'strerror', 0) or exc}"
                         .encode())
            except BaseException:
                pass   # the parent then sees a bare exit 127
        finally:
            os._exit(127)
    for fd in (write_end, error_write, gate_read):
        os.close(fd)
    try:
        if started:
            started(pid)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for fd in (read_end, error_read):
            os.close(fd)
        raise
    finally:
        os.close(gate_write)
    with open(error_read, "rb") as errors:
        error = errors.read()
    if error:
        os.close(read_end)
        os.waitpid(pid, 0)
        number, _, message = error.decode(errors="replace").partition(":")
        raise OSError(int(number), message, command[0])
    return pid, read_end


def _call(step, env: dict) -> None:
    """In the step's process: ``step()`` with the step's environment, then
    exit with its status (never returns)."""
    status = 1
    try:
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):   # (as Python has them)
            signal.signal(signum, signal.SIG_IGN)
        os.environ.clear()
        os.environ.update(env)
        status = step()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


class Attempt:
    """One run of a command: its own process group, a teed log, a time limit,
    and SIGTERM/SIGINT/SIGHUP forwarded to it. Timers are SIGALRM's
    (``setitimer``), not threads: the time limit, then the grace period
    between SIGTERM and SIGKILL."""

    def __init__(self, command: list[str], env: dict, log_path: str, runtime: float | None, grace: float,
                 heartbeat=None, started=None, orphaned=None, cwd: str | None = None):
        self.heartbeat = heartbeat      # called every HEARTBEAT_S while the step runs
        self.started = started          # called with the step's group (stepgroup.record) before it runs
        self.orphaned = orphaned        # called by the watchdog once it ended the step of a runner gone
        self.group: StepGroup | None = None
        self.watchdog: int | None = None
        self._tell: int | None = None   # the pipe to the watchdog, until it is told the group
        self.command = command
        self.cwd = cwd                  # where the step runs (None: the runner's own directory)
        self.env = env
        self.log_path = log_path
        self.runtime = runtime
        self.grace = grace
        self.pid: int | None = None
        self.returncode: int | None = None
        self.received_signal: int | None = None
        self.timed_out = False
        self.log_fault: OSError | None = None   # a write to the log that failed (a full disk)
        self.terminating = False

    def _signal_group(self, signum: int) -> None:
        if self.pid is not None and self.returncode is None:   # never a reaped (maybe reused) pid
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                pass

    def _terminate(self) -> None:
        if not self.terminating:
            self.terminating = True
            self._term_then_kill()

    def _term_then_kill(self) -> None:
        self._signal_group(signal.SIGTERM)
        signal.setitimer(signal.ITIMER_REAL, max(self.grace, 0.001))   # 0 would disarm it

    def _on_signal(self, signum, _frame) -> None:
        self.received_signal = signum
        self._terminate()

    def _on_alarm(self, _signum, _frame) -> None:
        if self.terminating:            # the grace period is over
            self._signal_group(signal.SIGKILL)
        else:                           # the time limit
            self.timed_out = True
            self._terminate()

    def _tee(self, output: int, log) -> int:
        """Copy the step's output to the log and to stderr until the step's
        shell has ended and the output is closed, beating the heartbeat
        whenever ``HEARTBEAT_S`` pass (quiet steps too). Returns the shell's
        wait status. What the shell left running in the step's process group
        when it ended (a background job it did not wait for, a child of a
        killed shell) is killed then: nothing of an attempt goes on writing
        in the stage directory once its end is recorded."""
        import select
        # SIGCHLD wakes the select (a handler of Python's: set_wakeup_fd).
        wake_read, wake_write = os.pipe()
        for fd in (wake_read, wake_write):
            os.set_blocking(fd, False)
        previous_fd = signal.set_wakeup_fd(wake_write)
        previous_chld = signal.signal(signal.SIGCHLD, lambda *_: None)
        status, closed, drain_until = None, False, None
        last_beat = time.monotonic()
        try:
            while not closed:
                if status is None:
                    pid, found = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        status = found
                        self._signal_group(signal.SIGKILL)   # the shell is gone: so is what it left
                        drain_until = time.monotonic() + 5   # (a writer outside the group: don't wait on it)
                timeout = HEARTBEAT_S if drain_until is None else max(0.0, drain_until - time.monotonic())
                ready, _, _ = select.select([output, wake_read], [], [], timeout)
                if wake_read in ready:
                    while True:
                        try:
                            if not os.read(wake_read, 512):
                                break
                        except BlockingIOError:
                            break
                if output in ready:
                    chunk = os.read(output, 65536)
                    if chunk:
                        self._log(log, chunk)
                        sys.stderr.buffer.write(chunk)
                        sys.stderr.buffer.flush()
                    elif status is None:
                        closed = True
                        _, status = os.waitpid(self.pid, 0)
                    else:
                        closed = True
                elif drain_until is not None and time.monotonic() >= drain_until:
                    closed = True
                if self.heartbeat and time.monotonic() - last_beat >= HEARTBEAT_S:
                    last_beat = time.monotonic()
                    self.heartbeat()
        finally:
            signal.signal(signal.SIGCHLD, previous_chld)
            signal.set_wakeup_fd(previous_fd)
            for fd in (output, wake_read, wake_write):
                os.close(fd)
        return status

    def _log(self, log, chunk: bytes) -> None:
        """Add the step's output to its log. A write that fails (a full
        disk) is kept, not raised: the step goes on to its end, in its
        group, and ``run`` then says the attempt went unrecorded."""
        if self.log_fault is None:
            try:
                log.write(chunk)
            except OSError as exc:
                self.log_fault = exc

    def run(self) -> int:
        handlers = {s: self._on_signal for s in FORWARDED_SIGNALS}
        handlers[signal.SIGALRM] = self._on_alarm
        previous = {s: signal.signal(s, handler) for s, handler in handlers.items()}
        try:
            with open(self.log_path, "ab", buffering=0) as log:
                self.watchdog, self._tell = _watch(log.fileno(), self.orphaned) or (None, None)
                try:
                    self.pid, output = _spawn(self.command, self.env, self._watched, self.cwd)
                except OSError as exc:
                    message = f"waypost: cannot start {self.command[0]!r}: {exc}\n".encode()
                    log.write(message)
                    sys.stderr.buffer.write(message)
                    return 127
                if self.terminating:       # a signal came while it was starting: pass it on now
                    self._term_then_kill()
                elif self.runtime is not None:
                    signal.setitimer(signal.ITIMER_REAL, self.runtime)
                status = self._tee(output, log)
                self.returncode = os.waitstatus_to_exitcode(status)
            if self.log_fault is not None:   # the step ran to its end, its log could not be kept
                from waypost.model.writes import writing
                with writing(self.log_path):
                    raise self.log_fault
            return self.returncode
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self._tell is not None:   # the step never started
                os.close(self._tell)
                self._tell = None
            if self.watchdog:   # the step is over: nothing to watch
                os.kill(self.watchdog, signal.SIGKILL)
                # Not waited for (its teardown costs a step ~1 ms): once
                # SIGKILL is sent it runs nothing more; the runner's exit
                # hands it to init, which reaps it.
                os.waitpid(self.watchdog, os.WNOHANG)

    def _watched(self, pid: int) -> None:
        """The step's process exists (it waits to run): record its group,
        and tell the watchdog."""
        self.group = stepgroup.record(pid, self.grace)
        if self.started:
            self.started(self.group)
        if self._tell is not None:
            group = self.group
            os.write(self._tell, f"{group['pgid']} {group['start'] or 0} {group['kill_grace']}".encode())
            os.close(self._tell)
            self._tell = None

    @property
    def killed_by(self) -> int | None:
        """The signal that ended the step: its shell's own, or, as the
        shell reports a command killed by signal N (status 128 + N), its
        command's."""
        code = self.returncode
        if code is None:
            return None
        if code < 0:
            return -code
        return code - 128 if 128 < code < 128 + 65 else None


def classify(returncode: int, attempt: Attempt, oom: bool, missing_outputs: list[str]) -> str:
    """How an attempt ended, from what the runner saw of it."""
    if attempt.timed_out:
        return "TIMEOUT"
    if attempt.received_signal is not None:
        return "CANCELLED"
    if oom:
        return "OOM"
    if attempt.killed_by in HARDWARE_SIGNALS:
        return "HWFAILURE"
    if returncode != 0 or missing_outputs:
        return "FAILED"
    return "SUCCESS"
