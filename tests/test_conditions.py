"""The condition language of cues and `depends` (src/waypost/model/conditions.py):
parsing, clear errors, name checks, evaluation; plus property tests that
round-trip random condition trees through text and check `evaluate` against
an independent reference evaluator."""

from __future__ import annotations

import builtins
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waypost.model.conditions import (
    COUNTERS,
    STATES,
    Call,
    Compare,
    ConditionError,
    State,
    atoms,
    evaluate,
    parse,
    validate,
)

OPS = ("==", "!=", "<", "<=", ">", ">=")


# --- parsing: atoms ----------------------------------------------------------

@pytest.mark.parametrize("text, tree", [
    ("cmd.TIMEOUT", State("cmd", "TIMEOUT")),
    ("has_checkpoint.SUCCESS", State("has_checkpoint", "SUCCESS")),
    ("has-ckpt2.FAILED", State("has-ckpt2", "FAILED")),  # check names may hold '-' and digits
    ("parent.*", State("parent", "*")),
    ("attempt >= 3", Compare("attempt", ">=", 3)),
    ("attempt.restart < 2", Compare("attempt.restart", "<", 2)),
    ("attempt.rerun == 0", Compare("attempt.rerun", "==", 0)),
    ("attempt != 1", Compare("attempt", "!=", 1)),
    ("attempt <= 10", Compare("attempt", "<=", 10)),
    ("attempt > -1", Compare("attempt", ">", -1)),
    ("attempt>=3", Compare("attempt", ">=", 3)),
    ("attempt.rerun<1", Compare("attempt.rerun", "<", 1)),
])
def test_parse_atoms(text, tree):
    assert parse(text) == tree


@pytest.mark.parametrize("state", STATES)
def test_every_state_parses(state):
    assert parse(f"cmd.{state}") == State("cmd", state)


def test_parse_nested_calls():
    text = "any(cmd.TIMEOUT, all(cmd.HWFAILURE, not(has_checkpoint.FAILED)), attempt.rerun < 1)"
    assert parse(text) == Call("any", (
        State("cmd", "TIMEOUT"),
        Call("all", (State("cmd", "HWFAILURE"), Call("not", (State("has_checkpoint", "FAILED"),)))),
        Compare("attempt.rerun", "<", 1),
    ))


def test_single_argument_any_and_all():
    assert parse("any(cmd.OOM)") == Call("any", (State("cmd", "OOM"),))
    assert parse("all(parent.*)") == Call("all", (State("parent", "*"),))


def test_function_names_are_only_functions_before_a_paren():
    # A check may be called `any` or `not`: `any.SUCCESS` is a state atom.
    assert parse("all(any.SUCCESS, not.FAILED)") == Call("all", (State("any", "SUCCESS"), State("not", "FAILED")))


@pytest.mark.parametrize("text", [
    "all(cmd.FAILED,attempt.rerun<1)",
    "all(cmd.FAILED, attempt.rerun < 1)",
    "  all ( cmd.FAILED ,attempt.rerun   <1 )  ",
    "\nall(\n\tcmd.FAILED,\n\tattempt.rerun < 1\n)\n",
    "all (cmd.FAILED , attempt.rerun<  1)",
])
def test_whitespace_is_tolerated_between_tokens(text):
    assert parse(text) == Call("all", (State("cmd", "FAILED"), Compare("attempt.rerun", "<", 1)))


