"""How wide the CLI's tables print.

On a terminal, its width (or ``COLUMNS``, or a command's ``--width``). With
stdout piped into a file, a cron log or ``| grep`` and no ``COLUMNS``,
nothing says how wide: rich would take 80 columns, cut long stage names to
``…`` and fold a wide table's cells a few characters (or one) a line. There
each table takes its natural width instead, a row a line however long, and
a choice of layout made for the room (the status grid naming its axis values
in columns, or counting them by state) plans for ``PIPED_ROOM`` columns.
"""

from __future__ import annotations

import os
import sys

# Wider than any table the CLI prints: a table is never wider than its
# natural width (rich's tables don't expand), so this is "as wide as it is".
NATURAL = 1 << 14

# The room a piped command plans its layout for: a wide terminal's.
PIPED_ROOM = 160


def piped() -> bool:
    """stdout is no terminal, and COLUMNS doesn't say a width."""
    return not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").strip().isdigit()


def console(width: int | None = None):
    """A rich Console for stdout: ``width`` if given (``--width``), else the
    terminal's; piped without COLUMNS, as wide as what it prints."""
    from rich.console import Console

    return Console(width=width or (NATURAL if piped() else None))


def room(console) -> int:
    """The columns a layout may plan for on this console."""
    return PIPED_ROOM if console.width >= NATURAL else console.width
