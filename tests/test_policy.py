"""Control policy (src/waypost/model/policy.py): building and validating a policy,
`depends`, runtime growth, attempt counters, and the decision table of
`decide` for the reference pipeline's training policy."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from waypost.model.conditions import STATES, Compare, State, parse
from waypost.model.policy import (
    DEFAULTS,
    Cue,
    Policy,
    PolicyError,
    begin_series,
    counters,
    decide,
    decision,
    describe_start,
)

# The training policy of the reference pipeline (config/config.yaml, `&training`).
TRAINING = {
    "max_attempts": 4,
    "runtime": 60,
    "runtime_growth": 1.5,
    "checks": {"has_checkpoint": 'ls "$WAYPOST_STAGE_DIR"/checkpoints/epoch-*.json >/dev/null 2>&1'},
    "cues": [
        {"action": "restart", "when": "any(cmd.TIMEOUT, cmd.PREEMPTED)"},
        {"action": "restart", "when": "all(cmd.HWFAILURE, has_checkpoint.SUCCESS)"},
        {"action": "rerun", "when": "cmd.HWFAILURE"},
        {"action": "rerun", "when": "all(cmd.FAILED, attempt.rerun < 1)"},
    ],
}


def attempt(state: str, action: str = "cmd", **checks: str) -> dict:
    """One attempt record as the runner keeps it (only what `decide` reads)."""
    return {"action": action, "state": state, "checks": checks}


# --- from_config -----------------------------------------------------------------

@pytest.mark.parametrize("raw", [None, {}])
def test_defaults(raw):
    policy = Policy.from_config(raw)
    assert policy.max_attempts == 1
    assert policy.restart == "same"
    assert policy.rerun == "new"
    assert policy.checks == {}
    assert policy.cues == []
    assert policy.depends == "all_success"
    assert policy.depends_node == State("parent", "SUCCESS")
    assert policy.runtime is None
    assert policy.runtime_growth == 1.0
    assert policy.kill_grace == 10.0
    assert policy.check_timeout == 60.0


def test_from_config_keeps_values_and_parses_cues():
    policy = Policy.from_config(TRAINING)
    assert policy.max_attempts == 4
    assert policy.runtime == 60 and policy.runtime_growth == 1.5
    assert policy.checks == TRAINING["checks"]
    assert policy.cues[0] == Cue("restart", "any(cmd.TIMEOUT, cmd.PREEMPTED)", parse("any(cmd.TIMEOUT, cmd.PREEMPTED)"))
    assert [(c.action, c.when) for c in policy.cues] == [(c["action"], c["when"]) for c in TRAINING["cues"]]
    assert policy.cues[3].node.args[1] == Compare("attempt.rerun", "<", 1)


def test_from_config_does_not_share_state_with_its_input_or_defaults():
    raw = {"checks": {"ok": "true"}}
    policy = Policy.from_config(raw)
    raw["checks"]["later"] = "false"
    policy.checks["mine"] = "true"
    assert policy.checks == {"ok": "true", "mine": "true"}
    assert DEFAULTS["checks"] == {} and DEFAULTS["cues"] == []
    assert Policy.from_config({}).checks == {}


def test_reference_config_uses_this_training_policy():
    """Keeps the decision table below honest about the shipped config."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for stage in ("train_backward", "train_teacher", "train_student"):
        shipped = config["stages"][stage]["policy"]
        assert shipped["max_attempts"] == TRAINING["max_attempts"]
        assert shipped["cues"] == TRAINING["cues"]
        assert set(shipped["checks"]) == set(TRAINING["checks"])
        Policy.from_config(shipped)


