"""The condition language of cues and funnels: ``any`` / ``all`` / ``not``.

Grammar (parsed by hand, never ``eval``-ed)::

    expr    := call | atom
    call    := ("any" | "all" | "not") "(" expr ("," expr)* ")"     # not takes one
    atom    := NAME "." STATE          e.g. cmd.TIMEOUT, has_checkpoint.SUCCESS, parent.FAILED
             | NAME "." "*"            NAME ended in any state
             | COUNTER OP INTEGER      e.g. attempt >= 3, attempt.restart < 2
             | NAME ".exit" OP INTEGER e.g. cmd.exit == 100, converged.exit != 0
    COUNTER := attempt | attempt.restart | attempt.rerun | series
    OP      := == | != | < | <= | > | >=

``NAME.exit`` is the exit status of the attempt's step (``cmd``) or of one
of its checks. A step or check that a signal ended (or a check past its
time limit) has no exit status: then every comparison of it is false,
``!=`` included (``not(cmd.exit == 0)`` holds, ``cmd.exit != 0`` does not).

A parsed condition is a small tree of tuples; ``validate`` checks its names
against what a context offers (so a typo is a config error before any job
runs) and ``evaluate`` computes it from a mapping of facts.
"""

from __future__ import annotations

import operator
import re
from collections import namedtuple

from waypost.model.errors import WaypostError
from waypost.model.states import END_STATES as STATES

COUNTERS = ("attempt", "attempt.restart", "attempt.rerun", "series")
EXIT = ".exit"   # NAME.exit: the exit status of the step (cmd) or of a check
FUNCTIONS = ("any", "all", "not")
OPERATORS = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge,
             "<": operator.lt, ">": operator.gt}

TOKEN = re.compile(r"""
    \s*(?:
      (?P<op>==|!=|<=|>=|<|>)
    | (?P<punct>[(),])
    | (?P<int>-?\d+)
    | (?P<word>[A-Za-z_][A-Za-z0-9_-]*(?:\.(?:[A-Za-z_][A-Za-z0-9_-]*|\*))*)
    )""", re.VERBOSE)


class ConditionError(WaypostError, ValueError):
    """A condition that cannot be parsed or names something unknown."""


# The nodes of a parsed condition. Named tuples, not dataclasses: the step
# runner imports this module at every start, and dataclasses cost it ~10 ms.
State = namedtuple("State", "subject state")            # subject.STATE (state "*": any state)
Compare = namedtuple("Compare", "counter op value")     # counter OP integer (a counter, or NAME.exit)
Call = namedtuple("Call", "function args")              # any/all/not(args...)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ConditionError(f"unexpected {text[pos:].strip()[:20]!r} at position {pos}")
        kind = m.lastgroup
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


def parse(text: str):
    if not isinstance(text, str) or not text.strip():
        raise ConditionError("empty condition")
    tokens = _tokens(text)
    node, pos = _parse_expr(tokens, 0, text)
    if pos != len(tokens):
        raise ConditionError(f"unexpected {tokens[pos][1]!r} after a complete condition")
    return node


def _expect(tokens, pos, value, text):
    if pos >= len(tokens) or tokens[pos][1] != value:
        found = tokens[pos][1] if pos < len(tokens) else "end of text"
        raise ConditionError(f"expected {value!r}, found {found!r}")
    return pos + 1


MAX_DEPTH = 32


def _parse_expr(tokens, pos, text, depth=0):
    if depth > MAX_DEPTH:
        raise ConditionError(f"conditions nest deeper than {MAX_DEPTH} calls")
    if pos >= len(tokens):
        raise ConditionError("condition ends too early")
    kind, value = tokens[pos]
    if kind != "word":
        raise ConditionError(f"unexpected {value!r}")
    following = tokens[pos + 1] if pos + 1 < len(tokens) else None
    if following and following[1] == "(":
        return _parse_call(tokens, pos, text, depth)
    if following and following[0] == "op":
        return _parse_compare(tokens, pos)
    return _parse_state(value), pos + 1


