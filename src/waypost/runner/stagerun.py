"""One series of attempts of one stage: where it begins, each attempt and
the policy's decision after it, and the manifest at its end (see
``waypost.runner`` for the whole)."""

from __future__ import annotations

import os
import sys
import time

from waypost import scheduler as wscheduler
from waypost import stores
from waypost.model import fingerprints, manifest, records, states
from waypost.model import policy as wpolicy
from waypost.model import spec as wspec
from waypost.model.layout import LOGS, RUNNING, stage_root
from waypost.runner.series import CANCELLED, Next, Series
from waypost.runner.stageattempt import StageAttempt
from waypost.runner.stagedir import StageDirectory
from waypost.runner.stageend import SeriesEnd
from waypost.state import leftovers, lifecycle
from waypost.state.parents import parent_state, producer_dir


class LostJob:
    """The executor's ``--lost-job`` mode: a scheduler's job of the stage
    (``scheduler``, by name) ended without a runner recording it (killed
    pending, before or as it started, never startable); record its end, run
    no command."""

    def __init__(self, job: str, state: str, reason: str, last_chance: bool, scheduler: str):
        self.job, self.state, self.reason, self.last_chance = job, state, reason, last_chance
        self.scheduler = wscheduler.by_name(scheduler)

    def ref(self) -> records.JobRef:
        return self.scheduler.name, str(self.job)


