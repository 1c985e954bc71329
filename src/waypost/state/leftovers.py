"""What an attempt whose runner is gone left at work: its step's processes.

A stage directory never has two live attempts. Before a new attempt starts
(its runner, or ``waypost cron`` setting aside what an interrupted one
left), one whose runner is alive is waited for: it records its own end
(``lifecycle.wait_until_gone``). One whose runner is gone but whose step's
process group lives on (``LiveAttempt.orphaned``: its watchdog was killed
too, or could not start) is ended instead, since nobody would ever record
it: SIGTERM, then SIGKILL after its ``kill_grace``. What was done is said in
one line, by the caller and in that attempt's log."""

from __future__ import annotations

import os

from waypost.model import writes
from waypost.scheduler import stepgroup
from waypost.state.lifecycle import Life


def end(life: Life, local_dir: str | None) -> str | None:
    """End the step of the orphaned attempt ``life`` reads (None when there
    is none); the line that says what was done, also appended to that
    attempt's log when ``local_dir`` (the stage directory, on this machine)
    holds it."""
    live = life.live
    if live is None or not live.orphaned:
        return None
    open_attempts = [a for a in (life.marker or {}).get("attempts") or []
                     if isinstance(a, dict) and a.get("state") is None]
    attempt = open_attempts[-1] if open_attempts else {}
    how = stepgroup.end(live.group)
    line = (f"attempt {attempt.get('number', '?')}: {live.where}; ended it ({how}) rather than start another "
            "attempt beside it")
    log = attempt.get("log")
    if local_dir and log and os.path.isfile(os.path.join(local_dir, log)):
        path = os.path.join(local_dir, log)
        try:   # written whole: the log may be on a bucket mount (see writes)
            with open(path, "rb") as f:
                writes.whole(path, f.read() + f"waypost: {line}\n".encode())
        except OSError:
            pass   # the line is said by the caller all the same
    return line
