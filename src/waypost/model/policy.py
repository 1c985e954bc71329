"""Control policy: what the next attempt of a stage does, given its history.

A policy (``policy:`` in the config, per stage, overridable per experiment
and pair) holds:

- ``max_attempts``: attempts of the work (cmd, restart or rerun) in one series;
- ``max_series``: series a stage gets across runs (each run that finds the
  stage unfinished starts one); after the last it is *given up*, and no run
  starts another until a person acts (``waypost retry`` or ``waypost rerun``);
- ``series_backoff`` (minutes) and ``series_backoff_growth``: the wait after
  a failed series before the next may start (× growth per further series);
- ``restart``: ``same`` (run the step's command again in the same workspace:
  for steps that resume from their own checkpoints) or a shell command;
- ``rerun``: the workspace a rerun gets: ``dirty`` (as is), ``clean`` (the
  failed attempts' files removed; logs and history kept) or ``new`` (the
  workspace archived under ``.attempts/<n>/``, the canonical path reused);
  a cue's own ``rerun`` overrides it for that cue's decision;
- ``attempt_delay`` (seconds): the wait before the next attempt of a series
  (a restart or rerun); a cue's own ``delay`` overrides it. The runner waits,
  its heartbeat going on; no wait follows the last attempt;
- ``checks``: name → shell command, run after every attempt; exit 0 makes the
  check SUCCESS, anything else FAILED (TIMEOUT past ``check_timeout``);
- ``cues``: ordered ``{action: restart|rerun|fail|give_up|stop, when: CONDITION}``
  (and, for restart and rerun, ``delay``; for rerun, ``rerun``);
  the first whose condition holds decides. ``fail`` ends the series (the next
  run starts another, up to ``max_series``); ``give_up`` ends it for good: the
  stage is given up at once, and no run starts another series until
  ``waypost retry`` (a check that knows a point is hopeless); ``stop`` ends
  it as ``fail`` does and stops the whole run: no new job starts in it, the
  running ones finish (Merlin's ``STOP_WORKERS``, ``HARD_FAIL``). With none
  matching, a SUCCESS attempt is done and anything else fails the stage;
- ``depends``: which parent states this stage accepts (``all_success``,
  ``all_done`` or a condition over ``parent.STATE``), checked per parent;
- ``runtime`` (minutes, per attempt; grows by ``runtime_growth``) and
  ``kill_grace`` (seconds between SIGTERM and SIGKILL on timeout);
- ``runner_gone``: what an attempt whose runner vanished without recording
  its end (its driver killed, its machine restarted) does to its series:
  ``resume`` (the same series goes on in place, that attempt not counted:
  ``series.Series._resume_in_place``) or ``cancel`` (it ends the series as
  CANCELLED, as a cancel does; the next run begins a series by the cues);
- ``cancelled``: what an attempt cancelled from outside does to its series
  (Ctrl-C in the driver's terminal, a SIGTERM to the runner or its step,
  not the scheduler's end of the job): ``resume`` (recorded ``CANCELLED``;
  the next run goes on with the same series in place, from the step's
  checkpoints, that attempt not counted, and no stage is given up for it)
  or ``end`` (it ends the series as ``CANCELLED``, counted toward
  ``max_series``);
- ``workdir``: where the step runs: ``workflow`` (Snakemake's working
  directory, as every Snakemake job) or ``stage`` (its stage directory, a
  workspace of its own per point as in Maestro and Merlin; the job's files
  are then given to its command as absolute paths: ``planning.wiring.steps``).
"""

from __future__ import annotations

from collections import namedtuple

from waypost.model import conditions
from waypost.model.errors import WaypostError

ACTIONS = ("restart", "rerun", "fail", "give_up", "stop")
RERUN_MODES = ("dirty", "clean", "new")
RUNNER_GONE_MODES = ("resume", "cancel")
CANCELLED_MODES = ("resume", "end")
WORKDIRS = ("workflow", "stage")
DEPENDS_PRESETS = {
    "all_success": "parent.SUCCESS",
    "all_done": "parent.*",
}
DEFAULTS = {
    "max_attempts": 1,
    "max_series": 3,
    "series_backoff": 0,
    "series_backoff_growth": 2.0,
    "restart": "same",
    "rerun": "new",
    "attempt_delay": 0,
    "checks": {},
    "cues": [],
    "depends": "all_success",
    "runtime": None,
    "runtime_growth": 1.0,
    "memory_growth": 1.0,
    "kill_grace": 10,
    "check_timeout": 60,
    "runner_gone": "resume",
    "cancelled": "resume",
    "workdir": "workflow",
}


