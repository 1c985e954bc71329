"""One attempt of a stage's step, as its series records it: the command
written into ``_logs/attempt-<n>.sh``, the environment the step sees, the
process (``attempt.Attempt``), how it ended, and the policy's checks."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time

from waypost import scheduler, stores
from waypost.model import manifest, records, workers, writes
from waypost.model import policy as wpolicy
from waypost.model import spec as wspec
from waypost.model.layout import LOGS
from waypost.runner.attempt import Attempt, classify, oom_kills
from waypost.runner.series import Series
from waypost.runner.stagedir import StageDirectory
from waypost.runner.steplog import StepLog

#: Longer than this, a command runs from its kept ``.sh`` rather than as its
#: shell's ``-c`` argument: Linux takes no single argument over 128 KiB
#: (``MAX_ARG_STRLEN``), where plain Snakemake's ``-c`` fails; the length is
#: in characters, each up to 4 bytes.
LONGEST_ARGUMENT = 32 * 1024


class StageAttempt:
    """One attempt (``action``: cmd, restart or rerun) of the series under way."""

    def __init__(self, step: wspec.StepSpec, policy: wpolicy.Policy, directory: StageDirectory, series: Series,
                 action: str, rerun: str | None = None):
        self.spec, self.policy, self.directory, self.series, self.action = step, policy, directory, series, action
        self.rerun = rerun   # a rerun's workspace mode, as decided (None: the policy's)
        self.received_signal: int | None = None   # the signal that ended it from outside, if one did

    def run(self) -> records.Attempt:
        """Run the attempt and return its record (in the series' history)."""
        spec, policy, directory, series, action = self.spec, self.policy, self.directory, self.series, self.action
        number = len(series.history) + 1
        in_series = len(series.attempts) + 1
        os.makedirs(directory.path(LOGS), exist_ok=True)
        log_rel = os.path.join(LOGS, f"attempt-{number}.log")
        command = spec.command
        if action == "restart" and policy.restart != "same":
            # As Snakemake formatted it with the job's placeholders (wiring.steps.with_restart);
            # as written in a step without it (a runner started by hand).
            command = spec.restart_command if spec.restart_command is not None else policy.restart
        # The command runs as plain Snakemake runs one: its shell's ``-c``,
        # with Snakemake's prefix and suffix, and the same text kept beside the
        # attempt's log as what ran. A script Snakemake generated for the job
        # is kept too, and the .sh names that copy (Snakemake removes its
        # own); this attempt runs Snakemake's, as plain Snakemake does (its
        # ``__real_file__``).
        command, generated = keep_generated_scripts(command, directory, number, self._in_stage())
        script_rel = os.path.join(LOGS, f"attempt-{number}.sh")
        kept = spec.script(command)
        writes.whole(directory.path(script_rel), kept.encode())
        running_now = spec.script(generated) if generated != command else kept
        # The log grows in the stage directory where its root can append to a
        # file; on a bucket mount, in a scratch file written whole into the
        # stage directory now, at each heartbeat and at the end (steplog).
        log = StepLog(directory.path(log_rel), appends=directory.appends)
        try:
            log.publish()
            record = self._run(number, in_series, command, log_rel, script_rel, log, running_now)
        except BaseException:
            log.close(quiet=True)   # what ended it says so, not this
            raise
        log.close()
        return record

    def _in_stage(self) -> bool:
        """Does the step run in its stage directory (``workdir: stage``; a
        rule in its own layout runs where Snakemake runs its jobs)?"""
        return self.policy.workdir == "stage" and self.directory.workspace.runs_in_record

    def _run(self, number: int, in_series: int, command: str, log_rel: str, script_rel: str, log: StepLog,
             running_now: str) -> records.Attempt:
        directory, series, action = self.directory, self.series, self.action
        runtime = self._runtime_limit(in_series)
        previous = series.attempts[-1]["state"] if series.attempts else ""
        worker = workers.worker_env(os.environ, self.spec.worker_env)
        record = self._begin_record(number, in_series, command, log_rel, script_rel, runtime, worker)
        env = self._step_env(previous, runtime, worker)
        oom_before = oom_kills()
        started = time.monotonic()
        if directory.remote and _names_urls(command):
            _announce_urls(command, log)
        attempt = self._process(env, log, runtime, script_rel, running_now)
        if directory.remote:
            with directory.remote.syncing(directory.outputs):
                returncode = attempt.run()
        else:
            returncode = attempt.run()
        oom_after = oom_kills()
        if returncode == 0:
            for path in directory.touched:   # (Snakemake makes them once the job ended; before the outputs are checked)
                with open(path, "ab"):
                    os.utime(path)
        directory.workspace.attempt_ended(record)
        missing = [p for p in directory.outputs if not os.path.exists(p)] if returncode == 0 else []
        state = classify(returncode, attempt, oom_before is not None and oom_after != oom_before, missing)
        self._record_end(record, state, returncode, attempt, started, missing)
        record["checks"], exits = self.run_checks(env, log)
        if exits:
            record["check_exit_codes"] = exits
        self.received_signal = attempt.received_signal
        print(f"waypost: {directory.name} attempt {number} ({action}) ended {state}"
              + (f" [{record['error']}]" if missing else ""), file=sys.stderr)
        return record

    def _runtime_limit(self, in_series: int) -> float | None:
        """The attempt's own time limit. In a scheduler's job (Slurm's) its
        time limit is the scheduler's to enforce (and report); in a bundle
        (several stages in one job) each stage keeps its own."""
        if scheduler.current_job() and not os.environ.get("WAYPOST_BUNDLED"):
            return None
        return self.policy.runtime_seconds(in_series)

    def _begin_record(self, number: int, in_series: int, command: str, log_rel: str, script_rel: str,
                      runtime: float | None, worker: dict) -> records.Attempt:
        """The attempt's record as it starts, added to the series' history."""
        spec, series = self.spec, self.series
        resumes = self._resumes_other_settings()
        record = records.attempt(
            number=number, series=series.number, action=self.action, start=manifest.now_iso(), run=series.run_id,
            host=manifest.hostname(), job=scheduler.current_job(), command=command,
            worker={"pool": spec.pool, "class": spec.worker_class, **worker}, log=log_rel,
            script=script_rel, runtime_limit_s=runtime, settings=spec.settings,
            config_hash=spec.config_hash, resumes=resumes,
            why=series.first[1] if in_series == 1 else None)   # how this series began
        series.history.append(record)
        series.attempts.append(record)
        return record

    def _step_env(self, previous: str, runtime: float | None, worker: dict) -> dict:
        """The step's environment (``env``), with what its worker gives it."""
        env = self.env(previous, wpolicy.counters(self.series.attempts), runtime)
        env["GPUS"] = worker["GPUS"]
        if worker["WORKSPACE"] is not None:
            env["WORKSPACE"] = str(worker["WORKSPACE"])
        return env

    def _process(self, env: dict, log: StepLog, runtime: float | None, script_rel: str,
                 running_now: str) -> Attempt:
        """The step's process, ready to run (the workspace told that an
        attempt begins)."""
        spec, directory = self.spec, self.directory

        def heartbeat() -> None:
            directory.heartbeat()
            log.refresh()
        # The running marker is written once the step's process exists and
        # before it runs: with its process group, for whoever comes next. A
        # watchdog that ends the step once its runner is gone writes the log
        # whole then (``log.close``), on a root that can't append.
        # (the script by a path that holds from there; a rule in its own
        # layout runs where Snakemake runs its jobs, as its paths say)
        in_stage = self._in_stage()
        directory.workspace.attempt_begins()
        program = [spec.executable, "-c", running_now] if len(running_now) < LONGEST_ARGUMENT else \
            [spec.executable, os.path.abspath(directory.path(script_rel)) if in_stage else directory.path(script_rel)]
        return Attempt(program, env, log.growing, runtime,
                       self.policy.kill_grace, heartbeat,
                       started=lambda group: directory.save_running(self.series, group=group),
                       orphaned=lambda: log.close(quiet=True), cwd=directory.dir if in_stage else None)

    @staticmethod
    def _record_end(record: records.Attempt, state: str, returncode: int, attempt: Attempt, started: float,
                    missing: list[str]) -> None:
        """Fill in how the attempt's step ended (its checks aside)."""
        record.update({
            "state": state,
            "exit_code": returncode if returncode >= 0 else None,
            "signal": attempt.killed_by,   # the shell's own, or its command's (status 128 + N)
            "end": manifest.now_iso(),
            "duration_s": round(time.monotonic() - started, 3),
        })
        if missing:
            record["error"] = "command exited 0 but did not write: " + ", ".join(missing)

    def _resumes_other_settings(self) -> dict | None:
        """When this attempt goes on with the work an earlier one left in the
        workspace (a restart in place, a rerun in the workspace as it is)
        and that one ran under other settings: which, and what differs (said
        in the log too: a checkpoint of 50 epochs resumed after ``epochs``
        became 40 is the user's to judge)."""
        if not self.policy.goes_on_in_workspace(self.action, self.rerun):
            return None
        from waypost.model.diffs import resumed_work
        found = resumed_work(self.series.history, self.series.previous_settings, self.spec.settings)
        if found is None:
            return None
        number, differs = found
        print(f"waypost: {self.directory.name}: this {self.action} goes on with attempt {number}'s work, made "
              f"under other settings: {'; '.join(differs)}", file=sys.stderr)
        return {"attempt": number, "settings": differs}

    def env(self, previous: str, counts: dict, runtime: float | None) -> dict:
        """The step's environment: the runner's, and what waypost tells it."""
        env = dict(os.environ)
        env.update({
            # (absolute for a step run in it: a path that holds from there)
            "WAYPOST_STAGE_DIR": os.path.abspath(self.directory.dir) if self.policy.workdir == "stage"
            else self.directory.dir,
            "WAYPOST_EXPERIMENT": self.spec.experiment,
            "WAYPOST_PAIR": self.spec.pair,
            "WAYPOST_STAGE": self.spec.stage,
            "WAYPOST_INSTANCE": self.spec.instance or "",
            "WAYPOST_ACTION": self.action,
            # One numbering: the attempt's number as the tables show it
            # (across series), and its place in its series (the cues' `attempt`).
            "WAYPOST_ATTEMPT": str(self.series.attempts[-1]["number"] if self.series.attempts else 1),
            "WAYPOST_SERIES": str(self.series.number),
            "WAYPOST_SERIES_ATTEMPT": str(counts["attempt"]),
            "WAYPOST_ATTEMPT_RESTART": str(counts["attempt.restart"]),
            "WAYPOST_ATTEMPT_RERUN": str(counts["attempt.rerun"]),
            "WAYPOST_PREVIOUS_STATE": previous,
            "WAYPOST_RUNTIME_SECONDS": "" if runtime is None else str(int(runtime)),
        })
        if self.directory.remote:   # where gs://BUCKET/KEY is copied locally: $WAYPOST_MIRROR/BUCKET/KEY
            env["WAYPOST_MIRROR"] = self.directory.remote.mirror
        # `python` in a stage's step is the interpreter waypost runs with (its
        # venv's), activated or not; a rule in its own layout's sees the PATH
        # plain Snakemake gives it (a `conda:` env's, say).
        bin_dir = os.path.dirname(sys.executable)
        if self.directory.workspace.python_first and env.get("PATH", "").split(os.pathsep)[0] != bin_dir:
            env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", os.defpath)])
        return env

    def run_checks(self, env: dict, steplog: StepLog) -> tuple[dict, dict]:
        """Run the policy's checks, their output after the step's in its log:
        each check's state, and its exit status (None: a signal ended it, or
        its time limit)."""
        if not self.policy.checks:
            return {}, {}
        import subprocess  # here: most steps have no checks
        results, exits = {}, {}
        for name, command in self.policy.checks.items():
            with writes.writing(steplog.growing), open(steplog.growing, "ab") as log:   # (see steplog)
                log.write(f"waypost: check {name}: {command}\n".encode())
                try:
                    done = subprocess.run(["bash", "-c", command], env=env, stdout=log, stderr=log,
                                          timeout=self.policy.check_timeout)
                    results[name] = "SUCCESS" if done.returncode == 0 else "FAILED"
                    exits[name] = exit_of(done.returncode)
                except subprocess.TimeoutExpired:
                    results[name], exits[name] = "TIMEOUT", None
                said = f" (exit {exits[name]})" if exits[name] not in (None, 0) else ""
                log.write(f"waypost: check {name}: {results[name]}{said}\n".encode())
        return results, exits


def exit_of(returncode: int) -> int | None:
    """A process's exit status as conditions read it (``NAME.exit``): None
    when a signal ended it (negative, or 128 + N as a shell reports it)."""
    return None if returncode < 0 or 128 < returncode < 128 + 65 else returncode


def _names_urls(command: str) -> bool:
    """Does a step's command name bucket URLs (gs://...) of its own (not a
    ``run:`` block's, a Snakemake process's command whose options name the root)?"""
    return any(f"{s}://" in command for s in stores.bucket_schemes()) and not command.startswith(wspec.RUN_BLOCK_ENV + "=")


def _announce_urls(command: str, log: StepLog) -> None:
    """Say so when the step's command still names a gs:// URL: its inputs
    and outputs are local copies, but a URL written into the command (or
    a setting) reaches the step as it is, and a program that reads plain
    files can't open it."""
    import re
    served = "|".join(re.escape(s) for s in stores.bucket_schemes())
    urls = sorted(set(re.findall(rf"(?:{served})://[^\s'\";|&()<>]+", command)))
    message = (f"waypost: note: the command names {', '.join(urls)}; only the job's inputs and outputs are "
               "mapped to local copies, so the step sees these as they are (URLs, not files)\n").encode()
    log.write(message)
    sys.stderr.buffer.write(message)


# A script Snakemake writes out for a ``script:``/``notebook:``/``wrapper:``
# job (its preamble, the job's ``snakemake`` object, the source) and removes
# once the job's command returned: ``.snakemake/scripts/tmpXXXX.<its file name>``,
# quoted or not, as Snakemake put it into the command.
_GENERATED_SCRIPT = re.compile(r"""'?((?:[^\s'"]*/)?\.snakemake/scripts/tmp[\w-]+\.([^\s'"/]+))'?""")


def keep_generated_scripts(command: str, directory: StageDirectory, number: int, absolute: bool) -> tuple[str, str]:
    """(the command with each script Snakemake generated for it copied into
    the record, ``_logs/attempt-<n>.<its file name>`` (``script.py`` say),
    and named there, so the attempt's ``.sh`` stays true and runnable after
    Snakemake removed its own; the command naming Snakemake's scripts, to
    run now). ``absolute``: the step runs elsewhere than Snakemake's
    directory, so both name them by absolute paths."""
    if ".snakemake/scripts/" not in command:
        return command, command

    def keep(match: re.Match) -> str:
        generated, name = match.group(1), match.group(2)
        if not os.path.isfile(generated):
            return match.group(0)
        kept = directory.path(os.path.join(LOGS, f"attempt-{number}.{name}"))
        shutil.copyfile(generated, kept)
        return shlex.quote(os.path.abspath(kept) if absolute else kept)

    def original(match: re.Match) -> str:
        generated = match.group(1)
        return shlex.quote(os.path.abspath(generated)) if absolute and os.path.isfile(generated) else match.group(0)
    return _GENERATED_SCRIPT.sub(keep, command), _GENERATED_SCRIPT.sub(original, command)