@pytest.mark.parametrize("raw, message", [
    ({"cues": [{"action": "retry", "when": "cmd.FAILED"}]},
     "cues[0].action: 'retry' is not one of: restart, rerun, fail"),
    ({"cues": [{"action": "rerun", "when": "cmd.FAILED"}, {"action": "done", "when": "cmd.SUCCESS"}]},
     "cues[1].action: 'done' is not one of"),
    ({"cues": [{"when": "cmd.FAILED"}]}, "cues[0].action: None is not one of"),
    ({"rerun": "fresh"}, "rerun: 'fresh' is not one of: dirty, clean, new"),
    ({"checks": {"ok": "true"}, "cues": [{"action": "restart", "when": "all(cmd.HWFAILURE, has_checkpoint.SUCCESS)"}]},
     "cues[0].when: 'all(cmd.HWFAILURE, has_checkpoint.SUCCESS)': unknown name 'has_checkpoint' "
     "in has_checkpoint.SUCCESS (expected one of: cmd, ok)"),
    ({"cues": [{"action": "rerun", "when": "parent.FAILED"}]}, "cues[0].when: 'parent.FAILED': unknown name 'parent'"),
    ({"cues": [{"action": "restart", "when": "cmd.TIMEDOUT"}]}, "cues[0].when: 'cmd.TIMEDOUT': unknown state 'TIMEDOUT'"),
    ({"cues": [{"action": "rerun", "when": "attempts < 2"}]}, "cues[0].when: 'attempts < 2': unknown counter 'attempts'"),
    ({"cues": [{"action": "rerun", "when": ""}]}, "cues[0].when: '': empty condition"),
    ({"checks": {"cmd": "true"}}, "checks: 'cmd' is reserved for the step itself"),
    ({"checks": {"ok": "true", "cmd": "true"}, "cues": [{"action": "rerun", "when": "cmd.FAILED"}]},
     "checks: 'cmd' is reserved"),
    ({"depends": "all_fine"},
     "depends: 'all_fine': 'all_fine' is not a condition"),
    ({"depends": "all_fine"}, "(or a preset: all_success, all_done)"),
    ({"depends": "parent.DONE"}, "depends: 'parent.DONE': unknown state 'DONE'"),
    ({"depends": "cmd.SUCCESS"}, "depends: 'cmd.SUCCESS': unknown name 'cmd' in cmd.SUCCESS (expected one of: parent)"),
    ({"depends": "all(parent.SUCCESS, attempt < 2)"}, "counters (attempt) can't be used here"),
    ({"depends": "any(parent.SUCCESS, parent.TIMEOUT"}, "expected ')', found 'end of text'"),
])
def test_from_config_errors(raw, message):
    with pytest.raises(PolicyError) as err:
        Policy.from_config(raw)
    assert message in str(err.value)


def test_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)


# --- depends ----------------------------------------------------------------------

OTHER_STATES = [s for s in STATES if s != "SUCCESS"]


@pytest.mark.parametrize("depends, node, accepted, tolerates", [
    ("all_success", State("parent", "SUCCESS"), {"SUCCESS"}, False),
    ("all_done", State("parent", "*"), set(STATES), True),
    ("any(parent.SUCCESS, parent.TIMEOUT)", parse("any(parent.SUCCESS, parent.TIMEOUT)"), {"SUCCESS", "TIMEOUT"}, True),
    ("parent.SUCCESS", State("parent", "SUCCESS"), {"SUCCESS"}, False),
    ("not(parent.SKIPPED)", parse("not(parent.SKIPPED)"), set(STATES) - {"SKIPPED"}, True),
    ("parent.SKIPPED", State("parent", "SKIPPED"), {"SKIPPED"}, True),
])
def test_depends(depends, node, accepted, tolerates):
    policy = Policy.from_config({"depends": depends})
    assert policy.depends == depends            # the text as written (shown in messages)
    assert policy.depends_node == node
    assert {s for s in STATES if policy.accepts(s)} == accepted
    assert policy.tolerates_failure is tolerates


@pytest.mark.parametrize("state", OTHER_STATES)
def test_all_success_refuses_every_other_state(state):
    assert not Policy.from_config({}).accepts(state)


# --- runtime ---------------------------------------------------------------------------

