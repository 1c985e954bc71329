"""A mistake in a ``wp.*`` helper, said in one line while Snakemake reads
the Snakefile.

Snakemake prints an exception raised as it reads a Snakefile with the
frames it went through, waypost's own included, as if waypost had a bug.
A helper called from the Snakefile's own code (a rule's ``output:``, a
line at the top level) instead stops the run with one line naming the
Snakefile's line and the mistake; nothing has run. Called from a function
(an input function Snakemake calls while it builds the jobs), the error is
raised as it is, and Snakemake reports it for that job as it reports any
input function's.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import NoReturn

from waypost.model.errors import WaypostError


def snakefile_line() -> tuple[str, int] | None:
    """(Snakefile, line) of the Snakefile code that called in, when that
    is the file's own top-level code (what Snakemake runs as it reads it);
    None when the innermost Snakefile frame is a function's."""
    frame = sys._getframe(1)
    while frame is not None:
        linemaps = getattr(frame.f_globals.get("workflow"), "linemaps", None)
        name = frame.f_code.co_filename
        if isinstance(linemaps, dict) and name in linemaps:
            if frame.f_code.co_name != "<module>":
                return None
            return name, linemaps[name].get(frame.f_lineno, frame.f_lineno)
        frame = frame.f_back
    return None


def refuse(mistake: Exception | str, where: str = "") -> NoReturn:
    """Stop reading the Snakefile for a mistake (in the config: its file, its
    key and what is wrong, in full; in the Snakefile: ``where``, its line):
    said on stderr as waypost's, and no traceback lines (Snakemake prints
    those under an exception raised here, as if waypost had a bug); nothing
    has run."""
    print(f"waypost: {where + ': ' if where else ''}{mistake}", file=sys.stderr)
    raise SystemExit(1)


def refuse_while_reading(mistake: WaypostError) -> None:
    """Stop with ``mistake`` in one line where the Snakefile's own code made
    it; return (for the caller to raise it) where a function did."""
    where = snakefile_line()
    if where is None:
        return
    path, line = where
    shown = os.path.relpath(path)
    refuse(mistake, f"{path if shown.startswith('..') else shown}, line {line}")


def in_one_line(helper):
    """A ``wp.*`` helper whose mistakes (``WaypostError``) are said in one
    line when the Snakefile's code called it (``refuse_while_reading``)."""
    @functools.wraps(helper)
    def said(*args, **kwargs):
        try:
            return helper(*args, **kwargs)
        except WaypostError as mistake:
            refuse_while_reading(mistake)
            raise
    return said
