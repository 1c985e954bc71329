"""A stage's attempts as one runner holds them: every attempt so far, the
series this runner goes on with, and how that series begins (from what the
last runner left in the stage directory).

The runner's state machine, as one table. ``Series.start`` reads the stage
directory and says what comes ``Next`` (the first row that matches);
``StageRun.run`` does it; within a series, each attempt's decision
(``policy.decision``) says what follows it.

=============================================  ==========  ==========================================
the stage directory holds                      ``Next``    what ``StageRun.run`` does
=============================================  ==========  ==========================================
a running marker (its runner was killed;       RECORD      the manifest of that series (``finish``)
its open attempts are closed): the last
decision ``done`` and the outputs there

... its runner vanished (no word from Slurm,   RUN         the same series goes on in place (restart
no signal) and ``runner_gone: resume``                     when there is work, else cmd)

... Snakemake retried the job (same run)       RUN         the same series goes on, as its last
                                                           decision said

a manifest this very run wrote, not SUCCESS    DECIDED     the policy's decision stands: the last
(Snakemake retried the job)                                attempt's exit code

a manifest this run wrote whose outputs are    DONE        nothing: exit 0
there (Slurm ended the job after the step)

a manifest of a series cancelled from         RUN         the same series goes on in place (restart
outside (``goes_on``; ``cancelled: resume``)               when there is work, else cmd; or the
                                                           restart or rerun a cancelled wait was for)

an unfinished series (a manifest not          GIVEN_UP    nothing runs; exit 1 (0 and placeholders
SUCCESS, no marker) marked ``given_up``                    when a funnel tolerates it)
(``waypost retry`` clears it), or with its
``max_series`` spent

... ``max_series`` spent, a marker left        RECORD      the manifest of that series

... its ``next_series_after`` not yet come     BACKOFF     as GIVEN_UP, until that time

... else                                       RUN         a new series, as ``policy.begin_series``
                                                           says over it (cmd, restart or rerun)

nothing, or a SUCCESS manifest (redone)        RUN         a new series: cmd
=============================================  ==========  ==========================================

An attempt's decision, in the series ``RUN`` goes on with:

==================  ===========================================================
decision            what follows
==================  ===========================================================
cmd/restart/rerun   the next attempt of the series (after ``delay_s``; under
                    Slurm an OOM with ``memory_growth`` leaves it to the next,
                    bigger job, and a signal from Slurm leaves the attempt
                    open for the next job, which asks sacct why)
done                the manifest: SUCCESS
fail                the manifest: the last attempt's state (the series ends)
give_up             as fail, and the stage is given up (``given_up``)
stop                as fail, and the run starts no new job (``stopped_run``;
                    the driver stops: ``wiring.triggers.stop_on_request``)
==================  ===========================================================
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from enum import Enum

from waypost import scheduler
from waypost.model import manifest, records
from waypost.model import policy as wpolicy
from waypost.runner.stagedir import StageDirectory


class Next(Enum):
    """What ``Series.start`` found comes next (the table above)."""
    RUN = "run"              # an attempt of the series (``Series.first``: with what and why)
    RECORD = "record"        # a killed runner's series was the last: record it
    DECIDED = "decided"      # the policy already ended this series (Snakemake retried the job)
    DONE = "done"            # the retried job's work had succeeded after all
    GIVEN_UP = "given up"    # ``max_series`` spent or given up (``Series.refusal`` says why)
    BACKOFF = "backoff"      # the next series may not start yet (``Series.refusal`` says when)


# ``Series._after_a_killed_runner``, ``Series._after_a_manifest``: neither
# recorded nor gone on: a new series.
_NEW_SERIES = "new series"


class Series:
    """The attempts of one stage and the series under way."""

    def __init__(self, run_id: str, rule_retries: int = 0):
        # The Snakemake run this job is part of.
        self.run_id = run_id
        # The rule's own ``retries:``: a retry in this run is one more attempt.
        self.rule_retries = rule_retries
        self.retried_by_snakemake: str | None = None   # why this job goes on with an ended series
        self.history: list[records.Attempt] = []   # every attempt ever, this series last
        self.number = 1
        self.attempts: list[records.Attempt] = []   # this series'
        self.base = 0                   # series before the last reset (waypost retry) don't count
        self.previous_settings: dict | None = None   # the last manifest's settings (see diffs.resumed_work)
        self.first = wpolicy.Start("cmd", "a first series", None)   # this series' first action, why, workspace
        self.refusal = ""
        self.leftover: str | None = None   # what was done of the step a killed runner left at work

    def _go_on_with(self, number: int) -> None:
        self.number = number
        self.attempts = [a for a in self.history if a.get("series") == number]

    def start(self, directory: StageDirectory, policy: wpolicy.Policy) -> Next:
        """Begin a new series, or go on with one whose runner was killed:
        what comes next (the module's table). ``Next.RUN``: ``self.first``
        says with what and why."""
        os.makedirs(directory.dir, exist_ok=True)
        life = directory.life()
        found = self._start(directory, policy, life)
        directory.workspace.learn_side_files(self.history, life.manifest)
        return found

    def _start(self, directory: StageDirectory, policy: wpolicy.Policy, life) -> Next:
        running = life.marker or None
        previous = life.manifest
        retried = self._read_last_record(directory, life, running, previous)
        if running:
            found = self._after_a_killed_runner(directory, policy, life, running, retried)
        elif previous:
            found = self._after_a_manifest(directory, policy, life, previous, retried)
        else:
            found = _NEW_SERIES
        if found is not _NEW_SERIES:
            return found
        return self._begin(directory, policy, running, previous, retried)

    def _read_last_record(self, directory: StageDirectory, life, running: dict | None,
                          previous: records.Manifest | None) -> bool:
        """Take what the last runner left (its settings, the series not
        counted since a reset) and say whether this job is Snakemake
        retrying it within the same run (Slurm ended the last job, or the
        policy had ended the series), not a new run."""
        # What the work in the workspace was made under, for attempts that recorded none of their own.
        self.previous_settings = (previous or {}).get("settings")
        if life.error:
            print(f"waypost: {life.error}; archiving it with the old workspace", file=sys.stderr)
        self.base = (previous or {}).get("series_base", 0)
        retried = (running or previous or {}).get("run") == self.run_id
        if retried and directory.remote:
            directory.remote.pull_workspace()   # only the engine's files were fetched
        return retried

    def _after_a_manifest(self, directory: StageDirectory, policy: wpolicy.Policy, life,
                          previous: records.Manifest, retried: bool) -> Next | str:
        """The last runner recorded its series (no running marker): what
        comes next when that series stands or goes on, else
        ``_NEW_SERIES`` (its attempts in ``self.history``)."""
        if retried and previous["state"] != "SUCCESS":
            return self._retried_by_snakemake(previous) if self.rule_retries else Next.DECIDED
        if retried and not manifest.verify_outputs(directory.dir, previous, checksums=False):
            return Next.DONE  # the step had finished when Slurm ended the job
        if previous.get("goes_on") and policy.cancelled == "resume":
            return self._after_a_cancel(directory, life, previous)
        self.history = list(previous["attempts"])
        if not self.history:
            directory.workspace.set_aside_record_without_attempts(previous)
        return _NEW_SERIES

    def _after_a_cancel(self, directory: StageDirectory, life, previous: records.Manifest) -> Next:
        """The last series was cancelled from outside (``goes_on``): it goes
        on in place, as its record says (a restart, the step's command when
        nothing of it is left), that cancel not counted."""
        self.history = list(previous["attempts"])
        goes_on = previous["goes_on"]
        self._go_on_with(goes_on["series"])
        action = goes_on["action"]
        if action == "restart" and not life.has_files():
            action = "cmd"
        self.first = wpolicy.Start(action, goes_on["reason"], goes_on.get("rerun"))
        if self.attempts and self.attempts[-1].get("interrupted_by") == CANCELLED:
            self.attempts[-1]["decision"] = {"action": action, "reason": goes_on["reason"]}
        if directory.remote:
            directory.remote.pull_workspace()   # the series goes on in it: checkpoints and all
        print(f"waypost: {directory.name}: series {self.number} goes on with {action}: {goes_on['reason']}",
              file=sys.stderr)
        return Next.RUN

    def _retried_by_snakemake(self, previous: records.Manifest) -> Next:
        """The rule's own ``retries:`` made Snakemake run the job again after
        this run's policy ended its series: as without waypost, it runs
        again, one more attempt of that series (in place: its declared
        outputs removed, what else it wrote kept)."""
        self.history = list(previous["attempts"])
        self._go_on_with(max((a.get("series", 1) for a in self.history), default=1))
        self.retried_by_snakemake = (f"the rule's retries: {self.rule_retries}: Snakemake runs the failed job "
                                     "again, as without waypost")
        return Next.RUN

    def _after_a_killed_runner(self, directory: StageDirectory, policy: wpolicy.Policy, life, running: dict,
                               retried: bool) -> Next | str:
        """The runner before us was killed mid-attempt (by Slurm at its time
        limit, by preemption, with its node, or with Snakemake): its open
        attempts closed, ``Next.RECORD`` when its series is finished after
        all, ``Next.RUN`` when that series goes on, else ``_NEW_SERIES``."""
        self.history = running.get("attempts", [])
        self.base = running.get("series_base", self.base)
        left_open = [a for a in self.history if a.get("state") is None]
        vanished = False
        for attempt in left_open:   # the last is the one whose step may have been found at work
            vanished = close_interrupted(attempt, self.leftover if attempt is left_open[-1] else None,
                                         directory.last_heard(attempt))
        if left_open:
            directory.workspace.vanished_attempt(running, left_open[-1])
        last = self.history[-1] if self.history else {}
        if (last.get("decision") or {}).get("action") == "done" and all(map(os.path.exists, directory.outputs)):
            # Its step had succeeded; the job ended while its manifest was
            # being written: the series is finished, not run again.
            self._go_on_with(running.get("series", 1))
            return Next.RECORD
        if vanished and self._resume_in_place(policy, life.has_files(), running.get("series", 1)):
            if directory.remote and not retried:
                directory.remote.pull_workspace()   # checkpoints and all
            print(f"waypost: {directory.name}: series {self.number} goes on with {self.first[0]}: "
                  f"{self.first[1]}", file=sys.stderr)
            return Next.RUN
        if retried:   # the same series goes on
            self._go_on_with(running.get("series", 1))
            return Next.RUN
        return _NEW_SERIES

    def _begin(self, directory: StageDirectory, policy: wpolicy.Policy, running: dict | None,
               previous: records.Manifest | None, retried: bool) -> Next:
        """Begin the next series, as the policy says over the last one when
        that one is unfinished (``Next.RUN``); or say why none may begin
        (``GIVEN_UP``, ``BACKOFF``, ``RECORD``)."""
        last_no = max((a.get("series", 1) for a in self.history), default=0)
        last_series = [a for a in self.history if a.get("series", 1) == last_no]
        # Series up to the last that succeeded don't count towards max_series:
        # a stage redone after a success (its output deleted) starts afresh.
        self.base = max(self.base, max((a.get("series", 1) for a in self.history
                                        if (a.get("decision") or {}).get("action") == "done"), default=0))
        unfinished = bool(last_series) and (running is not None or previous is None
                                            or previous["state"] != "SUCCESS")
        if unfinished:
            refused = self._refused(policy, running, previous, last_no, last_series)
            if refused:
                return refused
        self.number = 1 + last_no
        self.first = wpolicy.begin_series(policy, last_series if unfinished else [])
        if self.first[0] == "cmd" and directory.workspace.archived_as_series_starts:
            directory.archive(self.history)
        elif unfinished:
            if directory.remote and not retried and (self.first[0] == "restart" or self.first.rerun != "new"):
                directory.remote.pull_workspace()   # the series goes on in it: checkpoints and all
            print(f"waypost: {directory.name}: series {self.number} starts with {self.first[0]}: {self.first[1]}",
                  file=sys.stderr)
        return Next.RUN

    def _refused(self, policy: wpolicy.Policy, running: dict | None, previous: records.Manifest | None,
                 last_no: int, last_series: list[records.Attempt]) -> Next | None:
        """Why no series may follow the unfinished one ``last_no``:
        ``GIVEN_UP`` (``self.refusal`` says why), ``BACKOFF``, or ``RECORD``
        (a killed runner's series was the last: record it so); None when one
        may."""
        spent = last_no - self.base
        if previous is not None and previous.get("given_up") and not running:
            self.refusal = previous.get("reason") or f"given up after {spent} series"
            return Next.GIVEN_UP
        if spent >= policy.max_series:
            if running:
                self.number, self.attempts = last_no, last_series
                return Next.RECORD
            self.refusal = f"given up after {spent} series (max_series {policy.max_series})"
            return Next.GIVEN_UP
        not_before = (previous or {}).get("next_series_after") if not running else None
        if not_before and manifest.iso_to_epoch(not_before) > time.time():
            self.refusal = (f"series {last_no} ended {last_series[-1].get('state')}; the next may start "
                            f"from {not_before} (series_backoff)")
            return Next.BACKOFF
        return None


    def _resume_in_place(self, policy: wpolicy.Policy, has_work: bool, number: int) -> bool:
        """The last attempt's runner vanished (``close_interrupted``): does
        the same series go on in place (``runner_gone: resume``, and at
        most ``RUNNER_GONE_LIMIT`` such attempts in a row)? If so,
        ``self.first`` says with what: ``restart`` (the policy's restart
        command) when the workspace holds work of the step, else ``cmd``.
        The vanished attempt is marked ``interrupted_by``, its decision
        says why, and it counts for nothing (``policy.counters``)."""
        attempts = [a for a in self.history if a.get("series", 1) == number]
        before = sum(1 for _ in itertools.takewhile(runner_gone, reversed(attempts[:-1])))
        if policy.runner_gone != "resume" or not attempts or before >= RUNNER_GONE_LIMIT:
            return False
        self._go_on_with(number)
        vanished = attempts[-1]
        action = "restart" if has_work else "cmd"
        why = (f"attempt {vanished['number']}'s runner was gone (its driver killed, its machine restarted): "
               f"not the step's failure; series {number} goes on in place "
               + ("with the work it left" if has_work else "(nothing left to resume)"))
        vanished["interrupted_by"] = RUNNER_GONE
        vanished["decision"] = {"action": action, "reason": why}
        self.first = wpolicy.Start(action, why, None)
        return True


# Attempts in a row whose runner vanished that a series goes on after
# (``runner_gone: resume``); the next one ends the series CANCELLED, as a
# cancel does: a step that kills its own runner can't loop forever.
RUNNER_GONE_LIMIT = 3
RUNNER_GONE = "runner gone"
# An attempt cancelled from outside (Ctrl-C, a SIGTERM) whose series the next
# run goes on with in place (``cancelled: resume``); not counted either.
CANCELLED = "cancelled"


def runner_gone(attempt: dict) -> bool:
    """Was this attempt's runner gone, and its series went on after it in
    place (not counted: ``policy.counters``)?"""
    return attempt.get("interrupted_by") == RUNNER_GONE


def close_interrupted(attempt: records.Attempt, leftover: str | None = None,
                      last_heard: float | None = None) -> bool:
    """Fill in how an attempt whose runner died ended: its scheduler's word
    when it ran in a scheduler's job (Slurm's: sacct), else CANCELLED
    (stopped from outside). ``leftover``: what was done of its step, found
    at work without it. ``last_heard``: when it was last seen at work (its
    log, its heartbeat): its end and its duration, where it has none.

    True when, with no word from the scheduler nor from its runner (which
    records a signal it was sent), the runner vanished: its driver was
    killed, its machine restarted, something SIGKILLed it. That was not the
    step's failure (see ``Series._resume_in_place``)."""
    state, detail, label = None, None, None
    ran_in = scheduler.for_record(attempt)
    if ran_in:
        state, detail = ran_in[0].final_state(ran_in[1])
        label = ran_in[0].label
    vanished = state is None and not attempt.get("error")
    if attempt.get("duration_s") is None and last_heard is not None and attempt.get("start"):
        started = manifest.iso_to_epoch(attempt["start"])
        attempt["duration_s"] = round(max(0.0, last_heard - started), 3)
        attempt["end"] = attempt.get("end") or manifest.epoch_to_iso(max(last_heard, started))
    attempt.update({"state": state or "CANCELLED", "end": attempt.get("end") or manifest.now_iso(),
                    "error": (attempt.get("error") or "the runner was killed during this attempt")
                    + (f" ({label}: {detail})" if detail else "")
                    + (f"; {leftover}" if leftover else "")})
    return vanished