class PolicyError(WaypostError, ValueError):
    pass


# Named tuples, not dataclasses: the step runner imports this module at every
# start, and dataclasses cost it ~10 ms.
# A cue's ``rerun`` (workspace mode) and ``delay`` (seconds): None, the policy's.
Cue = namedtuple("Cue", "action when node rerun delay", defaults=(None, None))


class Policy(namedtuple("Policy", ["max_attempts", "max_series", "series_backoff", "series_backoff_growth",
                                   "restart", "rerun", "checks", "cues", "depends", "depends_node",
                                   "runtime", "runtime_growth", "memory_growth", "kill_grace", "check_timeout",
                                   "runner_gone", "workdir", "attempt_delay", "cancelled"])):
    """A validated policy (build it with ``from_config``); ``DEFAULTS`` has
    each key's default."""
    __slots__ = ()

    @classmethod
    def from_config(cls, raw: dict | None) -> Policy:
        """Build and validate; PolicyError names the key and the text."""
        try:
            return cls._from_config({**DEFAULTS, **(raw or {})})
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PolicyError):
                raise
            raise PolicyError(f"malformed policy ({exc.__class__.__name__}: {exc})") from None

    @classmethod
    def _from_config(cls, data: dict) -> Policy:
        if int(data["max_attempts"]) < 1:
            raise PolicyError(f"max_attempts: {data['max_attempts']!r} (expected at least 1)")
        if int(data["max_series"]) < 1:
            raise PolicyError(f"max_series: {data['max_series']!r} (expected at least 1)")
        if float(data["series_backoff"]) < 0 or float(data["series_backoff_growth"]) < 1:
            raise PolicyError(f"series_backoff: {data['series_backoff']!r}, series_backoff_growth: "
                              f"{data['series_backoff_growth']!r} (expected at least 0 and 1)")
        subjects = {"cmd", *data["checks"]}
        if "cmd" in data["checks"]:
            raise PolicyError("checks: 'cmd' is reserved for the step itself")
        cues = [_cue(i, cue, subjects) for i, cue in enumerate(data["cues"])]
        if data["rerun"] not in RERUN_MODES:
            raise PolicyError(f"rerun: {data['rerun']!r} is not one of: {', '.join(RERUN_MODES)}")
        if data["runner_gone"] not in RUNNER_GONE_MODES:
            raise PolicyError(f"runner_gone: {data['runner_gone']!r} is not one of: {', '.join(RUNNER_GONE_MODES)}")
        if data["cancelled"] not in CANCELLED_MODES:
            raise PolicyError(f"cancelled: {data['cancelled']!r} is not one of: {', '.join(CANCELLED_MODES)}")
        if data["workdir"] not in WORKDIRS:
            raise PolicyError(f"workdir: {data['workdir']!r} is not one of: {', '.join(WORKDIRS)}")
        attempt_delay = _seconds("attempt_delay", data["attempt_delay"])
        depends_text = DEPENDS_PRESETS.get(data["depends"], data["depends"])
        try:
            depends_node = conditions.validate(depends_text, {"parent"}, counters=False)
        except conditions.ConditionError as exc:
            raise PolicyError(f"depends: {data['depends']!r}: {exc} "
                              f"(or a preset: {', '.join(DEPENDS_PRESETS)})") from None
        return cls(max_attempts=int(data["max_attempts"]), max_series=int(data["max_series"]),
                   series_backoff=float(data["series_backoff"]),
                   series_backoff_growth=float(data["series_backoff_growth"]), restart=data["restart"], rerun=data["rerun"],
                   checks=dict(data["checks"]), cues=cues, depends=data["depends"], depends_node=depends_node,
                   runtime=None if data["runtime"] is None else float(data["runtime"]),
                   runtime_growth=float(data["runtime_growth"]),
                   memory_growth=float(data["memory_growth"]),
                   kill_grace=float(data["kill_grace"]), check_timeout=float(data["check_timeout"]),
                   runner_gone=data["runner_gone"], workdir=data["workdir"], attempt_delay=attempt_delay,
                   cancelled=data["cancelled"])

    def goes_on_in_workspace(self, action: str, rerun: str | None = None) -> bool:
        """Does an attempt that begins with ``action`` go on with the work
        the last one left (a restart in place, a rerun in the workspace as
        it is), rather than start from nothing? ``rerun``: the workspace
        mode of the decision (None: the policy's)."""
        return action == "restart" or (action == "rerun" and (rerun or self.rerun) == "dirty")

    @property
    def tolerates_failure(self) -> bool:
        """Does this stage run when a parent did not succeed?"""
        return any(conditions.evaluate(self.depends_node, {"parent": state})
                   for state in conditions.STATES if state != "SUCCESS")

    def runtime_seconds(self, attempt: int) -> float | None:
        """The time limit of attempt ``attempt`` (1-based) of a series."""
        if self.runtime is None:
            return None
        return self.runtime * 60 * self.runtime_growth ** (attempt - 1)

    def backoff_seconds(self, spent: int) -> float:
        """The wait before the next series, after ``spent`` failed ones."""
        return self.series_backoff * 60 * self.series_backoff_growth ** max(spent - 1, 0)

    def accepts(self, parent_state: str) -> bool:
        return conditions.evaluate(self.depends_node, {"parent": parent_state})


