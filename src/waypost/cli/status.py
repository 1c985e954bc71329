"""``waypost status``: the grid of experiments × pairs × stages in the
terminal (or as JSON, or one HTML page), the attempts of some stages, the
directories not done (``--failed``) and the archives' sizes (``--sizes``)."""

from __future__ import annotations

import json
import sys

from waypost.cli.args import load_config, reach, workflow_facts
from waypost.cli.statusgrid import label, pair_heading, render_status
from waypost.cli.statusrows import (
    failed_rows,
    natural,
    render_attempt_summary,
    render_attempts,
    render_failed,
    stage_cells,
    when,
)
from waypost.model import config as wconfig
from waypost.model import graph

#: ``label``, ``pair_heading``, ``when`` and ``natural`` serve the other commands' tables too.
__all__ = ["cmd_status", "label", "natural", "only_instances", "pair_heading", "render_sizes", "when"]


def cmd_status(args) -> int:
    from waypost.state import status

    cfg = load_config(args)
    if args.all_attempts and not args.attempts:
        raise wconfig.ConfigError("--all-attempts goes with --attempts STAGE (the stages whose attempts to list)")
    wconfig.check_names(cfg, args.experiment, args.pair, [*(args.attempts or []), *(args.failed or [])])
    reach(cfg["root"])
    if args.sizes:
        return render_sizes(cfg, args)
    facts = workflow_facts(args)
    grid = status.collect(cfg, graph.in_experiments_slot(facts), args.experiment, args.pair)
    if args.instance:
        only_instances(cfg, grid, args.instance, args.experiment)
    if args.failed is not None:
        _show_failed(grid, args)
    elif args.attempts:
        _show_attempts(cfg, grid, args)
    elif args.json:
        _write_json(grid)
    elif args.html:
        _write_page(cfg, grid, args.html)
    else:
        render_status(grid)
    return 0


def _write_json(data) -> None:
    """``data`` as JSON on stdout. Indented for a terminal; compact when
    piped, and then through json.dumps's C encoder, which json.dump never
    uses (8,000 stages: 4 MB in 0.05 s, not 7.5 MB in 0.25 s)."""
    sys.stdout.write(json.dumps(data, indent=2 if sys.stdout.isatty() else None) + "\n")


def _show_failed(grid: dict, args) -> None:
    """``status --failed``: the directories not done, listed or as JSON."""
    rows = failed_rows(grid, args.failed)
    if args.json:
        _write_json({"root": grid["root"], "failed": rows})
    else:
        render_failed(grid, rows, args.failed)


def _show_attempts(cfg: dict, grid: dict, args) -> None:
    """``status --attempts STAGE``: each directory's attempts (a summary
    line each where there are several, unless ``--all-attempts``), or the
    grid as JSON with every attempt."""
    if args.json:   # every attempt, and the archives' manifests (read for these stages only)
        _attach_archives(cfg, [cell for stage in args.attempts for *_, cell in stage_cells(grid, stage)])
        _write_json(grid)
        return
    for stage in args.attempts:
        cells = list(stage_cells(grid, stage))
        if args.all_attempts or len(cells) == 1:
            _attach_archives(cfg, [cell for *_, cell in cells])
            render_attempts(grid, [stage])
        else:
            render_attempt_summary(grid, stage, cells)


def _write_page(cfg: dict, grid: dict, path: str) -> None:
    """``status --html FILE``: the grid as one page."""
    from waypost.cli import statuspage
    # a stage's page shows its archived runs too
    _attach_archives(cfg, [sub for columns in grid["experiments"].values() for cells in columns.values()
                           for cell in cells.values() for sub in [cell, *cell.get("instances", {}).values()]])
    with open(path, "w", encoding="utf-8") as f:
        f.write(statuspage.render(grid))
    print(f"wrote {path}")


def only_instances(cfg: dict, grid: dict, patterns: list[str], experiment: str | None = None) -> None:
    """``status --instance``: the grid's cells of those instances alone (a
    stage with none of them, or without instances, left out), each stage's
    state and attempts over them. A name that is no instance there, nor a
    point of the grid, is the usual error."""
    from waypost.state import status

    found: dict[str, set] = {}   # stage → its instances
    for columns in grid["experiments"].values():
        for cells in columns.values():
            for stage, cell in cells.items():
                found.setdefault(stage, set()).update(cell.get("instances") or {})
    wconfig.check_instance_names(cfg, patterns, experiment, found)
    for columns in grid["experiments"].values():
        for cells in columns.values():
            for stage, cell in list(cells.items()):
                kept = {name: cells[stage]["instances"][name]
                        for name in wconfig.match_instances(patterns, cell.get("instances") or {})}
                if not kept:
                    del cells[stage]
                    continue
                cells[stage] = {**cell, "instances": kept, "state": status.worst([c["state"] for c in kept.values()]),
                                "attempts": sum(c.get("attempts", 0) for c in kept.values())}


def _attach_archives(cfg: dict, cells: list[dict]) -> None:
    """Each cell's archived runs (``archives``: see status.archived_runs)."""
    from waypost import stores
    from waypost.state import status

    tree = stores.store_for(cfg["root"])
    for cell in cells:
        cell["archives"] = status.archived_runs(tree, cell["path"])


def render_sizes(cfg: dict, args) -> int:
    """``status --sizes``: the archives of each stage dir, how many and how big."""
    from rich.markup import escape
    from rich.table import Table

    from waypost.cli import termwidth
    from waypost.ops import prune

    rows = prune.sizes(cfg, args.experiment, args.pair)
    total = sum(r["bytes"] for r in rows)
    if args.json:
        _write_json({"root": cfg["root"], "stages": rows, "archives": sum(r["archives"] for r in rows),
                     "bytes": total})
        return 0
    console = termwidth.console()
    if not rows:
        console.print(f"no archived workspaces (.attempts/) under {escape(cfg['root'])}")
        return 0
    table = Table(title=f"archived workspaces (.attempts/) under {escape(cfg['root'])}", title_justify="left")
    for column in ("experiment", wconfig.axis_words(cfg)[0], "stage", "archives", "size"):
        table.add_column(column, justify="right" if column in ("archives", "size") else "left")
    for r in rows:
        stage = r["stage"] + (f"/{r['instance']}" if r["instance"] else "")
        table.add_row(r["experiment"], pair_heading(r["pair"], wconfig.derived(cfg).axis_words()), stage, str(r["archives"]),
                      prune.human(r["bytes"]))
    table.add_row("total", "", "", str(sum(r["archives"] for r in rows)), prune.human(total), style="bold")
    console.print(table)
    console.print("`waypost prune -n` lists what the retention lets go")
    return 0