def test_runtime_grows_per_attempt():
    policy = Policy.from_config(TRAINING)
    assert [policy.runtime_seconds(n) for n in (1, 2, 3, 4)] == [3600, 5400, 8100, 12150]


def test_runtime_without_growth_is_constant():
    policy = Policy.from_config({"runtime": 0.5})
    assert [policy.runtime_seconds(n) for n in (1, 2, 5)] == [30, 30, 30]


def test_no_runtime_is_no_limit():
    policy = Policy.from_config({"runtime_growth": 2})
    assert policy.runtime_seconds(1) is None
    assert policy.runtime_seconds(3) is None


# --- counters ---------------------------------------------------------------------------

@pytest.mark.parametrize("actions, expected", [
    ([], (0, 0, 0)),
    (["cmd"], (1, 0, 0)),
    (["cmd", "restart", "restart"], (3, 2, 0)),
    (["cmd", "rerun", "restart", "rerun", "restart"], (5, 2, 2)),
    ([None, "restart"], (2, 1, 0)),     # an attempt without an action still counts as an attempt
])
def test_counters(actions, expected):
    series = [{"state": "FAILED"} if a is None else attempt("FAILED", a) for a in actions]
    assert counters(series) == {**dict(zip(("attempt", "attempt.restart", "attempt.rerun"), expected)), "series": 1}


# --- decide: the training policy's decision table ------------------------------------------

T = attempt
DECISIONS = {
    "success": ([T("SUCCESS", has_checkpoint="SUCCESS")], "done", "succeeded"),
    "success without checks": ([T("SUCCESS")], "done", "succeeded"),
    "timeout": ([T("TIMEOUT", has_checkpoint="SUCCESS")], "restart", "cue 1 (restart when any(cmd.TIMEOUT, cmd.PREEMPTED))"),
    "timeout without checkpoint": ([T("TIMEOUT", has_checkpoint="FAILED")], "restart", "cue 1"),
    "preempted": ([T("PREEMPTED")], "restart", "cue 1"),
    "hwfailure with checkpoint": ([T("HWFAILURE", has_checkpoint="SUCCESS")], "restart",
                                  "cue 2 (restart when all(cmd.HWFAILURE, has_checkpoint.SUCCESS))"),
    "hwfailure without checkpoint": ([T("HWFAILURE", has_checkpoint="FAILED")], "rerun", "cue 3 (rerun when cmd.HWFAILURE)"),
    "hwfailure, check timed out": ([T("HWFAILURE", has_checkpoint="TIMEOUT")], "rerun", "cue 3"),
    "hwfailure, check not run": ([T("HWFAILURE")], "rerun", "cue 3"),
    "failed first time": ([T("FAILED", has_checkpoint="SUCCESS")], "rerun",
                          "cue 4 (rerun when all(cmd.FAILED, attempt.rerun < 1))"),
    "failed after one rerun": ([T("FAILED"), T("FAILED", "rerun")], "fail", "FAILED and no cue matched"),
    "failed after a restart": ([T("TIMEOUT"), T("FAILED", "restart")], "rerun", "cue 4"),
    "failed after hwfailure rerun": ([T("HWFAILURE"), T("FAILED", "rerun")], "fail", "FAILED and no cue matched"),
    "oom": ([T("OOM", has_checkpoint="SUCCESS")], "fail", "OOM and no cue matched"),
    "cancelled": ([T("CANCELLED")], "fail", "CANCELLED and no cue matched"),
    "skipped": ([T("SKIPPED")], "fail", "SKIPPED and no cue matched"),
    "timeout on attempt 3": ([T("TIMEOUT"), T("TIMEOUT", "restart"), T("TIMEOUT", "restart")], "restart", "cue 1"),
    "timeout on attempt 4": ([T("TIMEOUT"), T("TIMEOUT", "restart"), T("TIMEOUT", "restart"), T("TIMEOUT", "restart")],
                             "fail", "cue 1 (restart when any(cmd.TIMEOUT, cmd.PREEMPTED)), "
                                     "but max_attempts (4) reached"),
    "hwfailure on attempt 4": ([T("TIMEOUT"), T("PREEMPTED", "restart"), T("HWFAILURE", "restart"), T("HWFAILURE", "rerun")],
                               "fail", "cue 3 (rerun when cmd.HWFAILURE), but max_attempts (4) reached"),
    "success on attempt 4": ([T("TIMEOUT"), T("TIMEOUT", "restart"), T("HWFAILURE", "restart"), T("SUCCESS", "rerun")],
                             "done", "succeeded"),
    "only the last attempt counts": ([T("SUCCESS"), T("OOM", "restart")], "fail", "OOM and no cue matched"),
}