def _parse_call(tokens, pos, text, depth):
    """``FUNCTION(condition, ...)`` from ``tokens[pos]`` (the function's name)."""
    value = tokens[pos][1]
    if value not in FUNCTIONS:
        raise ConditionError(f"unknown function {value!r} (expected one of: {', '.join(FUNCTIONS)})")
    pos += 2
    args = []
    while True:
        node, pos = _parse_expr(tokens, pos, text, depth + 1)
        args.append(node)
        if pos < len(tokens) and tokens[pos][1] == ",":
            pos += 1
            continue
        pos = _expect(tokens, pos, ")", text)
        break
    if value == "not" and len(args) != 1:
        raise ConditionError(f"not() takes one condition, got {len(args)}")
    return Call(value, tuple(args)), pos


def _parse_compare(tokens, pos):
    """``COUNTER OP NUMBER`` (a counter, or ``NAME.exit``) from ``tokens[pos]``."""
    value, op = tokens[pos][1], tokens[pos + 1][1]
    if value not in COUNTERS and not _is_exit(value):
        raise ConditionError(f"unknown counter {value!r} (expected one of: {', '.join(COUNTERS)}); "
                             f"or NAME{EXIT}, the exit status of cmd or of a check")
    if pos + 2 >= len(tokens) or tokens[pos + 2][0] != "int":
        raise ConditionError(f"expected a whole number after {value} {op}")
    return Compare(value, op, int(tokens[pos + 2][1])), pos + 3


def _parse_state(value: str) -> State:
    """``NAME.STATE`` (or ``NAME.*``): one word."""
    if "." not in value:
        raise ConditionError(f"{value!r} is not a condition (expected NAME.STATE, a counter comparison, "
                             f"or {', '.join(FUNCTIONS)}(...))")
    if _is_exit(value):
        raise ConditionError(f"{value} is a number: compare it with a whole number ({value} == 0)")
    subject, state = value.rsplit(".", 1)
    if state != "*" and state not in STATES:
        raise ConditionError(f"unknown state {state!r} in {value!r} (expected one of: {', '.join(STATES)} or *)")
    return State(subject, state)


def _is_exit(word: str) -> bool:
    return word.endswith(EXIT) and len(word) > len(EXIT)


def exit_subject(atom) -> str | None:
    """The step or check whose exit status a comparison reads (None: a counter's)."""
    return atom.counter[:-len(EXIT)] if isinstance(atom, Compare) and _is_exit(atom.counter) else None


def atoms(node):
    if isinstance(node, Call):
        for arg in node.args:
            yield from atoms(arg)
    else:
        yield node


def validate(text: str, subjects: set[str], counters: bool = True):
    """Parse and check every name; returns the parsed tree."""
    node = parse(text)
    for atom in atoms(node):
        subject = atom.subject if isinstance(atom, State) else exit_subject(atom)
        if subject is not None and subject not in subjects:
            written = f"{atom.subject}.{atom.state}" if isinstance(atom, State) else atom.counter
            raise ConditionError(f"unknown name {subject!r} in {written} "
                                 f"(expected one of: {', '.join(sorted(subjects))})")
        if isinstance(atom, Compare) and not counters:
            what = "exit statuses" if subject is not None else "counters"
            raise ConditionError(f"{what} ({atom.counter}) can't be used here")
    return node


def evaluate(node, states: dict[str, str | None], counts: dict[str, int] | None = None) -> bool:
    """``states``: subject → its state (None: it didn't run); ``counts``:
    counter → value, and ``NAME.exit`` → an exit status (None, or absent:
    none, and every comparison of it is false)."""
    if isinstance(node, Call):
        values = (evaluate(arg, states, counts) for arg in node.args)
        if node.function == "any":
            return any(values)
        if node.function == "all":
            return all(values)
        return not next(values)
    if isinstance(node, State):
        actual = states.get(node.subject)
        return actual is not None and (node.state == "*" or actual == node.state)
    if exit_subject(node) is not None:
        status = (counts or {}).get(node.counter)
        return status is not None and OPERATORS[node.op](status, node.value)
    return OPERATORS[node.op]((counts or {}).get(node.counter, 0), node.value)
