"""The step runner: runs a stage's attempts and records what happened.

Every stage job runs it, with the job's step on its standard input (see
``waypost.spec``: one line of JSON, the step spec, then the rule's command
as Snakemake formatted it)::

    exec python -S .../waypost/launch.py <<'WAYPOST_STEP_…'
    {"waypost_step": 1, "stage": …}
    the rule's command
    WAYPOST_STEP_…

It starts at every step, so it imports little (``subprocess`` and
``argparse`` only when checks or options need them) and skips the
interpreter's teardown at exit.

One invocation runs one *series* of attempts toward a finished stage:

1. A new series archives whatever an earlier one left in the stage directory
   (under ``.attempts/<n>/``, never deleted). If Snakemake is retrying the job
   after the runner itself was killed (the stage's last attempt belongs to
   this same run: ``$WAYPOST_RUN_ID``, set by Snakemake's main process), the
   series goes on where it stopped instead.
2. Parents are checked against the policy's ``depends``; a stage whose parents
   don't qualify is SKIPPED.
3. Each attempt writes its command into ``_logs/attempt-<n>.sh`` with
   Snakemake's shell prefix and suffix (``set -euo pipefail`` for bash) and
   runs it with Snakemake's shell, in its own process group with the stage's
   env, output teed to ``_logs/attempt-<n>.log``, under the policy's runtime
   (SIGTERM, then SIGKILL after a grace period). How it ended is classified,
   the checks run, and the policy decides: done, restart (same workspace),
   rerun (dirty/clean/new workspace) or fail.
4. ``_manifest.json`` is written last and atomically. On failure: when the
   step is ``tolerated`` (a downstream funnel accepts it) the declared outputs
   are made to exist as placeholders, an ``_unfinished`` marker newer than
   them makes the next run redo the stage, and the runner exits 0 so
   Snakemake goes on to the funnel; otherwise it exits non-zero.

The step's own exit status is kept as it was; checks never overwrite it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from . import lifecycle, manifest, records, slurm, stores, with_site, workers
from . import policy as wpolicy
from . import spec as wspec
from .layout import LOGS, MANIFEST, PROVISIONAL, RUNNING, UNFINISHED, held_entry, stage_name, stage_root
from .stores.local import LocalStore

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# While a step runs, its ``_running.json`` is touched this often: a marker
# whose heartbeat is older than the lease (lifecycle.LEASE_S) is taken for one
# whose runner is gone, from any host (see lifecycle.judge).
HEARTBEAT_S = float(os.environ.get("WAYPOST_HEARTBEAT_SECONDS", "60"))
PR_SET_PDEATHSIG = 1
# Signals that take a process away without its consent: the machine (or the
# kernel on its behalf) did it, not the step.
HARDWARE_SIGNALS = (signal.SIGKILL, signal.SIGBUS)


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the runner dies (even by SIGKILL), so a
    step never outlives its runner and writes outputs nobody records."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class LostJob:
    """The executor's ``--lost-slurm-job`` mode: a Slurm job of the stage
    ended without a runner recording it (killed pending, before or as it
    started, never startable); record its end, run no command."""

    def __init__(self, job: str, state: str = "CANCELLED", reason: str = "", last_chance: bool = False):
        self.job, self.state, self.reason, self.last_chance = job, state, reason, last_chance


def _parser():
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m waypost.runner", usage="%(prog)s [options] < STEP",
        description="Run one stage job's step: its attempts, checks and policy, then its manifest. "
                    "The step comes on standard input (or from --spec FILE): one line of JSON, the step spec "
                    "(waypost.spec), then the command to its end. Snakemake's main process writes it; "
                    "see 'What the step sees' in waypost's manual (docs/reliability.md).",
        # A set width: argparse would import shutil to measure the terminal.
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=100))
    parser.add_argument("--spec", metavar="FILE", help="read the step from FILE instead of standard input")
    # Snakemake's main process records a Slurm job of the stage that ended
    # without a runner recording it (killed pending, before or as it started).
    parser.add_argument("--lost-slurm-job", metavar="JOB", help="record how this Slurm job of the stage ended; "
                        "run no command")
    parser.add_argument("--lost-state", default="CANCELLED", help="its end, as a waypost state")
    parser.add_argument("--lost-reason", default="", help="why, in Slurm's words")
    parser.add_argument("--last-chance", action="store_true",
                        help="Snakemake will not submit the stage again this run: end its series")
    return parser


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def parse_args(argv: list[str]) -> tuple[wspec.StepSpec, LostJob | None]:
    """The step (from standard input, or ``--spec FILE``) and the lost-job
    mode's options. A job's runner has no options: argparse (and its import)
    is only for the executor's lost-job mode, ``--spec`` and ``--help``."""
    lost, source = None, None
    if argv:
        options = _parser().parse_args(argv)
        source = options.spec
        if options.lost_slurm_job:
            lost = LostJob(options.lost_slurm_job, options.lost_state, options.lost_reason, options.last_chance)
    if source:
        with open(source, "rb") as f:
            data = f.read()
    else:
        data = _read_all(0)
    if not data.strip():
        raise SystemExit("waypost.runner: no step on standard input (see --help)")
    try:
        return wspec.read(data), lost
    except wspec.SpecError as exc:
        raise SystemExit(f"waypost.runner: {exc}") from None


