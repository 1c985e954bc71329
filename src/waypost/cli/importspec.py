"""``waypost import maestro|merlin SPEC``: a study spec as a pipeline."""

from __future__ import annotations

import os

from waypost.ops.imports.write import import_spec


def cmd_import(args) -> int:
    done = import_spec(args.kind, args.spec, args.to, pgen=getattr(args, "pgen", None),
                       pargs=getattr(args, "pargs", None), samples=getattr(args, "samples", None))
    points = f", {done.points} point(s)" if done.points else ""
    print(f"wrote {', '.join(done.written)}: {len(done.rules)} rule(s) ({', '.join(done.rules)}){points}")
    for note in done.notes:
        print(f"note: {note}")
    where = "" if os.path.abspath(args.to) == os.getcwd() else f"cd {args.to} && "
    print(f"next: {where}snakemake --profile local -n   (then without -n; `waypost status` shows the study)")
    return 0