@pytest.mark.parametrize("series, action, reason", DECISIONS.values(), ids=list(DECISIONS))
def test_training_policy_decisions(series, action, reason):
    got_action, got_reason = decide(Policy.from_config(TRAINING), series)
    assert got_action == action
    assert reason in got_reason


def test_decide_does_not_change_the_series():
    series = [T("HWFAILURE", has_checkpoint="SUCCESS")]
    before = [dict(a, checks=dict(a["checks"])) for a in series]
    decide(Policy.from_config(TRAINING), series)
    assert series == before


# --- decide: other policies -------------------------------------------------------------

FAILED_TWICE = [{"action": "rerun", "when": "cmd.FAILED"}, {"action": "restart", "when": "cmd.FAILED"}]
FAIL_ON_SUCCESS = {"checks": {"ok": "test -s out.txt"},
                   "cues": [{"action": "fail", "when": "all(cmd.SUCCESS, not(ok.SUCCESS))"}]}


@pytest.mark.parametrize("raw, series, action, reason", [
    # The first matching cue wins, whatever comes after it.
    ({"max_attempts": 3, "cues": FAILED_TWICE}, [T("FAILED")], "rerun", "cue 1 (rerun when cmd.FAILED)"),
    ({"max_attempts": 3, "cues": FAILED_TWICE[::-1]}, [T("FAILED")], "restart", "cue 1 (restart when cmd.FAILED)"),
    ({"max_attempts": 3, "cues": [{"action": "fail", "when": "cmd.FAILED"}, *FAILED_TWICE]}, [T("FAILED")],
     "fail", "cue 1 (fail when cmd.FAILED)"),
    ({"max_attempts": 3, "cues": [{"action": "rerun", "when": "cmd.OOM"}, *FAILED_TWICE]}, [T("FAILED")],
     "rerun", "cue 2 (rerun when cmd.FAILED)"),
    # A cue can fail a step that exited 0.
    (FAIL_ON_SUCCESS, [T("SUCCESS", ok="FAILED")], "fail", "cue 1 (fail when all(cmd.SUCCESS, not(ok.SUCCESS)))"),
    (FAIL_ON_SUCCESS, [T("SUCCESS", ok="TIMEOUT")], "fail", "cue 1"),
    (FAIL_ON_SUCCESS, [T("SUCCESS")], "fail", "cue 1"),       # a check that didn't run did not succeed
    (FAIL_ON_SUCCESS, [T("SUCCESS", ok="SUCCESS")], "done", "succeeded"),
    (FAIL_ON_SUCCESS, [T("FAILED", ok="FAILED")], "fail", "FAILED and no cue matched"),
    # A restart cue on success still runs again (e.g. a step that asks for more time).
    ({"max_attempts": 2, "checks": {"more": "true"}, "cues": [{"action": "restart", "when": "all(cmd.SUCCESS, more.SUCCESS)"}]},
     [T("SUCCESS", more="SUCCESS")], "restart", "cue 1"),
    ({"max_attempts": 2, "checks": {"more": "true"}, "cues": [{"action": "restart", "when": "all(cmd.SUCCESS, more.SUCCESS)"}]},
     [T("SUCCESS", more="SUCCESS"), T("SUCCESS", "restart", more="SUCCESS")], "fail", "max_attempts (2) reached"),
    # The shipped global default: one rerun after a hardware failure.
    ({"max_attempts": 2, "cues": [{"action": "rerun", "when": "cmd.HWFAILURE"}]}, [T("HWFAILURE")], "rerun", "cue 1"),
    ({"max_attempts": 2, "cues": [{"action": "rerun", "when": "cmd.HWFAILURE"}]}, [T("HWFAILURE"), T("HWFAILURE", "rerun")],
     "fail", "max_attempts (2) reached"),
    # With no policy at all: success is done, anything else fails.
    ({}, [T("SUCCESS")], "done", "succeeded"),
    ({}, [T("TIMEOUT")], "fail", "TIMEOUT and no cue matched"),
    # Counters: the whole series, not just the last attempt.
    ({"max_attempts": 9, "cues": [{"action": "restart", "when": "all(cmd.TIMEOUT, attempt.restart < 2)"}]},
     [T("TIMEOUT"), T("TIMEOUT", "restart")], "restart", "cue 1"),
    ({"max_attempts": 9, "cues": [{"action": "restart", "when": "all(cmd.TIMEOUT, attempt.restart < 2)"}]},
     [T("TIMEOUT"), T("TIMEOUT", "restart"), T("TIMEOUT", "restart")], "fail", "TIMEOUT and no cue matched"),
    ({"max_attempts": 9, "cues": [{"action": "fail", "when": "attempt >= 2"}, {"action": "rerun", "when": "cmd.*"}]},
     [T("SUCCESS")], "rerun", "cue 2"),
    ({"max_attempts": 9, "cues": [{"action": "fail", "when": "attempt >= 2"}, {"action": "rerun", "when": "cmd.*"}]},
     [T("FAILED"), T("SUCCESS", "rerun")], "fail", "cue 1 (fail when attempt >= 2)"),
])
def test_decisions_of_other_policies(raw, series, action, reason):
    got_action, got_reason = decide(Policy.from_config(raw), series)
    assert got_action == action, got_reason
    assert reason in got_reason


