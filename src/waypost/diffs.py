"""What differs between two sets of settings, in a user's words: for drift
(``waypost plan``, ``find``), and for a restart that resumes work made
under other settings (the step runner, ``status --attempts``)."""

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
