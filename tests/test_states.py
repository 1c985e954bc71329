"""One list of states: every module that names end states takes them from
waypost.model.states, and the manifest schema, the Slurm map, the conditions
language and the status legend agree with it."""

from __future__ import annotations

import json
from pathlib import Path

from waypost.model import conditions, manifest, states
from waypost.scheduler import slurm
from waypost.state import status


def test_every_module_names_the_same_end_states():
    assert conditions.STATES is states.END_STATES
    assert set(slurm.STATES.values()) <= set(states.END_STATES)
    schema = json.loads((Path(manifest.__file__).parent / "schemas" / "manifest.schema.json").read_text())
    assert schema["properties"]["state"]["enum"] == list(states.END_STATES)
    assert sorted(status.FAILURES) == sorted(states.FAILURES)           # the legend's order, the same set
    assert set(status.SEVERITY) == set(states.END_STATES) | {"corrupt", "interrupted", "running", "missing",
                                                             "adopted"}
    assert set(states.LIFECYCLE) <= set(status.SEVERITY)
