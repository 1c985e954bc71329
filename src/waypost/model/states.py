"""waypost's states, in one place.

- **End states** — how an attempt, and so a stage's series, ended. They are
  what manifests record, what conditions (`cmd.TIMEOUT`, `parent.*`) name,
  what the Slurm adapter maps Slurm's states to, and what the manifest
  schema's ``state`` allows.
- **Lifecycle states** — what a stage directory looks like to the readers
  (status, plan, cron): besides an end state, an attempt at work
  (``running``), one whose runner is gone (``interrupted``), nothing there
  (``missing``), a manifest that can't be used (``corrupt``), files without
  a manifest of this stage (``adopted``).
- **Marks** beside a state: ``given_up`` (no run starts another series until
  ``waypost retry``), ``provisional`` (made over parents that did not
  succeed: redone with them), ``reused`` (taken from another stage
  directory), ``adopted`` (files placed by hand, recorded with ``waypost
  adopt``).
- **Input states** — what a step's input came from when no manifest stands
  for it (its ``inputs`` entry in the manifest, what ``depends`` judges):
  ``ADOPTED`` (a file placed by hand, taken as a success) or ``MISSING``
  (not there).

Every state is a member of one ``StrEnum``, ``State``: a member is its
string (``State.SUCCESS == "SUCCESS"``), so records, JSON and messages carry
the same text as before. The module-level names (``states.SUCCESS``) are the
members, for the callers that name one.
"""

from enum import StrEnum


class State(StrEnum):
    # end states, in the order the docs, messages and the schemas list them
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    HWFAILURE = "HWFAILURE"
    OOM = "OOM"
    CANCELLED = "CANCELLED"
    SKIPPED = "SKIPPED"     # an upstream end that ``depends`` did not accept blocked it
    # lifecycle states
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    MISSING = "missing"
    CORRUPT = "corrupt"
    ADOPTED = "adopted"
    # input states: an input without a manifest of the stage that made it
    INPUT_ADOPTED = "ADOPTED"
    INPUT_MISSING = "MISSING"


SUCCESS, SKIPPED = State.SUCCESS, State.SKIPPED
#: every end state, in the order the docs and messages list them
END_STATES = (SUCCESS, State.FAILED, State.TIMEOUT, State.PREEMPTED, State.HWFAILURE, State.OOM, State.CANCELLED,
              SKIPPED)
#: the end states of an attempt that ran and did not succeed
FAILURES = tuple(s for s in END_STATES if s not in (SUCCESS, SKIPPED))

RUNNING, INTERRUPTED, MISSING, CORRUPT, ADOPTED = (State.RUNNING, State.INTERRUPTED, State.MISSING, State.CORRUPT,
                                                   State.ADOPTED)
LIFECYCLE = (RUNNING, INTERRUPTED, MISSING, CORRUPT, ADOPTED)
INPUT_ADOPTED, INPUT_MISSING = State.INPUT_ADOPTED, State.INPUT_MISSING
#: the states of an input's producer that make it sound (a success, or a file placed by hand)
SOUND_INPUTS = (SUCCESS, INPUT_ADOPTED)
MARKS = ("given_up", "provisional", "reused", "adopted")