def _parent(stage_dir: str, path: str) -> tuple[str, dict]:
    """The state of the stage that produced an input, and its manifest
    (ADOPTED: placed by hand; MISSING: not there)."""
    try:
        data = manifest.read(stage_dir)
    except manifest.ManifestError:
        data = None
    if data is not None:
        return data["state"], data
    return ("ADOPTED" if os.path.exists(path) else "MISSING"), {}


def producer_dir(path: str, depth: int = 8) -> str:
    """The stage directory that made an input: the nearest directory above
    it with a manifest (a file in a ``directory()`` output, such as a
    checkpoint's parts, is below its stage's directory); the input's own
    directory when none has (placed by hand)."""
    own = directory = os.path.dirname(path)
    for _ in range(depth):
        if os.path.exists(os.path.join(directory, MANIFEST)):
            return directory
        parent = os.path.dirname(directory)
        if not parent or parent == directory:
            break
        directory = parent
    return own


def parent_state(stage_dir: str, path: str) -> str:
    return _parent(stage_dir, path)[0]


def describe_inputs(paths: list[str]) -> list[dict]:
    """Each input with the manifest of the stage that produced it.

    The checksum comes from that manifest (no re-hashing); an input without a
    manifest was placed by hand (adopted).
    """
    described = []
    for path in paths:
        stage_dir = producer_dir(path)
        state, data = _parent(stage_dir, path)
        name = os.path.relpath(path, stage_dir)
        described.append({
            "path": path,
            "manifest": os.path.join(stage_dir, MANIFEST) if data else None,
            "state": state,
            "sha256": next((o["sha256"] for o in data.get("outputs", []) if o["path"] == name), None),
            "provisional": bool(data.get("provisional")),
        })
    return described


def _oom_kills() -> int | None:
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


def _spawn(command: list[str], env: dict) -> tuple[int, int]:
    """Start ``command`` (no shell) in a session of its own, with stdout and
    stderr on one pipe: (pid, the pipe's read end). OSError when it cannot
    start (not found, not executable).

    ``subprocess.Popen`` would do it, but the runner starts at every step
    and ``subprocess`` (with ``threading``, ``selectors``, ...) is the largest
    import it would have; one fork and exec of one command is all it needs.
    """
    read_end, write_end = os.pipe()
    error_read, error_write = os.pipe()    # close-on-exec: EOF once the exec worked
    runner = os.getpid()
    pid = os.fork()
    if pid == 0:   # the child: only until the exec
        try:
            for signum in (*FORWARDED_SIGNALS, signal.SIGALRM, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_DFL)  # as a shell would leave them (Python ignores SIGPIPE)
            os.setsid()
            _die_with_parent()
            if os.getppid() != runner:   # the runner died before the line above
                os._exit(128 + signal.SIGKILL)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            os.execvpe(command[0], command, env)
        except BaseException as exc:
            try:
                os.write(error_write, f"{getattr(exc, 'errno', 0) or 0}:{getattr(exc, 'strerror', 0) or exc}"
                         .encode())
            except BaseException:
                pass   # the parent then sees a bare exit 127
        finally:
            os._exit(127)
    os.close(write_end)
    os.close(error_write)
    with open(error_read, "rb") as errors:
        error = errors.read()
    if error:
        os.close(read_end)
        os.waitpid(pid, 0)
        number, _, message = error.decode(errors="replace").partition(":")
        raise OSError(int(number), message, command[0])
    return pid, read_end


class Attempt:
    """One run of a command: its own process group, a teed log, a time limit,
    and SIGTERM/SIGINT/SIGHUP forwarded to it. Timers are SIGALRM's
    (``setitimer``), not threads: the time limit, then the grace period
    between SIGTERM and SIGKILL."""

    def __init__(self, command: list[str], env: dict, log_path: str, runtime: float | None, grace: float,
                 heartbeat=None):
        self.heartbeat = heartbeat      # called every HEARTBEAT_S while the step runs
        self.command = command
        self.env = env
        self.log_path = log_path
        self.runtime = runtime
        self.grace = grace
        self.pid: int | None = None
        self.returncode: int | None = None
        self.received_signal: int | None = None
        self.timed_out = False
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
                        log.write(chunk)
                        log.flush()
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

    def run(self) -> int:
        handlers = {s: self._on_signal for s in FORWARDED_SIGNALS}
        handlers[signal.SIGALRM] = self._on_alarm
        previous = {s: signal.signal(s, handler) for s, handler in handlers.items()}
        try:
            with open(self.log_path, "ab") as log:
                try:
                    self.pid, output = _spawn(self.command, self.env)
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
                return self.returncode
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for s, handler in previous.items():
                signal.signal(s, handler)

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


