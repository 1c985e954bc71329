"""``waypost status``'s plain listings of stage directories: their attempts
(``--attempts STAGE``: each attempt's table, or one line a directory when
there are several), those not done (``--failed``), and the times and sort
order the commands' tables share."""

from __future__ import annotations

import sys

from waypost.cli.statusgrid import label, pair_heading
from waypost.model import layout, records


def stage_cells(grid: dict, stage: str):
    """(experiment, pair, instance, cell) of each directory of a stage in the grid."""
    for exp, columns in grid["experiments"].items():
        for p, cells in columns.items():
            if stage not in cells:
                continue
            cell = cells[stage]
            for name, sub in (cell.get("instances") or {None: cell}).items():
                yield exp, p, name, sub


def render_attempts(grid: dict, stages: list[str]) -> None:
    """The attempt history of some stages: a row per attempt (action, state,
    exit, checks, duration and runtime limit in seconds, the decision taken
    after it), then why each series began and each decision was taken."""
    from rich.markup import escape
    from rich.table import Table

    from waypost.cli import termwidth

    console = termwidth.console()
    for stage in stages:
        for exp, p, instance, cell in stage_cells(grid, stage):
            heading = pair_heading(p, grid.get("axis")) if grid.get("axis") or p != layout.ALL_PAIRS else None
            where = "/".join(x for x in (heading, exp, stage, instance) if x)
            title = f"{where}: {label(cell)[0]}" + (f" — {cell['reason']}" if cell.get("reason") else "")
            if cell.get("next_series_after") and not cell.get("given_up"):
                title += f" — next series not before {cell['next_series_after'][:19].replace('T', ' ')} UTC"
            table = Table(title=escape(title), title_justify="left")
            series = len({a.get("series", 1) for a in cell.get("history", [])}) > 1
            columns = ["#"] + (["series"] if series else []) + ["action", "state", "exit", "checks", "secs",
                                                               "limit", "next", "log"]
            for column in columns:
                table.add_column(column, no_wrap=column not in ("checks", "log"), overflow="fold")
            reasons = []
            for a in cell.get("history", []):
                table.add_row(*_attempt_row(a, series, escape))
                reasons += _attempt_reasons(a)
            console.print(table)
            for line in reasons:
                console.print(escape(line), soft_wrap=True)
            for run in cell.get("archives", []):
                what = (f"{run['state']}, {run['attempts']} attempt{'s' if run['attempts'] != 1 else ''}, "
                        f"made {when(run['created'])}" + (" (reused)" if run["reused_from"] else "")
                        if run["state"] else run.get("error") or "no manifest")
                console.print(escape(f"archived {run['archive']}: {what}"), soft_wrap=True)


def _attempt_row(a: dict, series: bool, escape) -> list[str]:
    """An attempt's row of ``render_attempts``' table (``series``: with its column)."""
    exit_text = f"sig {a['signal']}" if a.get("signal") else str(a.get("exit_code", ""))
    checks = " ".join(f"{k}:{'ok' if v == 'SUCCESS' else v}" for k, v in (a.get("checks") or {}).items())
    limit = a.get("runtime_limit_s")
    row = [str(a["number"])] + ([str(a.get("series", 1))] if series else [])
    return row + [a.get("action", ""), a.get("state") or "?", exit_text, checks,
                  "–" if a.get("duration_s") is None else f"{a['duration_s']:.1f}", "–" if limit is None else f"{limit:g}",
                  (a.get("decision") or {}).get("action", ""), escape(a.get("log") or "")]


def _attempt_reasons(a: dict) -> list[str]:
    """The lines under the table that say why of an attempt: why its series
    began, the work of other settings it went on with, a scheduler's job's end
    its runner never saw, the decision taken after it."""
    reasons = []
    if a.get("why") and a.get("series", 1) > 1:
        reasons.append(f"  #{a['number']} began series {a['series']} with {a.get('action')}: {a['why']}")
    if a.get("resumes"):
        reasons.append(f"  #{a['number']} went on with attempt {a['resumes']['attempt']}'s work, made "
                       f"under other settings: {'; '.join(a['resumes']['settings'])}")
    if a.get("error") and records.job_of(a) and not a.get("log"):   # a scheduler's job its runner never saw
        reasons.append(f"  #{a['number']}: {a['error']}")
    decision = a.get("decision") or {}
    if decision:
        how = ", ".join(([f"{decision['rerun']} workspace"] if decision.get("rerun") else [])
                        + ([f"after {decision['delay_s']:g} s"] if decision.get("delay_s") else []))
        reasons.append(f"  #{a['number']} → {decision.get('action')}" + (f" ({how})" if how else "")
                       + f": {decision.get('reason') or ''}")
    return reasons


def _where(grid: dict, pair: str, instance: str | None) -> str:
    """A directory of a stage of an experiment: its axis value (not the
    funnels' slot) and instance, ``en-xa/0``; "-" for the stage's one."""
    axis = grid.get("axis")
    value = pair_heading(pair, axis) if pair != layout.ALL_PAIRS else None
    return "/".join(x for x in (value, instance) if x) or "-"


def _aligned(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Rows as lines of left-aligned columns (the last one as long as it is):
    plain text, one line a row, to read or to grep, however many."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [indent + "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]).rstrip()
            for row in rows]


def _counts_label(cells: list[dict]) -> str:
    """How many of these directories are in each state, worst first, as a
    cell of a stage with instances says it (``timeout 1 · done 3``)."""
    from waypost.state import status
    return status.label({"instances": {str(i): {"state": c["state"], "given_up": c.get("given_up")}
                                       for i, c in enumerate(cells)}})[0]