def test_checks_none_in_an_attempt_is_no_checks():
    policy = Policy.from_config(TRAINING)
    assert decide(policy, [{"action": "cmd", "state": "HWFAILURE", "checks": None}])[0] == "rerun"
    assert decide(policy, [{"action": "cmd", "state": "SUCCESS"}]) == ("done", "succeeded")


@pytest.mark.parametrize("raw, message", [
    ({"cues": [{"action": "rerun"}]}, "malformed policy"),
    ({"checks": None}, "malformed policy"),
    ({"max_attempts": 0}, "max_attempts: 0"),
    ({"runtime": "soon"}, "malformed policy"),
])
def test_malformed_policies_are_policy_errors(raw, message):
    with pytest.raises(PolicyError, match=message):
        Policy.from_config(raw)


# --- exit statuses, a cue's workspace and delay -------------------------------------------

PROTOCOL = {"max_attempts": 5, "rerun": "dirty", "attempt_delay": 2, "checks": {"probe": "true"}, "cues": [
    {"action": "restart", "when": "all(cmd.exit == 100, probe.exit == 0)"},
    {"action": "rerun", "when": "cmd.exit == 101", "rerun": "clean", "delay": 30},
    {"action": "rerun", "when": "cmd.exit == 104"},
    {"action": "fail", "when": "cmd.exit == 102"},
    {"action": "give_up", "when": "not(cmd.exit == 0)"},
]}


def ended(code: int | None, signal: int | None = None, probe: int | None = 0, action: str = "cmd") -> dict:
    return {"action": action, "state": "SUCCESS" if code == 0 else "FAILED", "exit_code": code, "signal": signal,
            "checks": {"probe": "SUCCESS" if probe == 0 else "FAILED"}, "check_exit_codes": {"probe": probe}}