class StageRun:
    """One series of attempts of one stage."""

    def __init__(self, step: wspec.StepSpec, lost: LostJob | None = None):
        self.spec = step
        self.lost = lost
        self.remote = None
        # The paths the step works with: on a bucket root, the local copies.
        self.inputs, self.outputs = step.inputs, step.outputs
        if stores.needs_mirror(step.stage_dir):   # only then: the runner starts at every step
            from .stores import mirror
            self.remote, self.inputs, self.outputs = mirror.for_runner(step)
        self.dir = self.remote.local if self.remote else step.stage_dir
        # Where the stage dir is, as a store (disk, or a mounted bucket): archives and heartbeats.
        self.store = None if self.remote else stores.store_for(stage_root(step.stage_dir, step.instance), quiet=True)
        # The Snakemake run this job is part of (a runner started by hand: a run of its own).
        self.run_id = os.environ.get(manifest.RUN_ID_ENV) or manifest.new_run_id()
        self.policy = wpolicy.Policy.from_config(step.policy)
        self.history: list[dict] = []   # every attempt ever, this series last
        self.series_no = 1
        self.series: list[dict] = []
        self.series_base = 0            # series before the last reset (waypost retry) don't count
        self.previous_settings: dict | None = None   # the last manifest's settings (see _resumes_other_settings)
        self.first = ("cmd", "a first series")
        self.refusal = ""
        # How the runner's lines name the stage: experiment/pair/stage[/instance].
        self.name = stage_name(step.pair, step.experiment, step.stage, step.instance)

    # --- bookkeeping -----------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _save_running(self, lost_job: str | None = None, push: bool = True) -> None:
        """``_running.json``: this runner at work; or, with ``lost_job``, the
        series a Slurm job that ended left (gone, as sacct says it is).
        ``push``: to the bucket too, on a gs:// root."""
        marker = records.marker(
            pid=None if lost_job else os.getpid(), host=None if lost_job else manifest.hostname(),
            run=self.run_id, series=self.series_no, series_base=self.series_base,
            outputs=[os.path.relpath(o, self.dir) for o in self.outputs],
            slurm_job_id=lost_job or os.environ.get("SLURM_JOB_ID"), attempts=self.history)
        manifest.write_json_atomic(self._path(RUNNING), records.checked("marker", marker, self._path(RUNNING)),
                                   durable=False)  # a marker of work in progress: the manifest is what must survive a crash
        if self.remote and push:
            self.remote.push(self.outputs)

    def _heartbeat(self) -> None:
        """Show that this runner is alive: refresh ``_running.json``'s time."""
        try:
            if self.remote:
                os.utime(self._path(RUNNING))
            else:
                self.store.heartbeat(self._path(RUNNING))
        except OSError:
            return
        if self.remote:
            self.remote.put_marker(RUNNING, time.time())

    def _archive(self, keep: tuple[str, ...] = ()) -> str | None:
        archived = self.remote.archive(keep) if self.remote else self.store.archive(self.dir, keep=keep)
        if archived:
            for old in self.history:
                if old.get("workspace") == ".":
                    old["workspace"] = archived
                    for name in ("log", "script"):   # both under _logs/
                        if old.get(name) and LOGS not in keep:
                            old[name] = os.path.join(archived, old[name])
            print(f"waypost: {self.name}: earlier workspace archived in {archived}", file=sys.stderr)
        return archived

    def _clean(self) -> None:
        """Remove what the failed attempts of this series left (only those:
        a series starts from an archived, empty workspace)."""
        for entry in manifest.workspace_entries(self.dir):
            if manifest.is_engine_file(entry):
                continue
            path = self._path(entry)
            if os.path.isdir(path) and not os.path.islink(path):
                import shutil  # here: the runner starts at every step, most never need it
                shutil.rmtree(path)
            else:
                os.unlink(path)

    def start(self) -> str | None:
        """Begin a new series, or go on with one whose runner was killed.

        Returns None to go on (``self.first``: the first action and why),
        "decided" when Snakemake retried a job whose series the policy had
        already ended (its decision stands), "done" when the retried job's
        work had succeeded after all, "given up" when the stage has had its
        ``max_series`` (``self.refusal`` says why), "backoff" when its next
        series may not start yet, and "record" when a series a killed runner
        left must be recorded as the last one.
        """
        os.makedirs(self.dir, exist_ok=True)
        # What the last runner left, as the lifecycle reader reads it (here,
        # the stage dir or its local copy: a marker is taken whether or not a
        # manifest closed it, since a copy's dates are the copy's).
        life = lifecycle.read(LocalStore(self.dir), self.dir)
        running = life.marker or None
        previous = life.manifest
        # What the work in the workspace was made under, for attempts that recorded none of their own.
        self.previous_settings = (previous or {}).get("settings")
        if life.error:
            print(f"waypost: {life.error}; archiving it with the old workspace", file=sys.stderr)
        self.series_base = (previous or {}).get("series_base", 0)
        # Snakemake retrying this job within the same run (Slurm ended the
        # last job, or the policy had ended the series), not a new run.
        retried = (running or previous or {}).get("run") == self.run_id
        if retried and self.remote:
            self.remote.pull_workspace()   # only the engine's files were fetched
        if running:
            # The runner before us was killed mid-attempt (by Slurm at its time
            # limit, by preemption, with its node, or with Snakemake).
            self.history = running.get("attempts", [])
            self.series_base = running.get("series_base", self.series_base)
            for attempt in self.history:
                if attempt.get("state") is None:
                    self._close_interrupted(attempt)
            last = self.history[-1] if self.history else {}
            if (last.get("decision") or {}).get("action") == "done" and all(map(os.path.exists, self.outputs)):
                # Its step had succeeded; the job ended while its manifest was
                # being written: the series is finished, not run again.
                self.series_no = running.get("series", 1)
                self.series = [a for a in self.history if a.get("series") == self.series_no]
                return "record"
            if retried:   # the same series goes on
                self.series_no = running.get("series", 1)
                self.series = [a for a in self.history if a.get("series") == self.series_no]
                return None
        elif previous and retried and previous["state"] != "SUCCESS":
            return "decided"
        elif previous and retried and not manifest.verify_outputs(self.dir, previous, checksums=False):
            return "done"  # the step had finished when Slurm ended the job
        elif previous:
            self.history = list(previous["attempts"])
        last_no = max((a.get("series", 1) for a in self.history), default=0)
        last_series = [a for a in self.history if a.get("series", 1) == last_no]
        unfinished = bool(last_series) and (running is not None or previous is None
                                            or previous["state"] != "SUCCESS")
        if unfinished:
            spent = last_no - self.series_base
            if (previous or {}).get("given_up") and not running:
                self.refusal = previous.get("reason") or f"given up after {spent} series"
                return "given up"
            if spent >= self.policy.max_series:
                if running:   # the killed runner's series was the last: record it so
                    self.series_no, self.series = last_no, last_series
                    return "record"
                self.refusal = f"given up after {spent} series (max_series {self.policy.max_series})"
                return "given up"
            not_before = (previous or {}).get("next_series_after") if not running else None
            if not_before and manifest.iso_to_epoch(not_before) > time.time():
                self.refusal = (f"series {last_no} ended {last_series[-1].get('state')}; the next may start "
                                f"from {not_before} (series_backoff)")
                return "backoff"
        self.series_no = 1 + last_no
        self.first = wpolicy.begin_series(self.policy, last_series if unfinished else [])
        if self.first[0] == "cmd":
            self._archive()
        elif unfinished:
            if self.remote and not retried and (self.first[0] == "restart" or self.policy.rerun != "new"):
                self.remote.pull_workspace()   # the series goes on in it: checkpoints and all
            print(f"waypost: {self.name}: series {self.series_no} starts with {self.first[0]}: {self.first[1]}",
                  file=sys.stderr)
        return None

    def _resumes_other_settings(self, action: str) -> dict | None:
        """When this attempt goes on with the work an earlier one left in the
        workspace (a restart in place, a rerun in the workspace as it is)
        and that one ran under other settings: which, and what differs (said
        in the log too: a checkpoint of 50 epochs resumed after ``epochs``
        became 40 is the user's to judge)."""
        if not self.policy.goes_on_in_workspace(action):
            return None
        from .diffs import resumed_work
        found = resumed_work(self.history, self.previous_settings, self.spec.settings)
        if found is None:
            return None
        number, differs = found
        print(f"waypost: {self.name}: this {action} goes on with attempt {number}'s work, made under "
              f"other settings: {'; '.join(differs)}", file=sys.stderr)
        return {"attempt": number, "settings": differs}

    @staticmethod
    def _close_interrupted(attempt: dict) -> None:
        """Fill in how an attempt whose runner died ended: Slurm's word when
        it ran in a Slurm job, else CANCELLED (stopped from outside)."""
        state, detail = None, None
        if attempt.get("slurm_job_id"):
            state, detail = slurm.final_state(attempt["slurm_job_id"])
        attempt.update(state=state or "CANCELLED", end=attempt.get("end") or manifest.now_iso(),
                       error=(attempt.get("error") or "the runner was killed during this attempt")
                             + (f" (Slurm: {detail})" if detail else ""))

    # --- one attempt -----------------------------------------------------
    def run_attempt(self, action: str) -> dict:
        number = len(self.history) + 1
        in_series = len(self.series) + 1
        os.makedirs(self._path(LOGS), exist_ok=True)
        log_rel = os.path.join(LOGS, f"attempt-{number}.log")
        command = self.spec.command
        if action == "restart" and self.policy.restart != "same":
            command = self.policy.restart
        # The command runs as plain Snakemake runs one: its shell, prefix and
        # suffix, from a script (of any length) kept beside the attempt's log.
        script_rel = os.path.join(LOGS, f"attempt-{number}.sh")
        with open(self._path(script_rel), "w") as f:
            f.write(self.spec.script(command))
        # Under Slurm the job's time limit is Slurm's to enforce (and report);
        # in a bundle (several stages in one job) each stage keeps its own.
        runtime = None if os.environ.get("SLURM_JOB_ID") and not os.environ.get("WAYPOST_BUNDLED") \
            else self.policy.runtime_seconds(in_series)
        previous = self.series[-1]["state"] if self.series else ""
        worker = workers.worker_env(os.environ, self.spec.worker_env)
        resumes = self._resumes_other_settings(action)
        record = records.attempt(
            number=number, series=self.series_no, action=action, start=manifest.now_iso(), run=self.run_id,
            host=manifest.hostname(), slurm_job_id=os.environ.get("SLURM_JOB_ID"), command=command,
            worker={"pool": self.spec.pool, "class": self.spec.worker_class, **worker}, log=log_rel,
            script=script_rel, runtime_limit_s=runtime, settings=self.spec.settings,
            config_hash=self.spec.config_hash, resumes=resumes,
            why=self.first[1] if in_series == 1 else None)   # how this series began
        self.history.append(record)
        self.series.append(record)
        self._save_running()

        counts = wpolicy.counters(self.series)
        env = self.env(action, previous, counts, runtime)
        env["GPUS"] = worker["GPUS"]
        if worker["WORKSPACE"] is not None:
            env["WORKSPACE"] = str(worker["WORKSPACE"])
        oom_before = _oom_kills()
        started = time.monotonic()
        if self.remote and stores.SCHEME in command:
            self._announce_urls(command, self._path(log_rel))
        attempt = Attempt([self.spec.executable, self._path(script_rel)], env, self._path(log_rel), runtime,
                          self.policy.kill_grace, self._heartbeat)
        if self.remote:
            with self.remote.syncing(self.outputs):
                returncode = attempt.run()
        else:
            returncode = attempt.run()
        oom_after = _oom_kills()
        missing = [p for p in self.outputs if not os.path.exists(p)] if returncode == 0 else []
        state = classify(returncode, attempt, oom_before is not None and oom_after != oom_before, missing)
        record.update({
            "state": state,
            "exit_code": returncode if returncode >= 0 else None,
            "signal": attempt.killed_by,   # the shell's own, or its command's (status 128 + N)
            "end": manifest.now_iso(),
            "duration_s": round(time.monotonic() - started, 3),
        })
        if missing:
            record["error"] = "command exited 0 but did not write: " + ", ".join(missing)
        record["checks"] = self.run_checks(env, self._path(log_rel))
        self.received_signal = attempt.received_signal
        print(f"waypost: {self.name} attempt {number} ({action}) ended {state}"
              + (f" [{record['error']}]" if missing else ""), file=sys.stderr)
        return record

    @staticmethod
    def _announce_urls(command: str, log_path: str) -> None:
        """Say so when the step's command still names a gs:// URL: its inputs
        and outputs are local copies, but a URL written into the command (or
        a setting) reaches the step as it is, and a program that reads plain
        files can't open it."""
        import re
        urls = sorted(set(re.findall(re.escape(stores.SCHEME) + r"[^\s'\";|&()<>]+", command)))
        message = (f"waypost: note: the command names {', '.join(urls)}; only the job's inputs and outputs are "
                   "mapped to local copies, so the step sees these as they are (URLs, not files)\n").encode()
        with open(log_path, "ab") as log:
            log.write(message)
        sys.stderr.buffer.write(message)

    def env(self, action: str, previous: str, counts: dict, runtime: float | None) -> dict:
        env = dict(os.environ)
        env.update({
            "WAYPOST_STAGE_DIR": self.dir,
            "WAYPOST_EXPERIMENT": self.spec.experiment,
            "WAYPOST_PAIR": self.spec.pair,
            "WAYPOST_STAGE": self.spec.stage,
            "WAYPOST_INSTANCE": self.spec.instance or "",
            "WAYPOST_ACTION": action,
            # One numbering: the attempt's number as the tables show it
            # (across series), and its place in its series (the cues' `attempt`).
            "WAYPOST_ATTEMPT": str(self.series[-1]["number"] if self.series else 1),
            "WAYPOST_SERIES": str(self.series_no),
            "WAYPOST_SERIES_ATTEMPT": str(counts["attempt"]),
            "WAYPOST_ATTEMPT_RESTART": str(counts["attempt.restart"]),
            "WAYPOST_ATTEMPT_RERUN": str(counts["attempt.rerun"]),
            "WAYPOST_PREVIOUS_STATE": previous,
            "WAYPOST_RUNTIME_SECONDS": "" if runtime is None else str(int(runtime)),
        })
        if self.remote:   # where gs://BUCKET/KEY is copied locally: $WAYPOST_MIRROR/BUCKET/KEY
            env["WAYPOST_MIRROR"] = self.remote.mirror
        # `python` in a step is the interpreter waypost runs with (its venv's),
        # activated or not.
        bin_dir = os.path.dirname(sys.executable)
        if env.get("PATH", "").split(os.pathsep)[0] != bin_dir:
            env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", os.defpath)])
        return env

    def run_checks(self, env: dict, log_path: str) -> dict:
        if not self.policy.checks:
            return {}
        import subprocess  # here: most steps have no checks
        results = {}
        for name, command in self.policy.checks.items():
            with open(log_path, "ab") as log:
                log.write(f"waypost: check {name}: {command}\n".encode())
                try:
                    done = subprocess.run(["bash", "-c", command], env=env, stdout=log, stderr=log,
                                          timeout=self.policy.check_timeout)
                    results[name] = "SUCCESS" if done.returncode == 0 else "FAILED"
                except subprocess.TimeoutExpired:
                    results[name] = "TIMEOUT"
                log.write(f"waypost: check {name}: {results[name]}\n".encode())
        return results

    # --- the series --------------------------------------------------------
    def parents_block(self) -> list[str]:
        """Parents whose state the policy's ``depends`` does not accept."""
        blocked = []
        for path in self.inputs:
            state = parent_state(producer_dir(path), path)
            effective = "SUCCESS" if state == "ADOPTED" else state
            if effective == "MISSING" or not self.policy.accepts(effective):
                blocked.append(f"{os.path.dirname(path)} is {state}")
        return sorted(set(blocked))

    def prepare_workspace(self, action: str) -> None:
        if action == "rerun":
            if self.policy.rerun == "new":
                self._archive(keep=(LOGS, RUNNING))
            elif self.policy.rerun == "clean":
                self._clean()

    def record_lost_job(self) -> int:
        """Record a Slurm job of this stage whose end no runner recorded: one
        cancelled while pending, killed before or as its runner started, or
        never startable (``--lost-reason``). Its attempt joins the series and
        the policy decides as after any attempt: the series goes on when
        Snakemake submits the stage again, or ends here (its manifest) when
        the policy fails it or Snakemake will not (``--last-chance``).
        A job a runner did record is left to that record (an open attempt is
        closed from sacct by the next runner, or here on the last chance)."""
        job = self.lost.job
        self.received_signal = None
        live = lifecycle.live_attempt(self.spec.stage_dir)
        if live and live.slurm_job != str(job):
            # Another attempt is at work here (a dead driver's job, say): it
            # records its own end; nothing of it is touched.
            print(f"waypost: {self.name}: Slurm job {job} ended; an attempt is at work in {self.dir} "
                  f"({live.where}), left to it", file=sys.stderr)
            return 0
        recorded = self._recorded_job(job)
        if recorded:
            # A runner recorded this job. Its series is either over (its
            # manifest) or left open for the next job (an attempt Slurm ended,
            # or one that needs a bigger allocation): on the last chance, end it.
            if not self.lost.last_chance or not os.path.exists(self._path(RUNNING)):
                return 0
            started = self.start()
            if started == "record":     # its step had succeeded: the series is finished
                return self.finish("SUCCESS")
            if started is not None:
                return 0
            return self._decide_and_end(last_chance=True)
        if self.start() is not None:      # done, decided, given up, on hold: nothing of ours to add
            return 0
        action = self.series[-1]["decision"]["action"] if self.series and self.series[-1].get("decision") \
            else self.first[0]
        now = manifest.now_iso()
        reason = self.lost.reason or "the Slurm job ended before its step runner started"
        record = records.attempt(
            number=len(self.history) + 1, series=self.series_no, action=action, state=self.lost.state,
            start=now, end=now, duration_s=0.0, host=None, run=self.run_id, slurm_job_id=job,
            command=self.spec.command, worker={"pool": self.spec.pool, "class": self.spec.worker_class},
            error=f"Slurm job {job} ended {self.lost.state} before its step ran: {reason}",
            why=self.first[1] if len(self.series) == 0 else None)
        self.history.append(record)
        self.series.append(record)
        return self._decide_and_end(last_chance=self.lost.last_chance, why=record["error"])

    def _done(self) -> bool:
        """Is the stage finished: a SUCCESS manifest whose outputs are there?"""
        data = lifecycle.read(LocalStore(self.dir), self.dir).manifest
        return bool(data) and data["state"] == "SUCCESS" and not manifest.verify_outputs(self.dir, data,
                                                                                         checksums=False)

    def _recorded_job(self, job: str) -> str | None:
        """Does a runner's record name this Slurm job: "open" (its attempt
        has no end yet), "closed", or None."""
        life = lifecycle.read(LocalStore(self.dir), self.dir)
        records = [*((life.marker or {}).get("attempts") or []), *((life.manifest or {}).get("attempts") or [])]
        states = [a.get("state") for a in records if isinstance(a, dict) and str(a.get("slurm_job_id")) == str(job)]
        if not states:
            return None
        return "closed" if all(states) else "open"

    def _decide_and_end(self, last_chance: bool, why: str | None = None) -> int:
        action, reason = wpolicy.decide(self.policy, self.series)
        if action in ("cmd", "restart", "rerun") and last_chance:
            action, reason = "fail", f"{reason}, but Snakemake's retries of this job are spent"
        self.series[-1]["decision"] = {"action": action, "reason": reason}
        print(f"waypost: {self.name} attempt {self.series[-1]['number']} ended {self.series[-1]['state']} "
              f"(Slurm job {self.series[-1].get('slurm_job_id')}); next: {action} ({reason})", file=sys.stderr)
        if action in ("cmd", "restart", "rerun"):
            # the job Snakemake submits next goes on with the series
            self._save_running(lost_job=str(self.series[-1].get("slurm_job_id")))
            if self.remote:
                self.remote.close()
            return 0
        last = self.series[-1]["state"]
        return self.finish("FAILED" if last == "SUCCESS" else last, reason=why,
                           give_up=reason if action == "give_up" else None)

    def run(self) -> int:
        self.received_signal = None
        if self.lost:
            return self.record_lost_job()
        if self.remote:
            self.remote.pull(self.inputs)
        # One live attempt per stage directory, whoever started it (a run
        # whose driver died leaves its jobs at work): wait for it to end, as
        # if this job were it, then go on from what it left.
        # (On a bucket root ``pull`` just fetched the marker: without one
        # there, there is nothing to ask the bucket about.)
        live = None if self.remote and not os.path.exists(self._path(RUNNING)) else \
            lifecycle.live_attempt(self.spec.stage_dir, me=os.getpid())
        if live and live.unknown:
            # Whether it is still at work can't be known (another host, sacct
            # silent): never taken for gone, nor waited on for a lease.
            print(f"waypost: {self.name}: an attempt may still be at work in {self.spec.stage_dir} "
                  f"({live.where}); not starting a second one", file=sys.stderr)
            return 75
        waited = live and lifecycle.wait_until_gone(
            self.spec.stage_dir, me=os.getpid(),
            say=lambda live: print(f"waypost: {self.name}: an attempt is at work in {self.spec.stage_dir} "
                                   f"({live.where}); waiting for it to end instead of starting a second one",
                                   file=sys.stderr))
        if waited and self.remote:
            self.remote.refresh()     # what it left
        if waited and self._done():
            print(f"waypost: {self.name}: done by the attempt waited for ({waited.where})", file=sys.stderr)
            return 0
        started = self.start()
        if started == "done":
            print(f"waypost: {self.name}: already done (its job was ended after the step finished)",
                  file=sys.stderr)
            return 0
        if started in ("given up", "backoff"):
            print(f"waypost: {self.name}: {self.refusal}; not started"
                  + ("; `waypost retry` or `waypost rerun` to try again" if started == "given up" else ""),
                  file=sys.stderr)
            if self.spec.tolerated:   # a funnel goes on over it, as when it ended
                self._placeholders()
                return 0
            return 1
        if started == "record":
            return self.finish(self.series[-1]["state"] or "CANCELLED")
        if started == "decided":
            print(f"waypost: {self.name}: the policy already ended this stage "
                  "(Snakemake retried the job); not starting again", file=sys.stderr)
            previous = manifest.read(self.dir)
            last = previous["attempts"][-1] if previous["attempts"] else {}
            return last.get("exit_code") or 1
        if not self.series:
            blocked = self.parents_block()
            if blocked:
                return self.finish("SKIPPED", reason="parents not accepted by depends "
                                   f"({self.policy.depends}): " + "; ".join(blocked))
            action = self.first[0]
        else:
            action, reason = wpolicy.decide(self.policy, self.series)
            self.series[-1]["decision"] = {"action": action, "reason": reason}
        while action in ("cmd", "restart", "rerun"):
            self.prepare_workspace(action)
            record = self.run_attempt(action)
            if self.received_signal is not None and os.environ.get("SLURM_JOB_ID"):
                # Slurm signals a job it ends for any reason (time limit,
                # preemption, scancel): the next runner asks sacct which, and
                # the policy decides then. Leave the attempt open.
                record["state"] = None
                record["error"] = f"signal {self.received_signal} from Slurm; sacct will say why"
                self._save_running()
                print(f"waypost: {self.name}: Slurm is ending this job; "
                      "the next attempt learns why from sacct", file=sys.stderr)
                return 128 + self.received_signal
            if self.received_signal is not None:
                action, reason = "fail", "cancelled from outside"
            else:
                action, reason = wpolicy.decide(self.policy, self.series)
            record["decision"] = {"action": action, "reason": reason}
            print(f"waypost: {self.name}: next: {action} ({reason})", file=sys.stderr)
            if action == "done":
                # Before hashing the outputs and writing the manifest: a job
                # ended meanwhile (its time limit) leaves a series the next
                # runner finishes instead of running the step again.
                self._save_running(push=False)
            if record["state"] == "OOM" and action in ("restart", "rerun") and os.environ.get("SLURM_JOB_ID") \
                    and self.policy.memory_growth > 1:
                # This allocation is too small: the next Slurm job, with
                # memory_growth more, goes on with the series.
                self._save_running()
                print(f"waypost: {self.name}: out of memory in Slurm job {os.environ['SLURM_JOB_ID']}; "
                      "the next job (with more memory) goes on", file=sys.stderr)
                return 1
        last = self.series[-1]["state"]
        final = "SUCCESS" if action == "done" else ("FAILED" if last == "SUCCESS" else last)
        return self.finish(final, give_up=reason if action == "give_up" else None)

    def finish(self, state: str, reason: str | None = None, give_up: str | None = None) -> int:
        """Write the manifest (last): the series ended ``state``. ``give_up``:
        the policy gave the stage up for good (a ``give_up`` cue: why), so no
        run starts another series until ``waypost retry``."""
        outputs = manifest.describe_outputs(self.dir, self.outputs) if state == "SUCCESS" else []
        inputs = describe_inputs(self.inputs)
        if self.remote:
            inputs = self.remote.locate(inputs)
        record = records.manifest(
            experiment=self.spec.experiment, pair=self.spec.pair, stage=self.spec.stage,
            instance=self.spec.instance, state=state, created=manifest.now_iso(), attempts=self.history,
            outputs=outputs, inputs=inputs, settings=self.spec.settings,
            config_hash=self.spec.config_hash, code_version=self.spec.code_version, run=self.run_id,
        )
        if self.series_base:
            record["series_base"] = self.series_base
        # A stage that ran over parents that did not succeed (a funnel), or
        # over provisional ones, is provisional: the next run looks at those
        # parents again and redoes it when one of them is redone.
        unsound = [i["path"] for i in inputs if i["state"] not in ("SUCCESS", "ADOPTED") or i["provisional"]]
        record["provisional"] = state == "SUCCESS" and bool(unsound)
        now = time.time()
        redo_from = now   # when the next run may redo a stage that ended without success
        hold = None       # the root's registry (layout.HELD): until when it waits (0: given up)
        if state != "SUCCESS" and self.series:
            spent = self.series_no - self.series_base
            if give_up:
                record["given_up"] = True
                hold = 0.0
                reason = (f"{reason}; " if reason else "") + f"given up by {give_up}"
            elif spent >= self.policy.max_series:
                record["given_up"] = True
                hold = 0.0
                reason = (f"{reason}; " if reason else "") + \
                    f"given up after {spent} series (max_series {self.policy.max_series})"
            elif self.policy.backoff_seconds(spent):
                redo_from = hold = now + self.policy.backoff_seconds(spent)
                record["next_series_after"] = manifest.epoch_to_iso(redo_from)
        if reason:
            record["reason"] = reason
            print(f"waypost: {self.name} {state}: {reason}", file=sys.stderr)
        tolerated = state != "SUCCESS" and self.spec.tolerated and self.received_signal is None
        if tolerated:
            self._placeholders()
        path = manifest.manifest_path(self.dir)
        manifest.write_json_atomic(path, records.checked("manifest", record, path))
        if self.remote:  # outputs only where they count; the manifest last
            self.remote.push(self.outputs, final=state == "SUCCESS" or tolerated)
        # A skipped stage is looked at again when one of its parents is redone
        # (a parent given up is not: nor is its consumer), a failed one is redone.
        self._set_marker(UNFINISHED, redo_from if tolerated and state != "SKIPPED" and not record.get("given_up")
                         else None)
        self._set_marker(PROVISIONAL, now if record["provisional"] or (tolerated and state == "SKIPPED") else None)
        self._register_hold(hold)
        if os.path.exists(self._path(RUNNING)):
            os.unlink(self._path(RUNNING))
        if self.remote:
            self.remote.close()
        if state == "SUCCESS":
            return 0
        if tolerated:
            later = ("it is given up: `waypost retry` or `waypost rerun` to try again" if record.get("given_up")
                     else "the next run redoes this stage")
            print(f"waypost: {self.name} recorded as {state}; a downstream funnel accepts it, "
                  f"so the run goes on ({later})", file=sys.stderr)
            return 0
        last = self.series[-1] if self.series else {}
        if last.get("exit_code"):
            return last["exit_code"]
        if last.get("signal") or self.received_signal:
            return 128 + (last.get("signal") or self.received_signal)
        return 1

    def _register_hold(self, until: float | None) -> None:
        """Keep the root's registry of stages on hold (layout.HELD) true: an
        entry dated ``until`` (0: given up), or none."""
        entry = held_entry(stage_root(self.spec.stage_dir, self.spec.instance), self.spec.stage_dir)
        if self.remote:
            self.remote.registry(entry, until)
        elif until is not None:
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            open(entry, "w").close()
            os.utime(entry, (until, until))
        elif os.path.lexists(entry):
            os.unlink(entry)

    def _set_marker(self, name: str, when: float | None) -> None:
        """Write (dated ``when``) or remove one of the planner's markers.

        ``_unfinished``: the stage ended without success but a funnel went on
        over its placeholders; the next run redoes it from the time the marker
        is dated (its series backoff). ``_provisional``: the stage succeeded
        over parents that did not; the next run looks at them again. Neither
        is an input of a job: the planner forces the job (see
        ``waypost.snakemake``), so no timestamp has to beat another."""
        path = self._path(name)
        if when is None:
            if os.path.lexists(path):
                os.unlink(path)
                if self.remote:
                    self.remote.remove_marker(name)
            return
        with open(path, "w") as f:
            f.write(f"{self.series[-1]['state'] if self.series else 'SKIPPED'}\n")
        os.utime(path, (when, when))
        if self.remote:
            self.remote.put_marker(name, when)

    def _placeholders(self) -> None:
        """Declared outputs Snakemake needs to see; empty where the step wrote
        none. The manifest (not SUCCESS) and the marker say what they are."""
        for path in self.outputs:
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                open(path, "wb").close()


