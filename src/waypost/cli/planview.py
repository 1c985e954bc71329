"""``waypost plan``'s tables and lines: what ``cmd_plan`` computed (the
same dict ``--json`` prints), rendered for a terminal."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from waypost.cli import status as clistatus

# `waypost plan` names the instances of a row of the next run up to this many.
NAMED_INSTANCES = 10

#: The drift tables, in order: a drifted group's kind → the table's title.
DRIFT_TITLES = {"done": "done, but made with other settings, code or inputs than now "
                        "(kept in presence mode; `waypost rerun --drifted` redoes them, `waypost rerun STAGE` one)",
                "unfinished": "not done, and the next series goes on with work made under other settings",
                "given_up": "given up, and its settings changed since (no run tries it again until `waypost retry`)"}


def render(console, report: dict, axis: dict | None, all_instances: bool = False) -> None:
    """The next run, the reused stages it waits for, the drift and the
    edited inputs (``report``: cmd_plan's dict; ``axis``: the config's axis
    words, None for a workflow without one: no column for it)."""
    _next_run(console, report["next_run"], axis, all_instances)
    for why in report["waiting"]:
        console.print(escape(f"not in this run: {why}; it and what needs it wait for it"), soft_wrap=True)
    for kind, title in DRIFT_TITLES.items():
        shown = [g for g in report["drift_groups"] if _drift_kind(g) == kind]
        if shown:
            console.print(_drift_table(title, shown, axis))
    for line in report["input_edits"]:
        console.print(escape(line), soft_wrap=True)
    code_unknown = report["code_unknown"]
    if not report["drift"]:
        console.print("no drift in settings or inputs" if code_unknown else
                      "no drift: every done stage was made with the current settings and code")
    if code_unknown:
        console.print(f"code version unknown (recorded before per-stage code versions): {code_unknown} done "
                      f"stage(s)")


def _next_run(console, rows: list[dict], axis: dict | None, all_instances: bool) -> None:
    """A row per stage and reason: its jobs, and their instances when few."""
    if not rows:
        console.print("next run: nothing to do")
        return
    jobs = sum(g["count"] for r in rows for g in r["reasons"])
    table = Table(title=f"next run: {jobs:,} job(s)", title_justify="left")
    named = any(r["instances"] for r in rows)   # (a column for instances when a stage has them)
    for column in ("experiment", *([axis["word"]] if axis else []), "stage", "jobs",
                   *(["instances"] if named else []), "why"):
        table.add_column(column, overflow="fold", justify="right" if column == "jobs" else "left")
    unnamed = 0
    for r in rows:
        for g in r["reasons"]:
            names = g["instances"]
            if len(names) > NAMED_INSTANCES and not all_instances:
                unnamed += 1
                names_text = "…"
            else:
                names_text = ", ".join(sorted(names, key=clistatus.natural))
            table.add_row(r["experiment"], *([clistatus.pair_heading(r["pair"], axis)] if axis else []),
                          escape(r["stage"]), f"{g['count']:,}", *([escape(names_text)] if named else []),
                          escape(g["why"]))
    console.print(table)
    if unnamed:
        console.print(f"…: more than {NAMED_INSTANCES} instances; `waypost plan --all-instances` names them all")


def _drift_kind(group: dict) -> str:
    return "given_up" if group.get("given_up") else "unfinished" if group["unfinished"] else "done"


def _drift_table(title: str, groups: list[dict], axis: dict | None) -> Table:
    """Cells of a stage with the same differences: one row, with their count."""
    table = Table(title=title, title_justify="left")
    for column in ("experiment", *([axis["word"]] if axis else []), "stage", "made", "what differs"):
        table.add_column(column, overflow="fold")
    for g in groups:
        made = " … ".join(dict.fromkeys(m[:16].replace("T", " ") for m in g["made"]))
        table.add_row(", ".join(g["experiments"]),
                      *([", ".join(clistatus.pair_heading(p, axis) for p in g["pairs"])] if axis else []),
                      escape(g["stage"] + (f" [{_names_shown(g['instances'])}]" if g["instances"] else "")
                             + (f" ×{g['count']}" if g["count"] > 1 else "")),
                      made + (f" (reused from {', '.join(g['reused_from'])})" if g["reused_from"] else ""),
                      escape("\n".join(g["what"])))
    return table


def _names_shown(names: list[str], shown: int = 8) -> str:
    """Instance names for a table cell: the first few, then how many more."""
    names = sorted(names, key=clistatus.natural)
    return ", ".join(names[:shown]) + (f", … +{len(names) - shown}" if len(names) > shown else "")
