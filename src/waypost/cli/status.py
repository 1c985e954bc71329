"""``waypost status``: the grid of experiments × pairs × stages in the
terminal (or as JSON, or one HTML page), the attempts of some stages, the
directories not done (``--failed``) and the archives' sizes (``--sizes``)."""

from __future__ import annotations

import json
import sys

from waypost.cli.args import load_config, reach, workflow_facts
from waypost.model import config as wconfig
from waypost.model import layout, records


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
    # (a rule in its own layout keeps its records in the experiment's slot, as a funnel)
    grid = status.collect(cfg, facts["funnels"] + facts.get("own_layout", []), args.experiment, args.pair)
    if args.instance:
        only_instances(cfg, grid, args.instance, args.experiment)
    if args.failed is not None:
        rows = failed_rows(grid, args.failed)
        if args.json:
            sys.stdout.write(json.dumps({"root": grid["root"], "failed": rows},
                                        indent=2 if sys.stdout.isatty() else None) + "\n")
            return 0
        render_failed(grid, rows, args.failed)
        return 0
    if args.attempts:
        if args.json:   # every attempt, and the archives' manifests (read for these stages only)
            _attach_archives(cfg, [cell for stage in args.attempts for *_, cell in _stage_cells(grid, stage)])
            sys.stdout.write(json.dumps(grid, indent=2 if sys.stdout.isatty() else None) + "\n")
            return 0
        for stage in args.attempts:
            cells = list(_stage_cells(grid, stage))
            if args.all_attempts or len(cells) == 1:
                _attach_archives(cfg, [cell for *_, cell in cells])
                render_attempts(grid, [stage])
            else:
                render_attempt_summary(grid, stage, cells)
        return 0
    if args.json:
        # Indented for a terminal; compact when piped, and then through
        # json.dumps's C encoder, which json.dump never uses (8,000 stages:
        # 4 MB in 0.05 s, not 7.5 MB in 0.25 s).
        sys.stdout.write(json.dumps(grid, indent=2 if sys.stdout.isatty() else None) + "\n")
        return 0
    if args.html:
        from waypost.cli import statuspage
        # a stage's page shows its archived runs too
        _attach_archives(cfg, [sub for columns in grid["experiments"].values() for cells in columns.values()
                               for cell in cells.values() for sub in [cell, *cell.get("instances", {}).values()]])
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(statuspage.render(grid))
        print(f"wrote {args.html}")
        return 0
    render_status(grid)
    return 0


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


def label(cell: dict) -> tuple[str, str]:
    from waypost.state import status

    text, attempts = status.label(cell)
    return text + (f" ×{attempts}" if attempts > 1 else ""), status.look(cell["state"])[1]


def _cell_text(cell: dict):
    """A grid cell as rich Text: each part of its label in its state's
    colour (``timeout 9`` red, `` · `` plain, ``done 191`` green), then ×N."""
    from rich.text import Text

    from waypost.state import status

    text = Text()
    for part in status.label_parts(cell):
        text.append(part["text"], status.look(part["state"])[1] if part.get("state") else None)
    attempts = status.label(cell)[1]
    if attempts > 1:
        text.append(f" ×{attempts}", status.look(cell["state"])[1])
    return text


def pair_heading(pair: str, axis: dict | None) -> str:
    from waypost.state import status
    return status.column_heading(pair, axis)


# A stage's summary names at most this many pairs in each state but done.
NAMED_PAIRS = 6


