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
"""

SUCCESS = "SUCCESS"
SKIPPED = "SKIPPED"     # an upstream end that ``depends`` did not accept blocked it
#: every end state, in the order the docs and messages list them
END_STATES = (SUCCESS, "FAILED", "TIMEOUT", "PREEMPTED", "HWFAILURE", "OOM", "CANCELLED", SKIPPED)
#: the end states of an attempt that ran and did not succeed
FAILURES = tuple(s for s in END_STATES if s not in (SUCCESS, SKIPPED))

RUNNING, INTERRUPTED, MISSING, CORRUPT, ADOPTED = "running", "interrupted", "missing", "corrupt", "adopted"
LIFECYCLE = (RUNNING, INTERRUPTED, MISSING, CORRUPT, ADOPTED)
MARKS = ("given_up", "provisional", "reused", "adopted")