def _seconds(key: str, value) -> float:
    """A delay in seconds: a number, at least 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise PolicyError(f"{key}: {value!r} (expected seconds: a number, at least 0)")
    return float(value)


def _cue(i: int, cue: dict, subjects: set[str]) -> Cue:
    """One validated cue (``cues[i]``)."""
    if not isinstance(cue, dict):
        raise PolicyError(f"cues[{i}]: {cue!r} (expected a mapping: action, when)")
    unknown = sorted(set(cue) - {"action", "when", "rerun", "delay"})
    if unknown:
        raise PolicyError(f"cues[{i}]: unknown key {unknown[0]!r} (a cue has: action, when, rerun, delay)")
    action = cue.get("action")
    if action not in ACTIONS:
        raise PolicyError(f"cues[{i}].action: {action!r} is not one of: {', '.join(ACTIONS)}")
    try:
        node = conditions.validate(cue["when"], subjects)
    except conditions.ConditionError as exc:
        raise PolicyError(f"cues[{i}].when: {cue['when']!r}: {exc}") from None
    rerun, delay = cue.get("rerun"), cue.get("delay")
    if rerun is not None:
        if action != "rerun":
            raise PolicyError(f"cues[{i}].rerun: a workspace for a rerun, and this cue's action is {action}")
        if rerun not in RERUN_MODES:
            raise PolicyError(f"cues[{i}].rerun: {rerun!r} is not one of: {', '.join(RERUN_MODES)}")
    if delay is not None:
        delay = _seconds(f"cues[{i}].delay", delay)
        if action not in ("restart", "rerun"):
            raise PolicyError(f"cues[{i}].delay: the wait before the next attempt, and this cue's action "
                              f"({action}) starts none")
    return Cue(action, cue["when"], node, rerun, delay)


def counters(series: list[dict]) -> dict[str, int]:
    """The counters cues see: attempts of this series (all, restarts,
    reruns) and the series' number. An attempt whose runner vanished, or
    that was cancelled from outside, and after which the series went on in
    place (``interrupted_by``) is not counted: it was not the step's."""
    counted = [a for a in series if not a.get("interrupted_by")]
    return {
        "attempt": len(counted),
        "attempt.restart": sum(1 for a in counted if a.get("action") == "restart"),
        "attempt.rerun": sum(1 for a in counted if a.get("action") == "rerun"),
        "series": series[-1].get("series", 1) if series else 1,
    }


def exit_status(record: dict) -> int | None:
    """An attempt's exit status as conditions read it (``cmd.exit``): None
    when a signal ended its step (or it has no status: never started,
    closed from outside)."""
    return None if record.get("signal") else record.get("exit_code")


def facts(series: list[dict]) -> tuple[dict, dict]:
    """What cues read of the last attempt of ``series``: the states of its
    step and checks, and its counters with the step's and checks' exit
    statuses (``NAME.exit``)."""
    last = series[-1]
    states = {"cmd": last.get("state"), **(last.get("checks") or {})}
    counts: dict = {**counters(series), "cmd" + conditions.EXIT: exit_status(last)}
    for name, status in (last.get("check_exit_codes") or {}).items():
        counts[name + conditions.EXIT] = status
    return states, counts


def _matching(policy: Policy, series: list[dict]) -> tuple[int, Cue] | None:
    """The first cue whose condition holds over the last attempt of ``series``."""
    states, counts = facts(series)
    for i, cue in enumerate(policy.cues):
        if conditions.evaluate(cue.node, states, counts):
            return i, cue
    return None


class Start(namedtuple("Start", "action why rerun")):
    """How a series begins: ``action`` (cmd, restart or rerun), why, and a
    rerun's workspace mode (None otherwise)."""
    __slots__ = ()


