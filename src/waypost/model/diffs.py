"""What differs between two sets of settings, in a user's words: for drift
(``waypost plan``, ``find``), and for a restart that resumes work made
under other settings (``resumed_work``: the step runner and ``plan``)."""

from __future__ import annotations

import json


def settings_diff(old: dict, new: dict) -> list[str]:
    """``key: old → new`` for each setting that differs (nested keys dotted)."""
    out = []

    def walk(a, b, prefix):
        for key in sorted(set(a) | set(b), key=str):
            x, y = a.get(key, "∅"), b.get(key, "∅")
            if isinstance(x, dict) and isinstance(y, dict):
                walk(x, y, f"{prefix}{key}.")
            elif x != y:
                out.append(f"{prefix}{key}: {json.dumps(x) if x != '∅' else x} → {json.dumps(y) if y != '∅' else y}")
    walk(old or {}, new or {}, "")
    return out


def resumed_work(attempts: list[dict], recorded: dict | None, now: dict) -> tuple[int, list[str]] | None:
    """The last attempt of ``attempts`` that did the step's work, and what
    differs between the settings it ran with and ``now``, when they differ
    (``recorded``: the manifest's settings, for an attempt that recorded
    none of its own); None when nothing differs or nothing is known."""
    worked = next((a for a in reversed(attempts) if a.get("action") in ("cmd", "restart", "rerun")), None)
    then = None if worked is None else worked.get("settings", recorded)
    differs = settings_diff(then, now) if then is not None else []
    return (worked.get("number"), differs) if differs else None