class StageRun:
    """One series of attempts of one stage."""

    def __init__(self, step: wspec.StepSpec, lost: LostJob | None = None):
        self.spec = step
        self.lost = lost
        self.directory = StageDirectory(step)
        # The Snakemake run this job is part of (a runner started by hand: a run of its own).
        self.series = Series(os.environ.get(manifest.RUN_ID_ENV) or manifest.new_run_id(), self.spec.rule_retries)
        self.policy = wpolicy.Policy.from_config(step.policy)
        self.received_signal: int | None = None
        self.name = self.directory.name
        # The inputs no stage of the root made (fingerprinted in the
        # manifest), and what size and time said of each as the last attempt began.
        root = stage_root(step.stage_dir, step.instance)
        self.outside = [p for p in step.inputs if fingerprints.outside(p, root)]
        self.outside_seen: dict[str, tuple | None] = {}

    def start(self) -> Next:
        """Begin the series, or go on with one (see ``Series.start``)."""
        return self.series.start(self.directory, self.policy)

    def run_attempt(self, action: str, rerun: str | None = None) -> records.Attempt:
        self.outside_seen = {path: fingerprints.look(path) for path in self.outside}
        attempt = StageAttempt(self.spec, self.policy, self.directory, self.series, action, rerun)
        record = attempt.run()
        self.received_signal = attempt.received_signal
        return record

    def parents_block(self) -> list[str]:
        """Parents whose state the policy's ``depends`` does not accept."""
        blocked = []
        for path in self.directory.inputs:
            state = parent_state(producer_dir(path), path)
            effective = states.SUCCESS if state == states.INPUT_ADOPTED else state
            if effective == states.INPUT_MISSING or not self.policy.accepts(effective):
                blocked.append(f"{os.path.dirname(path)} is {state}")
        return sorted(set(blocked))

    def prepare_workspace(self, action: str, rerun: str | None = None) -> None:
        """The workspace a rerun gets: ``rerun``, the decision's mode (None: the policy's)."""
        if action == "rerun":
            mode = rerun or self.policy.rerun
            if mode == "new":
                self.directory.archive(self.series.history, keep=(LOGS, RUNNING))
            elif mode == "clean":
                self.directory.clean()
        self.directory.workspace.before_attempt()

    def pause(self, seconds: float) -> int | None:
        """Wait ``seconds`` before the next attempt of the series (a cue's
        ``delay``, the policy's ``attempt_delay``). The running marker is
        saved first (the last attempt's decision in it) and its heartbeat
        kept while the runner waits, so nobody takes the stage for
        abandoned. SIGTERM, SIGINT or SIGHUP ends the wait: returns it."""
        import signal

        from waypost.runner.attempt import FORWARDED_SIGNALS, HEARTBEAT_S
        self.directory.save_running(self.series)
        print(f"waypost: {self.name}: waiting {seconds:g} s before the next attempt", file=sys.stderr)
        end = time.monotonic() + seconds
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        try:
            while (left := end - time.monotonic()) > 0:
                got = signal.sigtimedwait(FORWARDED_SIGNALS, min(left, HEARTBEAT_S))
                if got is not None:
                    return got.si_signo
                self.directory.heartbeat()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return None

    def record_lost_job(self) -> int:
        """Record a scheduler's job of this stage whose end no runner recorded: one
        cancelled while pending, killed before or as its runner started, or
        never startable (``--lost-reason``). Its attempt joins the series and
        the policy decides as after any attempt: the series goes on when
        Snakemake submits the stage again, or ends here (its manifest) when
        the policy fails it or Snakemake will not (``--last-chance``).
        A job a runner did record is left to that record (an open attempt is
        closed from the scheduler's word by the next runner, or here on the last chance)."""
        job = self.lost.job
        self.received_signal = None
        live = lifecycle.live_attempt(self.spec.stage_dir)
        if live and live.job != str(job):
            # Another attempt is at work here (a dead driver's job, say): it
            # records its own end; nothing of it is touched.
            print(f"waypost: {self.name}: {self.lost.scheduler.describe(job)} ended; an attempt is at work in {self.directory.dir} "
                  f"({live.where}), left to it", file=sys.stderr)
            return 0
        recorded = self.directory.recorded_job(self.lost.ref())
        if recorded:
            # A runner recorded this job. Its series is either over (its
            # manifest) or left open for the next job (an attempt its scheduler ended,
            # or one that needs a bigger allocation): on the last chance, end it.
            if not self.lost.last_chance or not os.path.exists(self.directory.path(RUNNING)):
                return 0
            started = self.start()
            if started is Next.RECORD:     # its step had succeeded: the series is finished
                return self.finish("SUCCESS")
            if started is not Next.RUN:
                return 0
            return self._decide_and_end(last_chance=True)
        if self.start() is not Next.RUN:      # done, decided, given up, on hold: nothing of ours to add
            return 0
        series = self.series.attempts
        action = series[-1]["decision"]["action"] if series and series[-1].get("decision") \
            else self.series.first[0]
        now = manifest.now_iso()
        reason = self.lost.reason or f"the {self.lost.scheduler.label} job ended before its step runner started"
        record = records.attempt(
            number=len(self.series.history) + 1, series=self.series.number, action=action, state=self.lost.state,
            start=now, end=now, duration_s=0.0, host=None, run=self.series.run_id, job=self.lost.ref(),
            command=self.spec.command, worker={"pool": self.spec.pool, "class": self.spec.worker_class},
            error=f"{self.lost.scheduler.describe(job)} ended {self.lost.state} before its step ran: {reason}",
            why=self.series.first[1] if len(series) == 0 else None)
        self.series.history.append(record)
        series.append(record)
        return self._decide_and_end(last_chance=self.lost.last_chance, why=record["error"])

    def _decide_and_end(self, last_chance: bool, why: str | None = None) -> int:
        series = self.series.attempts
        made = wpolicy.decision(self.policy, series)
        action, reason = made["action"], made["reason"]
        if action in ("cmd", "restart", "rerun") and last_chance:
            action, reason = "fail", f"{reason}, but Snakemake's retries of this job are spent"
            made = {"action": action, "reason": reason}
        series[-1]["decision"] = made
        ran_in = wscheduler.for_record(series[-1])
        print(f"waypost: {self.name} attempt {series[-1]['number']} ended {series[-1]['state']} "
              f"({ran_in[0].describe(ran_in[1]) if ran_in else 'no job'}); next: {action} ({reason})",
              file=sys.stderr)
        if action in ("cmd", "restart", "rerun"):
            # the job Snakemake submits next goes on with the series
            self.directory.save_running(self.series, lost_job=records.job_of(series[-1]))
            if self.directory.remote:
                self.directory.remote.close()
            return 0
        last = series[-1]["state"]
        return self.finish("FAILED" if last == "SUCCESS" else last, reason=why,
                           give_up=reason if action == "give_up" else None, stop=reason if action == "stop" else None)

    def run(self) -> int:
        self.received_signal = None
        if self.lost:
            return self.record_lost_job()
        if self.directory.remote:
            self.directory.remote.pull(self.directory.inputs)
        ended = self._after_a_live_attempt()
        if ended is not None:
            return ended
        started = self.start()
        if started is not Next.RUN:
            return self._not_run(started)
        self.directory.workspace.before_step()
        series = self.series.attempts
        if not series:
            blocked = self.parents_block()
            if blocked:
                return self.finish("SKIPPED", reason="parents not accepted by depends "
                                   f"({self.policy.depends}): " + "; ".join(blocked))
            made = {"action": self.series.first.action, "rerun": self.series.first.rerun}
        elif series[-1].get("interrupted_by"):   # its runner vanished, or a cancel: the series goes on in place
            made = series[-1]["decision"]
        elif self.series.retried_by_snakemake:
            made = {"action": "cmd", "reason": self.series.retried_by_snakemake}
        else:
            made = series[-1]["decision"] = wpolicy.decision(self.policy, series)
        return self._attempts(made)

    def _after_a_live_attempt(self) -> int | None:
        """One live attempt per stage directory, whoever started it (a run
        whose driver died leaves its jobs at work): wait for it to end, as
        if this job were it, then go on from what it left (None); what a
        step whose runner is gone left at work is ended (``leftovers``).
        An exit status when this job ends here."""
        directory, stage_dir = self.directory, self.spec.stage_dir
        # (On a bucket root ``pull`` just fetched the marker: without one
        # there, there is nothing to ask the bucket about.)
        live = None if directory.remote and not os.path.exists(directory.path(RUNNING)) else \
            lifecycle.live_attempt(stage_dir, me=os.getpid())
        if live and live.unknown:
            # Whether it is still at work can't be known (another host, sacct
            # silent): never taken for gone, nor waited on for a lease.
            print(f"waypost: {self.name}: an attempt may still be at work in {stage_dir} "
                  f"({live.where}); not starting a second one", file=sys.stderr)
            return 75
        waited = live and lifecycle.wait_until_gone(
            stage_dir, me=os.getpid(),
            say=lambda live: print(f"waypost: {self.name}: an attempt is at work in {stage_dir} "
                                   f"({live.where}); waiting for it to end instead of starting a second one",
                                   file=sys.stderr))
        if live:
            self.series.leftover = leftovers.end(lifecycle.at(stage_dir, me=os.getpid()), directory.dir)
            if self.series.leftover:
                print(f"waypost: {self.name}: {self.series.leftover}", file=sys.stderr)
        if waited and directory.remote:
            directory.remote.refresh()     # what it left
        elif not directory.remote:
            stores.catch_up(stage_dir)     # (on a bucket mount: what another node left, listed here too)
        if waited and directory.done():
            print(f"waypost: {self.name}: done by the attempt waited for ({waited.where})", file=sys.stderr)
            return 0
        return None

    def _not_run(self, started: Next) -> int:
        """What this job does when ``Series.start`` says no attempt runs (the table in series.py)."""
        if started is Next.DONE:
            print(f"waypost: {self.name}: already done (its job was ended after the step finished)",
                  file=sys.stderr)
            return 0
        if started in (Next.GIVEN_UP, Next.BACKOFF):
            print(f"waypost: {self.name}: {self.series.refusal}; not started"
                  + ("; `waypost retry` or `waypost rerun` to try again" if started is Next.GIVEN_UP else ""),
                  file=sys.stderr)
            if self.spec.tolerated:   # a funnel goes on over it, as when it ended
                self.directory.placeholders()
                return 0
            return 1
        if started is Next.RECORD:
            return self.finish(self.series.attempts[-1]["state"] or "CANCELLED")
        print(f"waypost: {self.name}: the policy already ended this stage "
              "(Snakemake retried the job); not starting again", file=sys.stderr)   # Next.DECIDED
        previous = manifest.read(self.directory.dir)
        last = previous["attempts"][-1] if previous["attempts"] else {}
        return last.get("exit_code") or 1

    def _attempts(self, made: dict) -> int:
        """Run the series' attempts from the decision ``made`` until one
        ends it (``done``, ``fail``, ``give_up``) or this job must leave it
        to the next one."""
        series = self.series.attempts
        action, reason = made["action"], made.get("reason")
        while action in ("cmd", "restart", "rerun"):
            stopped = self.pause(made["delay_s"]) if made.get("delay_s") else None
            if stopped is not None:
                return self._stopped_waiting(stopped, made["delay_s"])
            self.prepare_workspace(action, made.get("rerun"))
            record = self.run_attempt(action, made.get("rerun"))
            ending = wscheduler.current()
            if self.received_signal is not None and ending:
                return self._ended_by_scheduler(record, ending)
            if self.received_signal is not None:
                return self._cancelled(record)
            made = wpolicy.decision(self.policy, series)
            record["decision"] = made
            action, reason = made["action"], made["reason"]
            print(f"waypost: {self.name}: next: {action} ({reason})", file=sys.stderr)
            if action == "done":
                # Before hashing the outputs and writing the manifest: a job
                # ended meanwhile (its time limit) leaves a series the next
                # runner finishes instead of running the step again.
                self.directory.save_running(self.series, push=False)
            if record["state"] == "OOM" and action in ("restart", "rerun") and ending \
                    and self.policy.memory_growth > 1:
                return self._out_of_memory(ending)
        last = series[-1]["state"]
        final = "SUCCESS" if action == "done" else ("FAILED" if last == "SUCCESS" else last)
        return self.finish(final, give_up=reason if action == "give_up" else None,
                           stop=reason if action == "stop" else None)

    def _cancelled(self, record: records.Attempt) -> int:
        """The attempt was cancelled from outside (Ctrl-C in the driver's
        terminal, a SIGTERM): not the step's failure. Recorded CANCELLED;
        with ``cancelled: resume`` (the default) the attempt is not counted
        and the next run goes on with the series in place, from what the
        step left (``goes_on``); with ``end`` the series ends."""
        if self.policy.cancelled == "end":
            record["decision"] = {"action": "fail", "reason": "cancelled from outside"}
            print(f"waypost: {self.name}: next: fail (cancelled from outside)", file=sys.stderr)
            return self.finish("FAILED" if record["state"] == "SUCCESS" else record["state"])
        why = "cancelled from outside: not the step's failure; the next run goes on with this series in place"
        record["interrupted_by"] = CANCELLED
        record["decision"] = {"action": "restart", "reason": why}
        print(f"waypost: {self.name}: {why}", file=sys.stderr)
        return self.finish("CANCELLED", goes_on={"series": self.series.number, "action": "restart", "reason": why})

    def _ended_by_scheduler(self, record: records.Attempt, ending) -> int:
        """A scheduler (Slurm) signals a job it ends for any reason (time
        limit, preemption, scancel): the next runner asks it which, and the
        policy decides then. Leave the attempt open."""
        record["state"] = None
        record["error"] = f"signal {self.received_signal} from {ending.label}; {ending.accounting} will say why"
        self.directory.save_running(self.series)
        print(f"waypost: {self.name}: {ending.label} is ending this job; "
              f"the next attempt learns why from {ending.accounting}", file=sys.stderr)
        return 128 + self.received_signal

    def _out_of_memory(self, ending) -> int:
        """This allocation is too small: the next job, with memory_growth
        more, goes on with the series."""
        self.directory.save_running(self.series)
        print(f"waypost: {self.name}: out of memory in {ending.describe(ending.job_in_env())}; "
              "the next job (with more memory) goes on", file=sys.stderr)
        return 1

    def _stopped_waiting(self, signum: int, delay: float) -> int:
        """A signal ended the wait before the next attempt. Under Slurm
        (which signals a job it ends) the series is left for the next job,
        as after an attempt Slurm ended; else it was cancelled from outside,
        and the series ends as the last attempt did."""
        self.received_signal = signum
        ending = wscheduler.current()
        if ending:
            print(f"waypost: {self.name}: {ending.label} is ending this job during the wait; the next job goes on",
                  file=sys.stderr)
            return 128 + signum
        last = self.series.attempts[-1]
        during = f"cancelled from outside during the {delay:g} s wait before the next attempt"
        if self.policy.cancelled == "resume" and last["decision"]["action"] in ("restart", "rerun"):
            pending = last["decision"]
            why = f"{during}; the next run goes on with this series: {pending['action']} ({pending['reason']})"
            print(f"waypost: {self.name}: {why}", file=sys.stderr)
            return self.finish("CANCELLED", goes_on={"series": self.series.number, "action": pending["action"],
                                                     "rerun": pending.get("rerun"), "reason": why})
        last["decision"] = {"action": "fail", "reason": during}
        print(f"waypost: {self.name}: next: fail ({last['decision']['reason']})", file=sys.stderr)
        return self.finish("FAILED" if last["state"] == "SUCCESS" else last["state"])

    def finish(self, state: str, reason: str | None = None, give_up: str | None = None,
               goes_on: dict | None = None, stop: str | None = None) -> int:
        """Write the manifest (last): the series ended ``state`` (see
        ``SeriesEnd.write``); the job's exit status."""
        end = SeriesEnd(self.spec, self.directory, self.series, self.policy, self.outside, self.outside_seen,
                        self.received_signal)
        return end.write(state, reason, give_up, goes_on, stop)