def begin_series(policy: Policy, previous: list[dict]) -> Start:
    """The first action of a new series (a new run found the stage
    unfinished): the cues decide over the last attempt of the ``previous``
    series, its checks and its counters, as they would within a series, but
    ``max_attempts`` is the new series' own. ``restart`` resumes in the same
    workspace, ``rerun`` gets the policy's ``rerun`` workspace; with no cue
    (or a ``fail`` cue), a step killed from outside (``killed_from_outside``)
    resumes in place, anything else starts afresh: ``cmd`` (a stage in a new
    workspace, the old one archived; a rule in its own layout in place, its
    declared outputs removed, as plain Snakemake starts it)."""
    if not previous:
        return Start("cmd", "a first series", None)
    last = previous[-1]
    if last.get("state") == "SUCCESS":
        return Start("cmd", "done before; redone from scratch", None)
    number = last.get("series", 1)
    found = _matching(policy, previous)
    if found and found[1].action in ("restart", "rerun"):
        i, cue = found
        return Start(cue.action, f"cue {i + 1} ({cue.action} when {cue.when}) on series {number}'s "
                                 f"last attempt ({last.get('state')})",
                     (cue.rerun or policy.rerun) if cue.action == "rerun" else None)
    if found is None and killed_from_outside(last):
        return Start("restart", f"series {number}'s step was killed ({last.get('state')}, signal "
                                f"{last.get('signal') or 'from outside'}), not failed: it resumes in place", None)
    return Start("cmd", f"series {number} ended {last.get('state')}; no cue resumes it: a fresh start", None)


def killed_from_outside(attempt: dict) -> bool:
    """Was the attempt's step killed by a signal (or cancelled) while its
    machine and runner lived on, not failed by itself nor timed out? Its
    work is kept: the next series resumes it in place unless a cue says
    otherwise (a new or clean workspace is what a policy asks for)."""
    state = attempt.get("state")
    if state in ("TIMEOUT", "OOM", "SUCCESS"):
        return False
    return state in ("HWFAILURE", "CANCELLED", "PREEMPTED") or bool(attempt.get("signal"))


def decision(policy: Policy, series: list[dict]) -> dict:
    """The decision after the last attempt of ``series``, as its record
    holds it: ``action`` (``done``, ``restart``, ``rerun``, ``fail``,
    ``give_up`` or ``stop``), ``reason``, and for a next attempt, ``rerun`` (a rerun's
    workspace mode) and ``delay_s`` (the wait before it, when there is one)."""
    last = series[-1]
    found = _matching(policy, series)
    if found is None:
        if last["state"] == "SUCCESS":
            return {"action": "done", "reason": "succeeded"}
        return {"action": "fail", "reason": f"{last['state']} and no cue matched"}
    i, cue = found
    reason = f"cue {i + 1} ({cue.action} when {cue.when})"
    if cue.action not in ("restart", "rerun"):
        return {"action": cue.action, "reason": reason}
    if counters(series)["attempt"] >= policy.max_attempts:
        return {"action": "fail", "reason": f"{reason}, but max_attempts ({policy.max_attempts}) reached"}
    made = {"action": cue.action, "reason": reason}
    if cue.action == "rerun":
        made["rerun"] = cue.rerun or policy.rerun
    delay = policy.attempt_delay if cue.delay is None else cue.delay
    if delay:
        made["delay_s"] = delay
    return made


def decide(policy: Policy, series: list[dict]) -> tuple[str, str]:
    """The next action after the last attempt of ``series``: ``done``,
    ``restart``, ``rerun``, ``fail``, ``give_up`` or ``stop``, and why (``decision``
    says more)."""
    made = decision(policy, series)
    return made["action"], made["reason"]


RERUN_WORDS = {"dirty": "rerun in place (the workspace as it is)",
               "clean": "rerun in a clean workspace (the failed attempts' files removed, logs kept)",
               "new": "rerun in a new workspace (the old one archived under .attempts/)"}


def describe_start(policy: Policy, action: str, rerun: str | None = None, in_place: bool = False) -> str:
    """What a series that begins with ``action`` (``begin_series``; ``rerun``:
    its workspace mode, None for the policy's) does with the stage's
    workspace, in a user's words. ``in_place``: a rule in its own layout,
    whose fresh start is plain Snakemake's (nothing archived)."""
    if action == "restart":
        how = "the step's command" if policy.restart == "same" else "the restart command"
        return f"restart in place with {how} (workspace and checkpoints kept)"
    if action == "rerun":
        return RERUN_WORDS[rerun or policy.rerun]
    if in_place:
        return "a fresh start in place (its declared outputs removed, what else it wrote kept, as plain Snakemake does)"
    return "a fresh start (its workspace archived under .attempts/ first)"
