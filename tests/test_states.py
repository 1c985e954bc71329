"""One list of states: every module that names end states takes them from
waypost.model.states (one StrEnum), and both schemas, the Slurm map, the
conditions language and the status legend agree with it."""

from __future__ import annotations

import json
from pathlib import Path

from waypost.model import conditions, manifest, states
from waypost.model.states import State
from waypost.scheduler import slurm
from waypost.state import status

SCHEMAS = Path(manifest.__file__).parent.parent / "schemas"


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def test_every_module_names_the_same_end_states():
    assert conditions.STATES is states.END_STATES
    assert set(slurm.STATES.values()) <= set(states.END_STATES)
    assert sorted(status.FAILURES) == sorted(states.FAILURES)           # the legend's order, the same set
    assert set(status.SEVERITY) == set(states.END_STATES) | {"corrupt", "interrupted", "running", "missing",
                                                             "adopted"}
    assert set(states.LIFECYCLE) <= set(status.SEVERITY)


def test_the_enum_is_the_end_states_of_both_schemas():
    manifest_schema = _schema("manifest.schema.json")["properties"]["state"]["enum"]
    records_schema = _schema("records.schema.json")["$defs"]["end_state"]["enum"]
    assert manifest_schema == records_schema == list(states.END_STATES)
    assert all(isinstance(s, State) for s in states.END_STATES)


def test_every_member_has_one_group():
    groups = [states.END_STATES, states.LIFECYCLE, (states.INPUT_ADOPTED, states.INPUT_MISSING)]
    assert sorted(s for group in groups for s in group) == sorted(State)


def test_a_member_is_its_string_on_disk_and_in_messages():
    """The records stay byte-compatible: a member serialises, formats and
    compares as the plain string it replaced."""
    assert json.dumps({"state": State.SUCCESS, State.RUNNING: 1}) == '{"state": "SUCCESS", "running": 1}'
    assert f"{State.INPUT_MISSING}" == "MISSING" and str(State.ADOPTED) == "adopted"
    assert State("TIMEOUT") is states.END_STATES[2] and {"OOM": 1}[State.OOM] == 1