def main(argv: list[str] | None = None) -> int:
    step, lost = parse_args(sys.argv[1:] if argv is None else argv)
    if step.mounts:   # which bucket a mount serves, as the config says (stores.mounted)
        from .stores import mounted
        mounted.declare(step.mounts)
    if step.reuse_from or stores.needs_mirror(step.stage_dir):
        with_site()   # gcsfs and the rest of what they import are site-packages'
    if step.reuse_from and not lost:
        from . import reuse
        return reuse.take(step)
    try:
        return StageRun(step, lost).run()
    except wpolicy.PolicyError as exc:
        print(f"waypost: invalid policy for {step.stage}: {exc}", file=sys.stderr)
        return 2


def command(python: str) -> list[str]:
    """How a job starts the runner: without ``site``, which costs each step
    ~3 ms (``launch.py``); a step that needs installed packages (a bucket, a
    reuse) brings them in itself (``waypost.with_site``)."""
    return [python, "-S", os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")]


def run_and_exit() -> None:
    """``main()``, then exit with its status. A local stage leaves nothing for
    the interpreter's teardown (files closed, the manifest synced), and that
    teardown (freeing every module, a last collection) costs each step
    ~5 ms: skip it. A gs:// stage's client may still have work at exit.

    Steps run side by side write to the run's one terminal or pipe: each
    line of the runner's goes out in one write (``print`` writes its text
    and its newline apart, and another runner's line tore in between)."""
    sys.stderr.reconfigure(line_buffering=True, write_through=False)
    status = main()
    if "waypost.stores.mirror" in sys.modules or "gcsfs" in sys.modules:
        sys.exit(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    run_and_exit()
