"""Control policy: what the next attempt of a stage does, given its history.

A policy (``policy:`` in the config, per stage, overridable per experiment
and pair) holds:

- ``max_attempts``: attempts of the work (cmd, restart or rerun) in one series;
- ``restart``: ``same`` (run the step's command again in the same workspace:
  for steps that resume from their own checkpoints) or a shell command;
- ``rerun``: the workspace a rerun gets: ``dirty`` (as is), ``clean`` (the
  failed attempts' files removed; logs and history kept) or ``new`` (the
  workspace archived under ``.attempts/<n>/``, the canonical path reused);
- ``checks``: name → shell command, run after every attempt; exit 0 makes the
  check SUCCESS, anything else FAILED (TIMEOUT past ``check_timeout``);
- ``cues``: ordered ``{action: restart|rerun|fail, when: CONDITION}``; the
  first whose condition holds decides. With none matching, a SUCCESS attempt
  is done and anything else fails the stage;
- ``depends``: which parent states this stage accepts (``all_success``,
  ``all_done`` or a condition over ``parent.STATE``), checked per parent;
- ``runtime`` (minutes, per attempt; grows by ``runtime_growth``) and
  ``kill_grace`` (seconds between SIGTERM and SIGKILL on timeout).
"""

from __future__ import annotations

from collections import namedtuple

from . import conditions

ACTIONS = ("restart", "rerun", "fail")
RERUN_MODES = ("dirty", "clean", "new")
DEPENDS_PRESETS = {
    "all_success": "parent.SUCCESS",
    "all_done": "parent.*",
}
DEFAULTS = {
    "max_attempts": 1,
    "restart": "same",
    "rerun": "new",
    "checks": {},
    "cues": [],
    "depends": "all_success",
    "runtime": None,
    "runtime_growth": 1.0,
    "memory_growth": 1.0,
    "kill_grace": 10,
    "check_timeout": 60,
}


class PolicyError(ValueError):
    pass


# Named tuples, not dataclasses: the step runner imports this module at every
# start, and dataclasses cost it ~10 ms.
Cue = namedtuple("Cue", "action when node")


class Policy(namedtuple("Policy", ["max_attempts", "restart", "rerun", "checks", "cues", "depends", "depends_node",
                                   "runtime", "runtime_growth", "memory_growth", "kill_grace", "check_timeout"])):
    """A validated policy (build it with ``from_config``); ``DEFAULTS`` has
    each key's default."""
    __slots__ = ()

    @classmethod
    def from_config(cls, raw: dict | None) -> "Policy":
        """Build and validate; PolicyError names the key and the text."""
        try:
            return cls._from_config({**DEFAULTS, **(raw or {})})
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PolicyError):
                raise
            raise PolicyError(f"malformed policy ({exc.__class__.__name__}: {exc})") from None

    @classmethod
    def _from_config(cls, data: dict) -> "Policy":
        if int(data["max_attempts"]) < 1:
            raise PolicyError(f"max_attempts: {data['max_attempts']!r} (expected at least 1)")
        subjects = {"cmd", *data["checks"]}
        if "cmd" in data["checks"]:
            raise PolicyError("checks: 'cmd' is reserved for the step itself")
        cues = []
        for i, cue in enumerate(data["cues"]):
            if cue.get("action") not in ACTIONS:
                raise PolicyError(f"cues[{i}].action: {cue.get('action')!r} is not one of: {', '.join(ACTIONS)}")
            try:
                cues.append(Cue(cue["action"], cue["when"], conditions.validate(cue["when"], subjects)))
            except conditions.ConditionError as exc:
                raise PolicyError(f"cues[{i}].when: {cue['when']!r}: {exc}") from None
        if data["rerun"] not in RERUN_MODES:
            raise PolicyError(f"rerun: {data['rerun']!r} is not one of: {', '.join(RERUN_MODES)}")
        depends_text = DEPENDS_PRESETS.get(data["depends"], data["depends"])
        try:
            depends_node = conditions.validate(depends_text, {"parent"}, counters=False)
        except conditions.ConditionError as exc:
            raise PolicyError(f"depends: {data['depends']!r}: {exc} "
                              f"(or a preset: {', '.join(DEPENDS_PRESETS)})") from None
        return cls(max_attempts=int(data["max_attempts"]), restart=data["restart"], rerun=data["rerun"],
                   checks=dict(data["checks"]), cues=cues, depends=data["depends"], depends_node=depends_node,
                   runtime=None if data["runtime"] is None else float(data["runtime"]),
                   runtime_growth=float(data["runtime_growth"]),
                   memory_growth=float(data["memory_growth"]),
                   kill_grace=float(data["kill_grace"]), check_timeout=float(data["check_timeout"]))

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

    def accepts(self, parent_state: str) -> bool:
        return conditions.evaluate(self.depends_node, {"parent": parent_state})


def counters(series: list[dict]) -> dict[str, int]:
    return {
        "attempt": len(series),
        "attempt.restart": sum(1 for a in series if a.get("action") == "restart"),
        "attempt.rerun": sum(1 for a in series if a.get("action") == "rerun"),
    }


def decide(policy: Policy, series: list[dict]) -> tuple[str, str]:
    """The next action after the last attempt of ``series``: ``done``,
    ``restart``, ``rerun`` or ``fail``, and why."""
    last = series[-1]
    states = {"cmd": last["state"], **(last.get("checks") or {})}
    counts = counters(series)
    for i, cue in enumerate(policy.cues):
        if conditions.evaluate(cue.node, states, counts):
            action, reason = cue.action, f"cue {i + 1} ({cue.action} when {cue.when})"
            break
    else:
        if last["state"] == "SUCCESS":
            return "done", "succeeded"
        return "fail", f"{last['state']} and no cue matched"
    if action in ("restart", "rerun") and counts["attempt"] >= policy.max_attempts:
        return "fail", f"{reason}, but max_attempts ({policy.max_attempts}) reached"
    return action, reason