@pytest.mark.parametrize("series, made", [
    ([ended(100)], {"action": "restart", "reason": "cue 1 (restart when all(cmd.exit == 100, probe.exit == 0))",
                    "delay_s": 2}),
    ([ended(100, probe=None)], {"action": "give_up", "reason": "cue 5 (give_up when not(cmd.exit == 0))"}),
    ([ended(101)], {"action": "rerun", "reason": "cue 2 (rerun when cmd.exit == 101)", "rerun": "clean",
                    "delay_s": 30}),
    ([ended(104)], {"action": "rerun", "reason": "cue 3 (rerun when cmd.exit == 104)", "rerun": "dirty",
                    "delay_s": 2}),
    ([ended(102)], {"action": "fail", "reason": "cue 4 (fail when cmd.exit == 102)"}),
    # A step a signal ended has no exit status: 137 with signal 9 is not `cmd.exit == 137`.
    ([ended(137, signal=9)], {"action": "give_up", "reason": "cue 5 (give_up when not(cmd.exit == 0))"}),
    ([ended(0)], {"action": "done", "reason": "succeeded"}),
    ([ended(101)] * 5, {"action": "fail", "reason": "cue 2 (rerun when cmd.exit == 101), but max_attempts (5) reached"}),
])
def test_decisions_by_exit_status_with_their_workspace_and_delay(series, made):
    assert decision(Policy.from_config(PROTOCOL), series) == made


def test_no_delay_is_no_delay_s():
    policy = Policy.from_config({**PROTOCOL, "attempt_delay": 0})
    assert "delay_s" not in decision(policy, [ended(104)])
    assert decision(policy, [ended(101)])["delay_s"] == 30


def test_a_series_begins_with_the_workspace_of_the_cue_that_resumes_it():
    policy = Policy.from_config(PROTOCOL)
    start = begin_series(policy, [ended(101)])
    assert (start.action, start.rerun) == ("rerun", "clean")
    assert describe_start(policy, start.action, start.rerun).startswith("rerun in a clean workspace")
    assert begin_series(policy, [ended(104)]).rerun == "dirty"
    assert begin_series(policy, [ended(100)]).rerun is None
    assert not policy.goes_on_in_workspace("rerun", "clean") and policy.goes_on_in_workspace("rerun")


@pytest.mark.parametrize("raw, message", [
    ({"attempt_delay": -1}, "attempt_delay: -1 (expected seconds: a number, at least 0)"),
    ({"attempt_delay": "soon"}, "attempt_delay: 'soon' (expected seconds"),
    ({"attempt_delay": True}, "attempt_delay: True"),
    ({"cues": [{"action": "restart", "when": "cmd.FAILED", "delay": -5}]}, "cues[0].delay: -5 (expected seconds"),
    ({"cues": [{"action": "restart", "when": "cmd.FAILED", "delay": "30s"}]}, "cues[0].delay: '30s'"),
    ({"cues": [{"action": "fail", "when": "cmd.FAILED", "delay": 5}]},
     "cues[0].delay: the wait before the next attempt, and this cue's action (fail) starts none"),
    ({"cues": [{"action": "rerun", "when": "cmd.FAILED", "rerun": "fresh"}]},
     "cues[0].rerun: 'fresh' is not one of: dirty, clean, new"),
    ({"cues": [{"action": "restart", "when": "cmd.FAILED", "rerun": "clean"}]},
     "cues[0].rerun: a workspace for a rerun, and this cue's action is restart"),
    ({"cues": [{"action": "rerun", "when": "cmd.FAILED", "workspace": "new"}]},
     "cues[0]: unknown key 'workspace' (a cue has: action, when, rerun, delay)"),
    ({"cues": [{"action": "rerun", "when": "nosuchcheck.exit == 1"}]},
     "cues[0].when: 'nosuchcheck.exit == 1': unknown name 'nosuchcheck'"),
    ({"cues": [{"action": "rerun", "when": "cmd.exit == abc"}]}, "expected a whole number after cmd.exit =="),
])
def test_exit_workspace_and_delay_errors(raw, message):
    with pytest.raises(PolicyError) as err:
        Policy.from_config(raw)
    assert message in str(err.value)
