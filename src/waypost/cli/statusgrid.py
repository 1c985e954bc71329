"""``waypost status``'s grid in the terminal: one table per experiment, a
row per stage and a column per pair (or, with more pairs than the terminal
has room for, each stage's pairs counted by state), and the legend; and the
cell labels and column headings the other commands' tables share."""

from __future__ import annotations

from waypost.model import layout


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
    from rich.text import Text

    from waypost.cli import termwidth
    from waypost.state import status

    console = termwidth.console()
    room = termwidth.room(console)
    summarized = False
    for experiment, columns in grid["experiments"].items():
        table, summary = _experiment_table(grid, experiment, columns, room)
        summarized = summarized or summary
        console.print(table)
    lines = [Text("  ").join(Text(*status.look(state)[:2]) for state in group)
             for group in (status.LOOKS, status.FAILURES)]
    console.print(Text("legend: ") + Text("\n        ").join([*lines, Text(status.LEGEND_MARKS)]))
    if summarized:
        word = grid["axis"]["word"] if grid.get("axis") else "axis value"
        console.print(f"one {word}'s cells: waypost status --{word} {word.upper()}; "
                      "every cell: --json, or --html FILE")


def _experiment_table(grid: dict, experiment: str, columns: dict, room: int):
    """One experiment's table, and whether it counts each stage's pairs by
    state (its columns are wider than ``room``) rather than showing a
    column per pair."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    axis = grid.get("axis")
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
        return table, False
    pairs = sum(1 for pair in columns if pair != layout.ALL_PAIRS)
    table.add_column(f"{pairs} {axis['key'] if axis else 'axis values'}, by state")
    for stage in stages:
        funnel = labels.get(layout.ALL_PAIRS, {}).get(stage)
        table.add_row(stage, funnel or _stage_summary(columns, stage, axis))
    return table, True


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
