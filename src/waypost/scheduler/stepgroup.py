"""A step's process group on this host: what the running marker records of
it, which of its processes still live, and how they are ended.

The runner starts each attempt's command in a session (and so a process
group) of its own; everything the command starts stays in that group unless
it leaves on purpose (``setsid``, a daemon). The group's id is its first
process's pid, so a record of the group also keeps that process's start
time (``/proc/PID/stat``, in clock ticks since boot): the pid can be used
again once the group is gone, and a group led by a later process is not the
step's.

The runner imports this at every step: ``os``, ``signal`` and ``time`` only."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from waypost.model.records import StepGroup

# How often ``end`` looks whether the group is gone, and how long it waits
# for the processes of a group it sent SIGKILL.
POLL_S = 0.1
KILLED_WAIT_S = 30.0


def _stat(pid: int) -> tuple[bytes, int, int] | None:
    """(state, process group, start time) of ``pid``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2]), int(fields[19])


def record(pid: int, grace: float) -> StepGroup:
    """What the running marker keeps of the group ``pid`` leads: its id,
    its leader's start time and the seconds between SIGTERM and SIGKILL
    that whoever ends it gives it (the attempt's ``kill_grace``)."""
    found = _stat(pid)
    return {"pgid": pid, "start": found[2] if found else None, "kill_grace": grace}


def members(group: dict | None) -> list[int]:
    """The live (not zombie) processes of the recorded ``group`` on this
    host; [] when it is gone, or when its id now names another group."""
    pgid = (group or {}).get("pgid")
    if not isinstance(pgid, int) or pgid <= 1:
        return []
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    leader = _stat(pgid)
    if leader and leader[2] != group.get("start"):
        # A process with the group's id that is not its leader: the id was
        # free (the step's group gone) when it was given again.
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat and stat[1] == pgid and stat[0] != b"Z":
                found.append(int(entry))
    return sorted(found)


def end(group: dict, grace: float | None = None) -> str:
    """End what lives of ``group``: SIGTERM, then SIGKILL to what is left
    after ``grace`` seconds (the recorded ``kill_grace`` by default), and
    wait until none of it is left (at most ``KILLED_WAIT_S`` after SIGKILL).
    Says how it ended: "SIGTERM", "SIGKILL after N s", or "gone already"."""
    if grace is None:
        grace = float(group.get("kill_grace") or 0)
    if not members(group):
        return "gone already"
    how, signum = "SIGTERM", signal.SIGTERM
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(group["pgid"], signum)
        except ProcessLookupError:
            return how
        except PermissionError:
            return f"{how} not allowed (another user's processes)"
        while members(group):
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        else:
            return how
        if signum == signal.SIGKILL:
            # Killed, but held in the kernel (a dead network mount): it runs
            # no code of its own again, so it is not waited for forever.
            return f"{how}; {len(members(group))} still held in the kernel after {KILLED_WAIT_S:g} s"
        how, signum = f"SIGKILL after {grace:g} s", signal.SIGKILL
        deadline = time.monotonic() + KILLED_WAIT_S


def describe(group: dict, pids: list[int]) -> str:
    """The group as the lines that name it say it."""
    return f"process group {group.get('pgid')} (pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids))})"