# --- parsing: errors -----------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("some(cmd.FAILED)", "unknown function 'some' (expected one of: any, all, not)"),
    ("ANY(cmd.FAILED)", "unknown function 'ANY'"),
    ("cmd.FAILED(x.SUCCESS)", "unknown function 'cmd.FAILED'"),
    ("cmd.TIMEDOUT", "unknown state 'TIMEDOUT' in 'cmd.TIMEDOUT' (expected one of: SUCCESS, FAILED"),
    ("cmd.failed", "unknown state 'failed'"),
    ("any(cmd.FAILED, has_checkpoint.OK)", "unknown state 'OK' in 'has_checkpoint.OK'"),
    ("attempt.rerun", "unknown state 'rerun' in 'attempt.rerun'"),  # a counter needs a comparison
    ("attempts > 1", "unknown counter 'attempts' (expected one of: attempt, attempt.restart, attempt.rerun, series)"),
    ("attempt.retry >= 2", "unknown counter 'attempt.retry'"),
    ("cmd.FAILED == 1", "unknown counter 'cmd.FAILED'"),
    ("TIMEOUT", "'TIMEOUT' is not a condition (expected NAME.STATE, a counter comparison, or any, all, not(...))"),
    ("any(cmd.FAILED, cmd)", "'cmd' is not a condition"),
    ("any(cmd.FAILED, cmd.TIMEOUT", "expected ')', found 'end of text'"),
    ("any(cmd.FAILED cmd.TIMEOUT)", "expected ')', found 'cmd.TIMEOUT'"),
    ("not(cmd.FAILED", "expected ')', found 'end of text'"),
    ("any(", "condition ends too early"),
    ("cmd.FAILED)", "unexpected ')' after a complete condition"),
    ("cmd.FAILED cmd.TIMEOUT", "unexpected 'cmd.TIMEOUT' after a complete condition"),
    ("any(cmd.FAILED) x.SUCCESS", "unexpected 'x.SUCCESS' after a complete condition"),
    ("attempt >= 3x", "unexpected 'x' after a complete condition"),
    ("", "empty condition"),
    ("   \n\t", "empty condition"),
    ("not(cmd.FAILED, cmd.TIMEOUT)", "not() takes one condition, got 2"),
    ("not(cmd.FAILED, cmd.TIMEOUT, cmd.OOM)", "not() takes one condition, got 3"),
    ("attempt >=", "expected a whole number after attempt >="),
    ("attempt.rerun < many", "expected a whole number after attempt.rerun <"),
    ("attempt < cmd.FAILED", "expected a whole number after attempt <"),
    ("attempt >= 1.5", "unexpected '.5'"),
    ("attempt = 1", "unexpected '= 1'"),
    ("3 <= attempt", "unexpected '3'"),
    ("any()", "unexpected ')'"),
    ("any(cmd.FAILED,)", "unexpected ')'"),
    ("(cmd.FAILED)", "unexpected '('"),
    ("cmd.FAILED && cmd.OOM", "unexpected '&& cmd.OOM'"),
    ("cmd.", "unexpected '.'"),
])
def test_parse_errors_are_clear(text, message):
    with pytest.raises(ConditionError) as err:
        parse(text)
    assert message in str(err.value)


@pytest.mark.parametrize("value", [None, 3, ["cmd.FAILED"]])
def test_non_text_is_an_error(value):
    with pytest.raises(ConditionError, match="empty condition"):
        parse(value)


def test_condition_error_is_a_value_error():
    assert issubclass(ConditionError, ValueError)


# --- never eval ------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "__import__('os').system('x')",
    "__import__(\"os\").system(\"x\")",
    "exec(cmd.FAILED)",
    "eval(cmd.FAILED)",
    "cmd.FAILED or True",
    "cmd.FAILED and attempt.__class__",
    "lambda: 1",
    "1 == 1",
    "attempt >= 3 and True",
    "[c for c in ()]",
    "cmd.FAILED; import os",
])
def test_python_is_not_a_condition(text, monkeypatch):
    calls = []
    monkeypatch.setattr("os.system", lambda *a: calls.append(a))
    with pytest.raises(ConditionError):
        parse(text)
    assert calls == []


