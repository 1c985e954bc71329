"""``waypost status --html``: the status grid as one self-contained HTML page.

A pure function of the grid ``status.collect`` returns: no file access, no
external assets. Each cell holds its state and attempts; its ``<details>``
hold the stage directory, the attempt history and, for a stage with
instances, each instance's.
"""

from __future__ import annotations

import html

from waypost.cli import pages
from waypost.model import records
from waypost.state import status

CSS = pages.text("status.css")

# One open cell at a time.
SCRIPT = pages.text("status.js")

HISTORY_COLUMNS = ["#", "series", "action", "state", "exit", "checks", "next", "why", "secs", "limit", "host",
                   "job", "log"]


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _attempt_row(a: dict) -> str:
    exit_text = f"sig {a['signal']}" if a.get("signal") else a.get("exit_code")
    checks = " ".join(f"{k}:{'ok' if v == 'SUCCESS' else v}" for k, v in (a.get("checks") or {}).items())
    secs = f"{a['duration_s']:.1f}" if a.get("duration_s") is not None else ""
    decision = a.get("decision") or {}
    limit = a.get("runtime_limit_s")
    cells = [a.get("number"), a.get("series", 1), a.get("action"), a.get("state") or "?", exit_text, checks,
             decision.get("action"), decision.get("reason"), secs, "" if limit is None else f"{limit:g}",
             a.get("host"), _job(a), a.get("log")]
    return "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"


def _job(a: dict) -> str | None:
    """The scheduler's job an attempt ran in (``slurm 42``)."""
    job = records.job_of(a)
    return f"{job[0]} {job[1]}" if job else None


def _stage_details(cell: dict) -> str:
    """Directory, problems and attempt history of one stage or instance directory."""
    parts = [f'<p>dir <span class="path">{_e(cell["path"])}</span></p>']
    for key, what in (("reason", "reason"), ("error", "error")):
        if cell.get(key):
            parts.append(f"<p>{what}: {_e(cell[key])}</p>")
    if cell.get("missing_outputs"):
        parts.append(f'<p>missing outputs: <span class="path">{_e(", ".join(cell["missing_outputs"]))}</span></p>')
    if cell.get("log"):
        parts.append(f'<p>latest log <span class="path">{_e(cell["log"])}</span></p>')
    if cell.get("history"):
        head = "".join(f"<th>{c}</th>" for c in HISTORY_COLUMNS)
        rows = "".join(_attempt_row(a) for a in cell["history"])
        parts.append(f'<table class="history"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>')
    if cell.get("archives"):
        runs = "".join(f'<li class="archive" data-archive="{_e(r["archive"])}">{_e(r["archive"])}: '
                       f'{_e(r["state"] or "no manifest")}, {_e(r["attempts"])} attempt(s)'
                       f'{", made " + _e((r["created"] or "")[:16].replace("T", " ")) if r["created"] else ""}'
                       f'{", reused from " + _e(r["reused_from"]) if r.get("reused_from") else ""}</li>'
                       for r in cell["archives"])
        parts.append(f'<p>earlier runs, archived:</p><ul class="archives">{runs}</ul>')
    return "".join(parts)


GIVEN_UP = ' data-given-up="true"'


def _part(part: dict) -> str:
    """One part of a cell's label (status.label_parts): a count of instances
    in a state, or given up, in its state's colour."""
    if not part.get("state"):
        return _e(part["text"])
    if "count" in part:
        data = f' data-count-state="{_e(part["state"])}" data-count="{part["count"]}"'
    elif type(part.get("given_up")) is int:      # how many instances (True: the stage's own)
        data = f' data-given-up-count="{part["given_up"]}"'
    else:
        return _e(part["text"])
    return f'<span class="count state-{_e(part["state"])}"{data}>{_e(part["text"])}</span>'


def _summary(cell: dict) -> str:
    attempts = status.label(cell)[1]
    tail = f' <span class="attempts" title="{attempts} attempt(s)">×{attempts}</span>' if attempts else ""
    return f'<span class="label">{"".join(_part(p) for p in status.label_parts(cell))}</span>{tail}'


def _cell(experiment: str, pair: str, stage: str, cell: dict) -> str:
    state, where = cell["state"], f"{experiment}/{pair}/{stage}"
    inner = [f'<p>{_e(len(cell["instances"]))} instances in <span class="path">{_e(cell["path"])}</span></p>'
             if "instances" in cell else _stage_details(cell)]
    for name, sub in cell.get("instances", {}).items():
        inner.append(f'<div class="instance state-{_e(sub["state"])}" data-instance="{_e(name)}" '
                     f'data-state="{_e(sub["state"])}"><b>instance {_e(name)}</b>: {_summary(sub)}'
                     f'{_stage_details(sub)}</div>')
    return (f'<td class="cell state-{_e(state)}" data-experiment="{_e(experiment)}" data-pair="{_e(pair)}" '
            f'data-stage="{_e(stage)}" data-state="{_e(state)}" data-attempts="{status.label(cell)[1]}"'
            f'{GIVEN_UP if cell.get("given_up") else ""}>'
            f'<details><summary>{_summary(cell)}</summary><div class="more" id="{_e(where)}">{"".join(inner)}</div>'
            f'</details></td>')


def _legend() -> str:
    swatches = "".join(f'<span class="swatch state-{state}" data-state="{state}">{_e(status.look(state)[0])}</span>'
                       for state in [*status.LOOKS, *status.FAILURES])
    return f'<div class="legend" id="legend">{swatches}<span class="marks">{_e(status.LEGEND_MARKS)}</span></div>'


def _table(experiment: str, columns: dict, stages: list[str], axis: dict | None = None) -> str:
    head = "".join(f"<th>{_e(status.column_heading(pair, axis))}</th>" for pair in columns)
    rows = []
    for stage in stages:
        cells = "".join(_cell(experiment, pair, stage, col[stage]) if stage in col else '<td class="empty"></td>'
                        for pair, col in columns.items())
        rows.append(f'<tr><th scope="row">{_e(stage)}</th>{cells}</tr>')
    return (f'<h2>experiment {_e(experiment)}</h2>\n<table class="grid" data-experiment="{_e(experiment)}">'
            f'<thead><tr><th>stage</th>{head}</tr></thead><tbody>\n' + "\n".join(rows) + "\n</tbody></table>")


def render(grid: dict) -> str:
    """The whole page: a legend, then one table per experiment (a row per
    stage, a column per pair and one for the per-experiment funnels).

    Each cell's details have the id ``experiment/pair/stage``: a link to
    ``page.html#exp1/en-xa/train_student`` opens them."""
    # Failure states, and any state the palette does not know, take the failure colour.
    css = CSS + "".join([f".cell, .swatch, .instance, .count {{ --c: {status.FAILURE_LOOK[1]}; }}\n",
                         *(f".state-{state} {{ --c: {status.look(state)[2]}; }}\n" for state in status.LOOKS)])
    tables = "\n".join(_table(experiment, columns, grid["stages"], grid.get("axis"))
                       for experiment, columns in grid["experiments"].items())
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n<title>waypost status</title>\n'
            f'<style>{css}</style></head>\n<body>\n<h1>waypost status</h1>\n'
            f'<p class="root">root <code>{_e(grid["root"])}</code> · click a cell for its directory, '
            f'attempts and logs</p>\n{_legend()}\n{tables}\n<script>{SCRIPT}</script>\n</body></html>\n')