def _one_of(grid: dict, rows: list[dict]) -> str:
    """The option that picks one of these directories: --instance, or the axis's."""
    if any(r.get("instance") for r in rows):
        return "--instance NAME"
    word = (grid.get("axis") or {}).get("word", "pair")
    return f"--{word} {word.upper()}"


def failed_rows(grid: dict, stages: list[str] | None = None) -> list[dict]:
    """``status --failed``: each stage or instance directory (of ``stages``,
    default all) that is not done, neither running nor never run
    (status.not_done), with its state and why; per experiment and stage,
    worst first."""
    from waypost.state import status

    rows = []
    for stage in stages or grid["stages"]:
        for experiment, pair, instance, cell in stage_cells(grid, stage):
            if not status.not_done(cell):
                continue
            history = cell.get("history") or []
            rows.append({"experiment": experiment, "pair": pair, "stage": stage, "instance": instance,
                         "state": cell["state"], "given_up": bool(cell.get("given_up")),
                         "attempts": cell.get("attempts", 0),
                         "series": max((a.get("series") or 1 for a in history), default=0),
                         "why": status.why(cell), "decision": (history[-1].get("decision") if history else None),
                         "reason": cell.get("reason"), "path": cell["path"], "log": cell.get("log")})
    order = {name: i for i, name in enumerate(grid["experiments"])}
    rows.sort(key=lambda r: (order[r["experiment"]], status.severity(r["state"]), not r["given_up"],
                             natural(r["pair"]), natural(r["instance"] or "")))
    stage_order = {name: i for i, name in enumerate(grid["stages"])}
    rows.sort(key=lambda r: (order[r["experiment"]], stage_order[r["stage"]]))   # (stable: worst first in each)
    return rows


def render_failed(grid: dict, rows: list[dict], stages: list[str] | None = None) -> None:
    """``status --failed``: per experiment and stage, how many of its
    directories are not done and in which states, then one line each:
    where, state, attempts, why."""
    from waypost.state import status

    total = sum(1 for stage in stages or grid["stages"] for _ in stage_cells(grid, stage))
    if not rows:
        print(f"nothing failed: each of the {total} stage directories is done, running or not yet run")
        return
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["experiment"], row["stage"]), []).append(row)
    lines = []
    for (experiment, stage), group in groups.items():
        dirs = sum(1 for exp, *_ in stage_cells(grid, stage) if exp == experiment)
        lines.append(f"{experiment}/{stage}: {len(group)} of {dirs} not done ({_counts_label(group)})")
        lines += _aligned([[_where(grid, r["pair"], r["instance"]), status.state_text(r),
                            f"×{r['attempts']}", r["why"]] for r in group])
    lines.append(f"{len(rows)} of {total} stage directories not done; every attempt of one: "
                 f"waypost status --attempts STAGE {_one_of(grid, rows)}")
    sys.stdout.write("\n".join(lines) + "\n")


def render_attempt_summary(grid: dict, stage: str, cells: list[tuple]) -> None:
    """``status --attempts STAGE`` over several directories: per experiment,
    the stage's label, then one line each: where, state, attempts, series,
    the last attempt (action and state) and the decision after it."""
    by_experiment: dict[str, list[tuple]] = {}
    for experiment, pair, instance, cell in cells:
        by_experiment.setdefault(experiment, []).append((pair, instance, cell))
    lines = []
    for experiment, dirs in by_experiment.items():
        lines.append(f"{experiment}/{stage}: {_counts_label([cell for _, _, cell in dirs])}")
        rows = [[_summary_heading(grid, dirs), "state", "attempts", "series", "last", "next: why"]]
        rows += [_summary_row(grid, pair, instance, cell)
                 for pair, instance, cell in sorted(dirs, key=lambda d: (natural(d[0]), natural(d[1] or "")))]
        lines += _aligned(rows)
    lines.append(f"every attempt: waypost status --attempts {stage} --all-attempts "
                 f"(one's: {_one_of(grid, [{'instance': i} for _, _, i, _ in cells])})")
    sys.stdout.write("\n".join(lines) + "\n")


def _summary_heading(grid: dict, dirs: list[tuple]) -> str:
    """The summary's first column: what tells its directories apart (the
    axis's word, ``instance``, both, or ``-`` for a stage's one)."""
    word = (grid.get("axis") or {}).get("word", "pair")
    return "/".join([*([word] if any(p != layout.ALL_PAIRS for p, _, _ in dirs) else []),
                     *(["instance"] if any(i for _, i, _ in dirs) else [])]) or "-"


def _summary_row(grid: dict, pair: str, instance: str | None, cell: dict) -> list[str]:
    """One directory's line of the summary: where, state, attempts, series,
    the last attempt, and the decision after it (else why it is not done),
    with the earlier work an attempt went on with."""
    from waypost.state import status

    history = cell.get("history") or []
    last = history[-1] if history else {}
    decision = last.get("decision") or {}
    resumed = next((a for a in reversed(history) if a.get("resumes")), None)
    next_why = (f"{decision['action']}: {decision.get('reason') or ''}".rstrip(": ") if decision
                else status.why(cell) or "-")
    if resumed:
        next_why += (f" (#{resumed['number']} went on with #{resumed['resumes']['attempt']}'s work, made "
                     f"under other settings: {'; '.join(resumed['resumes']['settings'])})")
    return [_where(grid, pair, instance), status.state_text(cell), str(cell.get("attempts", 0)),
            str(max((a.get("series") or 1 for a in history), default=0)),
            f"{last.get('action')} {last.get('state') or '?'}" if last else "-", next_why]


def when(iso: str | None) -> str:
    """A manifest's time as the tables show it: ``2026-11-30 12:00``."""
    return (iso or "")[:16].replace("T", " ")


def natural(name: str) -> list:
    """A sort key that puts cells50 before cells150."""
    import re
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