def test_parse_and_evaluate_never_call_eval_or_exec(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called")
    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    monkeypatch.setattr(builtins, "compile", forbidden)
    node = validate("all(any(cmd.TIMEOUT, cmd.PREEMPTED), not(ok.FAILED), attempt.restart < 2)", {"cmd", "ok"})
    assert evaluate(node, {"cmd": "TIMEOUT", "ok": "SUCCESS"}, {"attempt.restart": 1}) is True
    assert evaluate(node, {"cmd": "TIMEOUT", "ok": "SUCCESS"}, {"attempt.restart": 2}) is False


# --- validate --------------------------------------------------------------------------

def test_validate_returns_the_tree():
    text = "any(cmd.FAILED, has_checkpoint.SUCCESS, attempt >= 2)"
    assert validate(text, {"cmd", "has_checkpoint"}) == parse(text)


@pytest.mark.parametrize("text, subjects, message", [
    ("ok.SUCCESS", {"cmd"}, "unknown name 'ok' in ok.SUCCESS (expected one of: cmd)"),
    ("any(cmd.FAILED, all(cmd.OOM, not(has_ckpt.SUCCESS)))", {"cmd", "has_checkpoint"},
     "unknown name 'has_ckpt' in has_ckpt.SUCCESS (expected one of: cmd, has_checkpoint)"),
    ("parent.*", {"cmd"}, "unknown name 'parent' in parent.*"),
    ("cmd.SUCCESS", {"parent"}, "unknown name 'cmd' in cmd.SUCCESS (expected one of: parent)"),
])
def test_validate_rejects_unknown_subjects(text, subjects, message):
    with pytest.raises(ConditionError) as err:
        validate(text, subjects)
    assert message in str(err.value)


@pytest.mark.parametrize("text, counter", [
    ("attempt < 2", "attempt"),
    ("all(parent.SUCCESS, attempt.rerun == 0)", "attempt.rerun"),
    ("any(parent.FAILED, not(attempt.restart >= 1))", "attempt.restart"),
])
def test_validate_rejects_counters_where_not_allowed(text, counter):
    assert validate(text, {"parent"}) == parse(text)  # fine where counters are allowed
    with pytest.raises(ConditionError, match=rf"counters \({counter}\) can't be used here"):
        validate(text, {"parent"}, counters=False)


def test_validate_reports_parse_errors_first():
    with pytest.raises(ConditionError, match="unknown state 'TIMEDOUT'"):
        validate("nope.TIMEDOUT", {"cmd"})


# --- evaluate ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, states, expected", [
    ("cmd.TIMEOUT", {"cmd": "TIMEOUT"}, True),
    ("cmd.TIMEOUT", {"cmd": "FAILED"}, False),
    ("cmd.TIMEOUT", {"cmd": None}, False),           # didn't run
    ("cmd.TIMEOUT", {}, False),                      # unknown here
    ("parent.*", {"parent": "SKIPPED"}, True),
    ("parent.*", {"parent": None}, False),
    ("not(ok.SUCCESS)", {}, True),                   # a check that didn't run did not succeed
    ("any(cmd.TIMEOUT, cmd.PREEMPTED)", {"cmd": "PREEMPTED"}, True),
    ("any(cmd.TIMEOUT, cmd.PREEMPTED)", {"cmd": "OOM"}, False),
    ("all(cmd.HWFAILURE, ok.SUCCESS)", {"cmd": "HWFAILURE", "ok": "SUCCESS"}, True),
    ("all(cmd.HWFAILURE, ok.SUCCESS)", {"cmd": "HWFAILURE", "ok": "FAILED"}, False),
    ("not(not(cmd.SUCCESS))", {"cmd": "SUCCESS"}, True),
])
def test_evaluate_states(text, states, expected):
    assert evaluate(parse(text), states) is expected


@pytest.mark.parametrize("text, counts, expected", [
    ("attempt >= 3", {"attempt": 3}, True),
    ("attempt >= 3", {"attempt": 2}, False),
    ("attempt.restart < 2", {"attempt.restart": 1}, True),
    ("attempt.restart < 2", {"attempt.restart": 2}, False),
    ("attempt.rerun == 0", {}, True),                # a missing counter is 0
    ("attempt.rerun == 0", None, True),
    ("attempt.rerun != 0", {"attempt.rerun": 1}, True),
    ("attempt <= 1", {"attempt": 1}, True),
    ("attempt > 1", {"attempt": 1}, False),
])
def test_evaluate_counters(text, counts, expected):
    assert evaluate(parse(text), {}, counts) is expected


def test_atoms_lists_leaves_in_order():
    node = parse("any(a.SUCCESS, all(b.FAILED, attempt < 2), not(c.*))")
    assert list(atoms(node)) == [State("a", "SUCCESS"), State("b", "FAILED"),
                                 Compare("attempt", "<", 2), State("c", "*")]


# --- property tests ------------------------------------------------------------------------------

NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,6}", fullmatch=True)
SUBJECT = st.one_of(NAME, st.lists(NAME, min_size=2, max_size=3).map(".".join))  # dotted names: rsplit on the last dot
SMALL_SUBJECTS = st.sampled_from(["cmd", "ok", "has_checkpoint", "parent"])   # so random facts hit them


INTEGERS = st.integers(-10**6, 10**6)


def trees(subjects=SUBJECT, values=INTEGERS):
    leaves = st.one_of(
        st.builds(State, subjects, st.sampled_from(STATES + ("*",))),
        st.builds(Compare, st.sampled_from(COUNTERS), st.sampled_from(OPS), values),
    )
    return st.recursive(leaves, lambda children: st.one_of(
        st.builds(lambda arg: Call("not", (arg,)), children),
        st.builds(lambda f, args: Call(f, tuple(args)), st.sampled_from(["any", "all"]),
                  st.lists(children, min_size=1, max_size=4)),
    ), max_leaves=12)


SPACE = st.sampled_from(["", "", " ", "  ", "\t", "\n", " \n "])


def render(node, space=lambda: " ") -> str:
    """Condition text for a tree; `space()` gives the whitespace between tokens."""
    if isinstance(node, State):
        return f"{node.subject}.{node.state}"
    if isinstance(node, Compare):
        return f"{node.counter}{space()}{node.op}{space()}{node.value}"
    args = f"{space()},{space()}".join(render(arg, space) for arg in node.args)
    return f"{node.function}{space()}({space()}{args}{space()})"


REFERENCE_OPS = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def reference(node, states, counts) -> bool:
    """A second, independent reading of the language's meaning."""
    if isinstance(node, State):
        actual = states.get(node.subject)
        if actual is None:
            return False
        return True if node.state == "*" else actual == node.state
    if isinstance(node, Compare):
        return REFERENCE_OPS[node.op](counts.get(node.counter, 0), node.value)
    results = [reference(arg, states, counts) for arg in node.args]
    if node.function == "not":
        assert len(results) == 1
        return not results[0]
    if node.function == "any":
        return True in results
    return False not in results


def subjects_of(node) -> set[str]:
    return {a.subject for a in atoms(node) if isinstance(a, State)}


@settings(max_examples=200, deadline=None)
@given(tree=trees())
def test_render_parse_round_trip(tree):
    assert parse(render(tree)) == tree


@settings(max_examples=150, deadline=None)
@given(tree=trees(), data=st.data())
def test_round_trip_with_random_whitespace(tree, data):
    text = data.draw(SPACE) + render(tree, lambda: data.draw(SPACE)) + data.draw(SPACE)
    assert parse(text) == tree


@settings(max_examples=300, deadline=None)
@given(tree=trees(subjects=SMALL_SUBJECTS, values=st.integers(-1, 5)),
       states=st.dictionaries(SMALL_SUBJECTS, st.one_of(st.none(), st.sampled_from(STATES))),
       counts=st.dictionaries(st.sampled_from(COUNTERS), st.integers(0, 5)))
def test_evaluate_matches_reference(tree, states, counts):
    node = parse(render(tree))
    assert evaluate(node, states, counts) is reference(tree, states, counts)


@settings(max_examples=150, deadline=None)
@given(tree=trees(subjects=SMALL_SUBJECTS), data=st.data())
def test_validate_accepts_exactly_the_named_subjects(tree, data):
    text = render(tree)
    names = subjects_of(tree)
    assert validate(text, names) == tree
    assert validate(text, names | {"extra"}) == tree
    if names:
        missing = data.draw(st.sampled_from(sorted(names)))
        with pytest.raises(ConditionError, match=re.escape(f"unknown name {missing!r}")):
            validate(text, names - {missing})
    has_counter = any(isinstance(a, Compare) for a in atoms(tree))
    if has_counter:
        with pytest.raises(ConditionError, match="can't be used here"):
            validate(text, names, counters=False)
    else:
        assert validate(text, names, counters=False) == tree


FRAGMENTS = ["cmd", ".", "SUCCESS", "FAILED", "*", "attempt", ".rerun", "any", "all", "not", "(", ")", ",",
             "<", "=", ">", "!", "-", "1", "0", " ", "\n", "x"]