def render_status(grid: dict) -> None:
    """One table per experiment: a row per stage, a column per pair; a legend.
    An experiment with more pairs than the terminal has room for shows, per
    stage, how many pairs are in each state and names those not done."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from waypost.cli import termwidth
    from waypost.state import status

    console = termwidth.console()
    room = termwidth.room(console)
    summarized = False
    axis = grid.get("axis")
    word, words = (axis["word"], axis["key"]) if axis else ("axis value", "axis values")
    for experiment, columns in grid["experiments"].items():
        labels = {pair: {stage: _cell_text(cell) for stage, cell in cells.items()} for pair, cells in columns.items()}
        stages = [stage for stage in grid["stages"] if any(stage in cells for cells in columns.values())]
        # Each column's widest text, plus its padding and border.
        width = 1 + sum(3 + max([len(pair_heading(pair, axis)), *(len(text) for text in cells.values())])
                        for pair, cells in labels.items()) + 3 + max(map(len, stages), default=0)
        title = f"experiment {experiment}  (root {grid['root']})"   # (one line: the table is at least as wide)
        table = Table(title=f"experiment [bold]{escape(experiment)}[/]  (root {escape(grid['root'])})",
                      title_justify="left", min_width=min(len(title), room))
        table.add_column("stage", style="bold")
        if width <= room:
            for pair in columns:
                table.add_column(pair_heading(pair, axis))
            for stage in stages:
                table.add_row(stage, *(cells.get(stage, Text("")) for cells in labels.values()))
        else:
            summarized = True
            pairs = sum(1 for pair in columns if pair != layout.ALL_PAIRS)
            table.add_column(f"{pairs} {words}, by state")
            for stage in stages:
                funnel = labels.get(layout.ALL_PAIRS, {}).get(stage)
                table.add_row(stage, funnel or _stage_summary(columns, stage, axis))
        console.print(table)
    lines = [Text("  ").join(Text(*status.look(state)[:2]) for state in group)
             for group in (status.LOOKS, status.FAILURES)]
    console.print(Text("legend: ") + Text("\n        ").join([*lines, Text(status.LEGEND_MARKS)]))
    if summarized:
        console.print(f"one {word}'s cells: waypost status --{word} {word.upper()}; "
                      "every cell: --json, or --html FILE")


def _stage_summary(columns: dict, stage: str, axis: dict | None):
    """How many pairs are in each state at one stage (done first, then
    worst first), naming the pairs not done: ``done 198  failed 2: a b``."""
    from rich.text import Text

    from waypost.state import status

    by_state: dict[str, list[str]] = {}
    for pair, cells in columns.items():
        if stage in cells:
            by_state.setdefault(cells[stage]["state"], []).append(pair_heading(pair, axis))
    not_done = sorted((s for s in by_state if s not in status.DONE), key=status.severity)
    parts = []
    for state in [s for s in status.DONE if s in by_state] + not_done:
        pairs = by_state[state]
        text = f"{status.look(state)[0]} {len(pairs)}"
        if state not in status.DONE:
            more = len(pairs) - NAMED_PAIRS
            text += ": " + " ".join(pairs[:NAMED_PAIRS]) + (f" +{more} more" if more > 0 else "")
        parts.append(Text(text, status.look(state)[1]))
    return Text("  ").join(parts)


def _stage_cells(grid: dict, stage: str):
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
        for exp, p, instance, cell in _stage_cells(grid, stage):
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
        for experiment, pair, instance, cell in _stage_cells(grid, stage):
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

    total = sum(1 for stage in stages or grid["stages"] for _ in _stage_cells(grid, stage))
    if not rows:
        print(f"nothing failed: each of the {total} stage directories is done, running or not yet run")
        return
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["experiment"], row["stage"]), []).append(row)
    lines = []
    for (experiment, stage), group in groups.items():
        dirs = sum(1 for exp, *_ in _stage_cells(grid, stage) if exp == experiment)
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
    from waypost.state import status

    by_experiment: dict[str, list[tuple]] = {}
    for experiment, pair, instance, cell in cells:
        by_experiment.setdefault(experiment, []).append((pair, instance, cell))
    lines = []
    for experiment, dirs in by_experiment.items():
        lines.append(f"{experiment}/{stage}: {_counts_label([cell for _, _, cell in dirs])}")
        word = (grid.get("axis") or {}).get("word", "pair")
        heading = "/".join([*([word] if any(p != layout.ALL_PAIRS for p, _, _ in dirs) else []),
                            *(["instance"] if any(i for _, i, _ in dirs) else [])]) or "-"
        rows = [[heading, "state", "attempts", "series", "last", "next: why"]]
        for pair, instance, cell in sorted(dirs, key=lambda d: (natural(d[0]), natural(d[1] or ""))):
            history = cell.get("history") or []
            last = history[-1] if history else {}
            decision = last.get("decision") or {}
            resumed = next((a for a in reversed(history) if a.get("resumes")), None)
            rows.append([_where(grid, pair, instance), status.state_text(cell), str(cell.get("attempts", 0)),
                         str(max((a.get("series") or 1 for a in history), default=0)),
                         f"{last.get('action')} {last.get('state') or '?'}" if last else "-",
                         (f"{decision['action']}: {decision.get('reason') or ''}".rstrip(": ") if decision
                          else status.why(cell) or "-")
                         + (f" (#{resumed['number']} went on with #{resumed['resumes']['attempt']}'s work, made "
                            f"under other settings: {'; '.join(resumed['resumes']['settings'])})" if resumed else "")])
        lines += _aligned(rows)
    lines.append(f"every attempt: waypost status --attempts {stage} --all-attempts "
                 f"(one's: {_one_of(grid, [{'instance': i} for _, _, i, _ in cells])})")
    sys.stdout.write("\n".join(lines) + "\n")


def render_sizes(cfg: dict, args) -> int:
    """``status --sizes``: the archives of each stage dir, how many and how big."""
    from rich.markup import escape
    from rich.table import Table

    from waypost.cli import termwidth
    from waypost.ops import prune

    rows = prune.sizes(cfg, args.experiment, args.pair)
    total = sum(r["bytes"] for r in rows)
    if args.json:
        sys.stdout.write(json.dumps({"root": cfg["root"], "stages": rows, "archives": sum(r["archives"] for r in rows),
                                     "bytes": total}, indent=2 if sys.stdout.isatty() else None) + "\n")
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


def when(iso: str | None) -> str:
    """A manifest's time as the tables show it: ``2026-11-30 12:00``."""
    return (iso or "")[:16].replace("T", " ")


def natural(name: str) -> list:
    """A sort key that puts cells50 before cells150."""
    import re
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