TOKENISH = st.lists(st.sampled_from(FRAGMENTS), max_size=20).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=40), TOKENISH))
def test_parse_only_ever_raises_condition_error(text):
    try:
        node = parse(text)
    except ConditionError:
        return
    # What parses renders back to something that parses the same.
    assert parse(render(node)) == node


def test_deep_nesting_is_a_condition_error_not_a_crash():
    text = "not(" * 1000 + "cmd.FAILED" + ")" * 1000
    with pytest.raises(ConditionError, match="nest deeper"):
        parse(text)


# --- exit statuses: cmd.exit, CHECK.exit ----------------------------------------------------------

@pytest.mark.parametrize("text, tree", [
    ("cmd.exit == 100", Compare("cmd.exit", "==", 100)),
    ("converged.exit != 0", Compare("converged.exit", "!=", 0)),
    ("cmd.exit>=64", Compare("cmd.exit", ">=", 64)),
    ("any(cmd.exit == 100, cmd.exit == 104)",
     Call("any", (Compare("cmd.exit", "==", 100), Compare("cmd.exit", "==", 104)))),
    ("not(cmd.exit == 0)", Call("not", (Compare("cmd.exit", "==", 0),))),
    ("all(cmd.FAILED, probe.exit == 3, attempt < 4)",
     Call("all", (State("cmd", "FAILED"), Compare("probe.exit", "==", 3), Compare("attempt", "<", 4)))),
])
def test_exit_statuses_parse_as_comparisons(text, tree):
    assert parse(text) == tree


@pytest.mark.parametrize("text, message", [
    ("cmd.exit == abc", "expected a whole number after cmd.exit =="),
    ("cmd.exit == 1.5", "unexpected '.5'"),
    ("cmd.exit", "cmd.exit is a number: compare it with a whole number (cmd.exit == 0)"),
    ("any(cmd.exit, cmd.FAILED)", "cmd.exit is a number"),
    ("cmd.exit_code == 3", "unknown counter 'cmd.exit_code'"),
    ("cmd.exit_code == 3", "or NAME.exit, the exit status of cmd or of a check"),
])
def test_exit_status_errors_are_clear(text, message):
    with pytest.raises(ConditionError) as err:
        parse(text)
    assert message in str(err.value)


def test_validate_checks_the_name_of_an_exit_status():
    assert validate("any(cmd.exit == 1, probe.exit == 2)", {"cmd", "probe"}) == parse(
        "any(cmd.exit == 1, probe.exit == 2)")
    with pytest.raises(ConditionError, match=re.escape(
            "unknown name 'nosuchcheck' in nosuchcheck.exit (expected one of: cmd, probe)")):
        validate("any(cmd.exit == 1, nosuchcheck.exit == 2)", {"cmd", "probe"})
    with pytest.raises(ConditionError, match=re.escape("exit statuses (parent.exit) can't be used here")):
        validate("parent.exit == 0", {"parent"}, counters=False)


@pytest.mark.parametrize("text, counts, expected", [
    ("cmd.exit == 100", {"cmd.exit": 100}, True),
    ("cmd.exit == 100", {"cmd.exit": 101}, False),
    ("any(cmd.exit == 100, cmd.exit == 104)", {"cmd.exit": 104}, True),
    ("all(cmd.exit != 0, probe.exit == 3)", {"cmd.exit": 2, "probe.exit": 3}, True),
    ("all(cmd.exit != 0, probe.exit == 3)", {"cmd.exit": 2, "probe.exit": 0}, False),
    ("cmd.exit < 0", {"cmd.exit": 0}, False),
    # No exit status (a signal ended the step, a check timed out): every comparison is false.
    ("cmd.exit == 0", {"cmd.exit": None}, False),
    ("cmd.exit != 0", {"cmd.exit": None}, False),
    ("cmd.exit >= 0", {}, False),                       # (not 0 as a missing counter is)
    ("not(cmd.exit == 0)", {"cmd.exit": None}, True),
    ("probe.exit != 1", {"cmd.exit": 1}, False),
])
def test_evaluate_exit_statuses(text, counts, expected):
    assert evaluate(parse(text), {}, counts) is expected
