"""The ``waypost`` command: looking at and steering the file state.

Thin over the engine modules, and it never imports Snakemake unless a command
needs it (importing Snakemake with the Slurm plugin probes the controller).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from datetime import UTC

from . import __version__, graph, layout, stores
from . import config as wconfig
from .stores.mirror import snakemake_options

DEFAULT_CONFIG = "config/config.yaml"


def workflow_facts(args) -> dict:
    """The workflow's stages, funnels and axis (see graph), once per command."""
    if getattr(args, "_facts", None) is None:
        wconfig.load_yaml(args.config)   # a missing or broken file: its own error first
        args._facts = graph.facts(args.config, args.workflow)
    return args._facts


def load_config(args) -> dict:
    return graph.load_config(args.config, args.workflow, workflow_facts(args))


def reach(root: str) -> None:
    """A gs:// root whose storage endpoint can't be reached: one line (a
    StorageError, exit 1) within seconds, instead of gcsfs's minute of
    retries."""
    from . import stores
    stores.reach(root)


# Snakemake options that take stage (rule) names, which waypost checks first.
STAGE_OPTIONS = ("--until", "--omit-from")


def stage_args(snakemake_args: list[str]) -> list[str]:
    """The stage names given to STAGE_OPTIONS among extra Snakemake arguments."""
    names, taking = [], False
    for arg in snakemake_args:
        option, eq, value = arg.partition("=")
        if arg.startswith("-"):
            taking = option in STAGE_OPTIONS
            if taking and eq:
                names.append(value)
        elif taking:
            names.append(arg)
    return names


def _config_entries(snakemake_args: list[str]) -> tuple[list[str], list[str]]:
    """(the values of ``--config``/``-C`` among extra Snakemake arguments,
    the other arguments)."""
    entries, rest, taking = [], [], False
    for arg in snakemake_args:
        if arg.startswith("-"):
            taking = arg in ("--config", "-C")
            if taking:
                continue
        if taking:
            entries.append(arg)
        else:
            rest.append(arg)
    return entries, rest


def with_profile_config(profile: str, extra: list[str], select: dict | None = None) -> list[str]:
    """Extra Snakemake arguments with their ``--config`` entries (and a
    ``select``) in one ``--config`` that also carries the profile's own
    ``config:`` entries (``pool=cloud``): a ``--config`` replaces the
    profile's list rather than adding to it."""
    given, rest = _config_entries(extra)
    if not (select or given):
        return extra
    try:
        entries = [f"{k}={v}" for k, v in profile_config(profile)[1].items()]
    except wconfig.ConfigError:
        entries = []   # a profile only Snakemake finds: its entries are its own business
    if select:
        entries.append("select=" + json.dumps(select, separators=(",", ":")))
    return ["--config", *entries, *given, *rest]


def extra_args(args) -> list[str]:
    return args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args


def cmd_status(args) -> int:
    from . import status

    cfg = load_config(args)
    if args.all_attempts and not args.attempts:
        raise wconfig.ConfigError("--all-attempts goes with --attempts STAGE (the stages whose attempts to list)")
    wconfig.check_names(cfg, args.experiment, args.pair, [*(args.attempts or []), *(args.failed or [])])
    reach(cfg["root"])
    if args.sizes:
        return render_sizes(cfg, args)
    grid = status.collect(cfg, workflow_facts(args)["funnels"], args.experiment, args.pair)
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
        from . import statuspage
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
    from . import status

    found = {name for columns in grid["experiments"].values() for cells in columns.values()
             for cell in cells.values() for name in cell.get("instances") or {}}
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
    from . import status, stores

    tree = stores.store_for(cfg["root"])
    for cell in cells:
        cell["archives"] = status.archived_runs(tree, cell["path"])


def _label(cell: dict) -> tuple[str, str]:
    from . import status

    text, attempts = status.label(cell)
    return text + (f" ×{attempts}" if attempts > 1 else ""), status.look(cell["state"])[1]


def _cell_text(cell: dict):
    """A grid cell as rich Text: each part of its label in its state's
    colour (``timeout 9`` red, `` · `` plain, ``done 191`` green), then ×N."""
    from rich.text import Text

    from . import status

    text = Text()
    for part in status.label_parts(cell):
        text.append(part["text"], status.look(part["state"])[1] if part.get("state") else None)
    attempts = status.label(cell)[1]
    if attempts > 1:
        text.append(f" ×{attempts}", status.look(cell["state"])[1])
    return text


def _pair_heading(pair: str, axis: dict | None) -> str:
    from . import status
    return status.column_heading(pair, axis)


# A stage's summary names at most this many pairs in each state but done.
NAMED_PAIRS = 6


def render_status(grid: dict) -> None:
    """One table per experiment: a row per stage, a column per pair; a legend.
    An experiment with more pairs than the terminal has room for shows, per
    stage, how many pairs are in each state and names those not done."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from . import status

    console = Console()
    summarized = False
    axis = grid.get("axis")
    word, words = (axis["word"], axis["key"]) if axis else ("axis value", "axis values")
    for experiment, columns in grid["experiments"].items():
        labels = {pair: {stage: _cell_text(cell) for stage, cell in cells.items()} for pair, cells in columns.items()}
        stages = [stage for stage in grid["stages"] if any(stage in cells for cells in columns.values())]
        # Each column's widest text, plus its padding and border.
        width = 1 + sum(3 + max([len(_pair_heading(pair, axis)), *(len(text) for text in cells.values())])
                        for pair, cells in labels.items()) + 3 + max(map(len, stages), default=0)
        title = f"experiment {experiment}  (root {grid['root']})"   # (one line: the table is at least as wide)
        table = Table(title=f"experiment [bold]{escape(experiment)}[/]  (root {escape(grid['root'])})",
                      title_justify="left", min_width=min(len(title), console.width))
        table.add_column("stage", style="bold")
        if width <= console.width:
            for pair in columns:
                table.add_column(_pair_heading(pair, axis))
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

    from . import status

    by_state: dict[str, list[str]] = {}
    for pair, cells in columns.items():
        if stage in cells:
            by_state.setdefault(cells[stage]["state"], []).append(_pair_heading(pair, axis))
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
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    for stage in stages:
        for exp, p, instance, cell in _stage_cells(grid, stage):
            heading = _pair_heading(p, grid.get("axis")) if grid.get("axis") or p != layout.ALL_PAIRS else None
            where = "/".join(x for x in (heading, exp, stage, instance) if x)
            title = f"{where}: {_label(cell)[0]}" + (f" — {cell['reason']}" if cell.get("reason") else "")
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
                exit_text = f"sig {a['signal']}" if a.get("signal") else str(a.get("exit_code", ""))
                checks = " ".join(f"{k}:{'ok' if v == 'SUCCESS' else v}" for k, v in (a.get("checks") or {}).items())
                decision = a.get("decision") or {}
                limit = a.get("runtime_limit_s")
                row = [str(a["number"])] + ([str(a.get("series", 1))] if series else [])
                row += [a.get("action", ""), a.get("state") or "?", exit_text, checks,
                        f"{a.get('duration_s') or 0:.1f}", "–" if limit is None else f"{limit:g}",
                        decision.get("action", ""), escape(a.get("log") or "")]
                table.add_row(*row)
                if a.get("why") and a.get("series", 1) > 1:
                    reasons.append(f"  #{a['number']} began series {a['series']} with {a.get('action')}: {a['why']}")
                if a.get("resumes"):
                    reasons.append(f"  #{a['number']} went on with attempt {a['resumes']['attempt']}'s work, made "
                                   f"under other settings: {'; '.join(a['resumes']['settings'])}")
                if a.get("error") and a.get("slurm_job_id") and not a.get("log"):   # a Slurm job its runner never saw
                    reasons.append(f"  #{a['number']}: {a['error']}")
                if decision:
                    reasons.append(f"  #{a['number']} → {decision.get('action')}: {decision.get('reason') or ''}")
            console.print(table)
            for line in reasons:
                console.print(escape(line), soft_wrap=True)
            for run in cell.get("archives", []):
                what = (f"{run['state']}, {run['attempts']} attempt{'s' if run['attempts'] != 1 else ''}, "
                        f"made {_when(run['created'])}" + (" (reused)" if run["reused_from"] else "")
                        if run["state"] else run.get("error") or "no manifest")
                console.print(escape(f"archived {run['archive']}: {what}"), soft_wrap=True)


def _where(grid: dict, pair: str, instance: str | None) -> str:
    """A directory of a stage of an experiment: its axis value (not the
    funnels' slot) and instance, ``en-xa/0``; "-" for the stage's one."""
    axis = grid.get("axis")
    value = _pair_heading(pair, axis) if pair != layout.ALL_PAIRS else None
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
    from . import status
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
    from . import status

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
                             _natural(r["pair"]), _natural(r["instance"] or "")))
    stage_order = {name: i for i, name in enumerate(grid["stages"])}
    rows.sort(key=lambda r: (order[r["experiment"]], stage_order[r["stage"]]))   # (stable: worst first in each)
    return rows


def render_failed(grid: dict, rows: list[dict], stages: list[str] | None = None) -> None:
    """``status --failed``: per experiment and stage, how many of its
    directories are not done and in which states, then one line each:
    where, state, attempts, why."""
    from . import status

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
    from . import status

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
        for pair, instance, cell in sorted(dirs, key=lambda d: (_natural(d[0]), _natural(d[1] or ""))):
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
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from . import prune

    rows = prune.sizes(cfg, args.experiment, args.pair)
    total = sum(r["bytes"] for r in rows)
    if args.json:
        sys.stdout.write(json.dumps({"root": cfg["root"], "stages": rows, "archives": sum(r["archives"] for r in rows),
                                     "bytes": total}, indent=2 if sys.stdout.isatty() else None) + "\n")
        return 0
    console = Console()
    if not rows:
        console.print(f"no archived workspaces (.attempts/) under {escape(cfg['root'])}")
        return 0
    table = Table(title=f"archived workspaces (.attempts/) under {escape(cfg['root'])}", title_justify="left")
    for column in ("experiment", wconfig.axis_words(cfg)[0], "stage", "archives", "size"):
        table.add_column(column, justify="right" if column in ("archives", "size") else "left")
    for r in rows:
        stage = r["stage"] + (f"/{r['instance']}" if r["instance"] else "")
        table.add_row(r["experiment"], _pair_heading(r["pair"], cfg.get("_axis")), stage, str(r["archives"]),
                      prune.human(r["bytes"]))
    table.add_row("total", "", "", str(sum(r["archives"] for r in rows)), prune.human(total), style="bold")
    console.print(table)
    console.print("`waypost prune -n` lists what the retention lets go")
    return 0


PROFILE_MARK = ".waypost-profile"


#: waypost's Snakemake profiles (local, onprem, cloud), shipped in the package.
PACKAGE_PROFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")


def _is_waypost_profile(path: str) -> bool:
    """One this command installed: a copy holding the mark file, or a link
    (how earlier versions installed them) dangling or into a waypost profile."""
    if os.path.islink(path):
        return not os.path.exists(path) or os.path.exists(os.path.join(path, PROFILE_MARK))
    return os.path.isdir(path) and os.path.exists(os.path.join(path, PROFILE_MARK))


def install_profiles(target_dir: str) -> list[str]:
    """Copy waypost's profiles where Snakemake looks for bare names
    (``--profile local``), replacing earlier waypost copies or links (of any
    checkout), never a profile of the user's; the lines to print."""
    import shutil
    lines = []
    target_dir = os.path.expanduser(target_dir)
    os.makedirs(target_dir, exist_ok=True)
    for name in sorted(os.listdir(PACKAGE_PROFILES)):
        source = os.path.join(PACKAGE_PROFILES, name)
        if not os.path.isdir(source):
            continue
        target = os.path.join(target_dir, name)
        if os.path.lexists(target) and not _is_waypost_profile(target):
            lines.append(f"profile {name}: {target} exists and is not waypost's; left alone "
                         f"(use --profile {source} instead)")
            continue
        fresh = target + ".waypost-new"
        shutil.rmtree(fresh, ignore_errors=True)
        shutil.copytree(source, fresh)
        if os.path.islink(target) or os.path.isfile(target):
            os.unlink(target)
        elif os.path.isdir(target):
            shutil.rmtree(target)
        os.rename(fresh, target)
        lines.append(f"profile {name}: {target} (waypost {__version__}'s)")
    return lines


def cmd_profiles_install(args) -> int:
    """waypost's profiles, usable by bare name."""
    for line in install_profiles(args.target):
        print(line, file=sys.stderr if "left alone" in line else sys.stdout)
    return 0


TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template")


def cmd_init(args) -> int:
    """Write a runnable pipeline into a new directory (or an empty one)."""
    import shutil
    target = os.path.abspath(args.directory)
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise wconfig.ConfigError(f"{args.directory}: exists and is not an empty directory (nothing was written)")
    name = os.path.basename(target.rstrip(os.sep))
    if not layout.is_valid_name(name):
        raise wconfig.ConfigError(f"{args.directory}: {name!r} is not a valid pipeline name "
                                  f"(expected {layout.NAME_RULE})")
    shutil.copytree(TEMPLATE, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for folder, _, files in os.walk(target):
        for file in files:
            path = os.path.join(folder, file)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if "__NAME__" in text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text.replace("__NAME__", name))
    print(f"wrote a waypost pipeline in {args.directory}: workflow/Snakefile (generate → fit per dataset, "
          "a summarize funnel), config/, scripts/, tests/")
    if not args.no_profiles:
        for line in install_profiles(args.profiles_target):
            print(line, file=sys.stderr if "left alone" in line else sys.stdout)
    print(f"next: cd {args.directory} && snakemake --profile local && waypost status")
    return 0


def profile_config(profile: str) -> tuple[str, dict[str, str]]:
    """A Snakemake profile's file and its ``config:`` entries (key → value).
    Snakemake takes that list whole: a later ``config:`` or ``--config``
    replaces it rather than adding to it, so whoever sets one must carry the
    profile's entries (``cmd_run`` does)."""
    candidates = [profile, os.path.join("profiles", profile), os.path.expanduser(f"~/.config/snakemake/{profile}"),
                  f"/etc/xdg/snakemake/{profile}"]
    for directory in candidates:
        path = os.path.join(directory, "config.yaml")
        if os.path.exists(path):
            entries = wconfig.load_yaml(path).get("config") or []
            if isinstance(entries, dict):
                return path, {str(k): str(v) for k, v in entries.items()}
            found = {}
            for entry in entries if isinstance(entries, list) else [entries]:
                key, _, value = str(entry).partition("=")
                found[key.strip()] = value.strip().strip("'\"")
            return path, found
    raise wconfig.ConfigError(f"profile {profile!r} not found (looked in {', '.join(candidates)})")


def _profile_pool(profile: str) -> str | None:
    """The pool a Snakemake profile selects (its ``config: [pool=...]``);
    None when its ``config:`` list has no ``pool=``, which then is the
    config file's (a profile's ``config: ["root=..."]`` alone replaces the
    cloud profile's ``["pool=cloud"]``: said on stderr)."""
    path, entries = profile_config(profile)
    if "pool" in entries:
        return entries["pool"]
    if entries:
        print(f"waypost: {path} sets config: {sorted(entries)} but no pool=, so its runs use the config's pool "
              f"(a profile's config: list replaces another's whole; list pool= in it too)", file=sys.stderr)
    return None


def cmd_workers(args) -> int:
    """The resolved pool table: class → partition, GPUs, CPUs, memory, runtime, env."""
    from rich.console import Console
    from rich.table import Table

    from . import workers

    cfg = load_config(args)
    pool = args.pool or (args.profile and _profile_pool(args.profile)) or cfg["pool"]
    path = workers.pools_file(cfg.get("workers"), wconfig.pipeline_dir(args.workflow))
    data = workers.load(path)
    if pool not in data["pools"]:
        raise wconfig.ConfigError(f"{path}: no pool {pool!r} (expected one of: {', '.join(data['pools'])})")
    spec = data["pools"][pool]
    if args.check:
        return check_pool(pool, spec, path)
    rows = {name: {**workers.resources(cls), "env": cls.get("env", {})} for name, cls in spec["classes"].items()}
    if args.json:
        json.dump({"pool": pool, "executor": spec["executor"], "classes": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = Table(title=f"pool [bold]{pool}[/] ({spec['executor']}, from {path})", title_justify="left")
    extras = {name: " ".join(f"{k}={r[k]}" for k in ("constraint", "slurm_account", "qos", "slurm_extra") if r.get(k))
              for name, r in rows.items()}
    columns = ["class", "partition", "GPUs", "CPUs", "memory", "runtime"] + (["other"] if any(extras.values()) else [])
    for column in columns + ["env"]:
        table.add_column(column)
    for name, r in rows.items():
        gpus = r.get("gres") or (f"{r.get('gpu', 0)}" + (f" × {r['gpu_model']}" if r.get("gpu_model") else "")
                                 if r.get("gpu") else "–")
        cells = [name, r.get("slurm_partition", "–"), gpus, str(r.get("cpus_per_task", "–")),
                 f"{r['mem_mb']} MB" if r.get("mem_mb") else "–", f"{r['runtime']} min" if r.get("runtime") else "–"]
        if "other" in columns:
            cells.append(extras[name])
        table.add_row(*cells, " ".join(f"{k}={v}" for k, v in r["env"].items()))
    Console().print(table)
    return 0


def check_pool(pool: str, spec: dict, path: str) -> int:
    """Each class of a Slurm pool against what the cluster has (scontrol,
    sacctmgr): 1 when one of them could never start."""
    from . import slurm
    if spec["executor"] != "slurm":
        print(f"pool {pool} ({path}) runs on this machine: nothing to check against Slurm")
        return 0
    facts = slurm.cluster_facts()
    if facts is None:
        print(f"waypost workers --check: scontrol did not answer; can't check pool {pool} against the cluster",
              file=sys.stderr)
        return 1
    bad = 0
    for name, cls in spec["classes"].items():
        problems = slurm.class_mismatches(cls, facts)
        bad += bool(problems)
        print(f"{pool}/{name}: " + ("ok" if not problems else "; ".join(problems)))
    if bad:
        print(f"{bad} class(es) of pool {pool} ({path}) ask for what this cluster can't give: "
              "their jobs would never start")
    return 1 if bad else 0


def cmd_cron(args) -> int:
    from . import cron
    extra = extra_args(args)
    if stage_args(extra):
        wconfig.check_names(load_config(args), stages=stage_args(extra))
    extra = with_profile_config(args.profile, extra) if args.profile else extra
    return cron.run(args.profile, extra, args.config, args.workflow, checksums=not args.no_checksums)


def cmd_verify(args) -> int:
    from . import verify
    cfg = load_config(args)
    reach(cfg["root"])
    problems = verify.verify(cfg["root"], checksums=not args.no_checksums, repair=args.repair)
    for p in problems:
        action = f"archived in {p.stage_dir}/{p.archived}" if p.archived else "not done (use --repair to set it aside)"
        print(f"{p.stage_dir}: {p.what}; {action}")
    print(f"{len(problems)} stage(s) not to be trusted" if problems else "every manifest checks out")
    how = verify.summary(problems, checksums=not args.no_checksums)
    if how:
        print(how)   # on a gs:// root: crc32c from the listing, or sizes only (and how many)
    return 1 if problems else 0   # problems found (also when --repair set them aside)


def cmd_find(args) -> int:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from . import catalog

    cfg = load_config(args)
    cat = catalog.Catalog(args.db)
    roots = catalog.roots_of(cfg) + (args.root or [])
    unread = 0
    if not args.no_refresh:
        cat.forget_others(roots)
        for root in roots:
            try:
                reach(root)
                done = cat.refresh(root)
            except Exception as exc:
                print(f"waypost: catalog: {exc}", file=sys.stderr)
                unread += 1
                continue
            for problem in done.problems:
                print(f"waypost: catalog: skipped {problem}", file=sys.stderr)
    if args.lineage:
        return render_lineage(cat.lineage(args.lineage), args.json) or (1 if unread else 0)
    if args.stage and "/" in args.stage:   # stage/instance, as the tables show them
        args.stage, instance = args.stage.split("/", 1)
        args.instance = [*(args.instance or []), instance]
    rows = cat.find(stage=args.stage, pair=args.pair, experiment=args.experiment, state=args.state,
                    since=args.since, until=args.until, config_hash=args.config_hash, limit=args.limit,
                    archived=not args.no_archived, instance=args.instance)
    if not rows:
        _check_find_names(cfg, cat, args)
    if args.instance:   # each: one that is nowhere is a typo, whatever the others found
        wconfig.check_instance_names(cfg, args.instance, args.experiment if args.experiment in cfg["experiments"]
                                     else None, cat.instances())
    if args.html:
        # The page is over the whole catalog (lineage needs every stage); the
        # filters given here are its first view.
        everything = cat.find(archived=not args.no_archived)
        _compare_with_config(everything, cfg, args.against)
        _write_find_page(args, cfg, roots, everything)
        return 1 if unread else 0
    _compare_with_config(rows, cfg, args.against)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 1 if unread else 0
    table = Table(title=f"{len(rows)} stage(s) found in {len(roots)} root(s), newest first", title_justify="left",
                  box=box.SIMPLE_HEAD)
    locations = [stores.shown(r["location"]) for r in rows]
    stages = [r["stage"] + (f"/{r['instance']}" if r["instance"] else "") for r in rows]
    widths = {"stage": max(map(len, stages), default=5), "created": 16, "config": 8, "state": 5}
    for column in ("experiment", "pair", "stage", "state", "created", "att.", "config", "vs current config", "location"):
        table.add_column(column, overflow="fold", min_width=widths.get(column))
    for row, location, name in zip(rows, locations, stages):
        text, style = _label({"state": "adopted" if row["adopted"] else row["state"]})
        if row["differs"] is None:
            differs = "–"
        else:
            differs = "same" if not row["differs"] else "; ".join(row["differs"])
            differs = f"{differs} ({row['compared_with']})"
        table.add_row(row["experiment"], row["pair"], name,
                      f"[{style}]{text}[/]" + (" (reused)" if row["reused_from"] else "")
                      + (f" (archived {row['archive']})" if row["archive"] else ""),
                      _when(row["source_created"] or row["created"]) + (" (reused)" if row["source_created"] else ""),
                      str(row["attempts"]),
                      (row["config_hash"] or "–")[:8], escape(differs), escape(location))
    Console(width=args.width).print(table)
    return 1 if unread else 0


def _compare_with_config(rows: list[dict], cfg: dict, against: str | None) -> None:
    """Each row's settings that differ from the current config's (``differs``,
    ``compared_with``): of ``against``, else of its own experiment, else of
    one that has its pair; None where nothing compares."""
    from . import diffs

    settings_of = wconfig.step_settings_of(cfg)
    for row in rows:
        other = against or (row["experiment"] if row["experiment"] in cfg["experiments"] else
                            next((e for e, x in cfg["experiments"].items() if row["pair"] in x["pairs"]), None))
        if other and row["stage"] in cfg["stages"] and (row["pair"] in cfg["experiments"][other]["pairs"]
                                                        or row["pair"] == "_all"):
            current = settings_of(other, row["pair"], row["stage"], row.get("instance"))
            row["differs"] = diffs.settings_diff(row["settings"], current)
            row["compared_with"] = other
        else:
            row["differs"], row["compared_with"] = None, None


def _when(iso: str | None) -> str:
    """A manifest's time as the tables show it: ``2026-11-30 12:00``."""
    return (iso or "")[:16].replace("T", " ")


def render_lineage(tree: dict, as_json: bool) -> int:
    """``find --lineage``: the tree of manifests a stage was made from, one
    line each, indented under the stage that read it; a stage read by many
    shows its inputs once (later: "inputs above"). 1 when the stage itself
    is not in the catalog."""
    if as_json:
        json.dump(tree, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 1 if tree.get("missing") else 0
    shown: set[str] = set()

    def where(location: str) -> str:
        return os.path.relpath(location) if location and location.startswith(os.getcwd() + os.sep) else location

    def walk(node: dict, depth: int) -> None:
        lead = "  " * depth + ("reused from " if node.get("via") == "reuse" else "")
        if node.get("missing"):
            print(f"{lead}{where(node['location'])}: not in the catalog")
            return
        if node.get("adopted"):
            print(f"{lead}{where(node['location'])}: placed by hand (no manifest)")
            return
        name = "/".join(x for x in (node["pair"], node["experiment"], node["stage"], node["instance"]) if x)
        state = _label({"state": node["state"]})[0] + (f" (archived {node['archive']})" if node["archive"] else "")
        made = (f"made {_when(node['source_created'])} (reused)" if node.get("source_created")
                else f"made {_when(node['created'])}")
        again = node["location"] in shown and node["inputs"]
        print(f"{lead}{name}: {state}, {made}, config {(node['config_hash'] or '–')[:8]}, code "
              f"{node['code_version'] or '–'}" + (" (cycle)" if node.get("cycle") else "")
              + (" (inputs above)" if again else "") + f" — {where(node['location'])}")
        if again:
            return
        shown.add(node["location"])
        for child in node["inputs"]:
            walk(child, depth + 1)

    walk(tree, 0)
    return 1 if tree.get("missing") else 0


def _write_find_page(args, cfg: dict, roots: list[str], rows: list[dict]) -> None:
    """``find --html FILE``: the rows found, as one self-contained page (findpage)."""
    from datetime import datetime

    from . import findpage
    from .stores import gcs

    # The stage graph as the last parse here recorded it (no parse of the workflow just for the page).
    parents = graph.load(args.config, args.workflow) if os.path.exists(graph.GRAPH_FILE) else None
    filters = {k: getattr(args, k) for k in ("stage", "pair", "experiment", "state", "since", "until", "config_hash")}
    data = findpage.build(rows, root=gcs.url_of(*gcs.filesystem(cfg["root"])),
                          experiments={name: list(x["pairs"]) for name, x in cfg["experiments"].items()},
                          parents=parents, roots=[gcs.url_of(*gcs.filesystem(r)) for r in roots],
                          filters=filters, generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    with open(args.html, "w", encoding="utf-8") as f:
        f.write(findpage.render(data))
    print(f"wrote {args.html}: {len(rows)} stage(s) from {len(roots)} root(s)")


def _check_find_names(cfg: dict, cat, args) -> None:
    """When ``find`` found nothing: a plain name (no shell pattern) that is
    neither configured nor in any root of the catalog is a typo, and gets
    the answer every command gives. Only then: the catalog spans other roots
    and older configs, so a name the config lacks may still be found."""
    for field, kind in (("experiment", "experiments"), ("pair", "pairs"), ("stage", "stages")):
        name = getattr(args, field)
        if name is None or any(c in name for c in "*?[") or cat.find(**{field: name}, limit=1):
            continue
        if field == "pair":   # not narrowed by --experiment: that may name another root's experiment
            wconfig.check_names(cfg, pairs=name)
        else:
            wconfig.check_names(cfg, **{kind: name})



def cmd_reuse(args) -> int:
    from . import reuse

    cfg = load_config(args)
    # NEW must be configured (add experiments.NEW with its pairs first); OLD
    # need not be: any experiment with stage directories under the root will do.
    wconfig.check_names(cfg, args.into, args.pairs, args.upstream_of)
    reach(args.from_root or cfg["root"])
    parents = graph.load(args.config, args.workflow)
    entries, problems = reuse.pointers(cfg, parents, args.into, args.source, args.upstream_of, args.pairs,
                                       args.from_root)
    if problems:
        print(f"waypost: can't reuse from experiment {args.source} (nothing written): these stages are not "
              "finished:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    path = os.path.join(wconfig.reuse_dir(args.config), f"{args.into}.yaml")
    reuse.write_pointers(path, args.into, entries, "waypost " + shlex.join(sys.argv[1:]))
    print(f"wrote {os.path.relpath(path)}: experiment {args.into} takes {len(entries)} stage(s) from "
          f"{args.source}: {', '.join(entries)}")
    print(f"the next run computes {args.upstream_of} and what follows it")
    return 0


def _shown(path: str) -> str:
    """A stage dir as the steering commands print it: relative when local."""
    return stores.shown(path)


def cmd_rerun(args) -> int:
    from . import steer

    cfg = load_config(args)
    wconfig.check_names(cfg, args.experiment, args.pair, args.stage)
    if not (args.experiment or args.pair or args.instance or args.all) and len(cfg["experiments"]) > 1:
        raise wconfig.ConfigError(f"rerun {args.stage}: the config has {len(cfg['experiments'])} experiments "
                                  f"({', '.join(cfg['experiments'])}); say which with --experiment, --pair or "
                                  f"--instance, or rerun it in all of them with --all")
    reach(cfg["root"])
    done = steer.rerun(cfg, args.stage, args.experiment, args.pair, args.instance, args.downstream, args.dry_run)
    reused = steer.reuse_sources(cfg, [directory for directory, _ in done])
    for directory, archived in done:
        note = (f" (reused: the next run re-links or copies it from {_shown(reused[directory])}, "
                "it does not recompute it)") if directory in reused else ""
        print(f"{_shown(directory)}: {'would be archived' if args.dry_run else 'archived in ' + archived}{note}")
    verb = "would be redone" if args.dry_run else "will be redone by the next run"
    print(f"{len(done)} stage(s) {verb}" + (f", {len(reused)} of them taken again from their reuse source"
                                           if reused else ""))
    return 0


def cmd_retry(args) -> int:
    """A new count of series for stages given up or waiting out a backoff."""
    from . import steer

    cfg = load_config(args)
    wconfig.check_names(cfg, args.experiment, args.pair, args.stage)
    reach(cfg["root"])
    done = steer.retry(cfg, args.stage, args.experiment, args.pair, args.instance, args.dry_run)
    for directory, what, then in done:
        print(f"{_shown(directory)}: {what}; {'would get' if args.dry_run else 'gets'} a new count of series; "
              f"the next run: {then}")
    print(f"{len(done)} stage(s) {'would be' if args.dry_run else 'will be'} tried again by the next run "
          "(their history kept)")
    return 0


def cmd_adopt(args) -> int:
    from . import steer

    cfg = load_config(args)
    wconfig.check_names(cfg, args.experiment, args.pair, args.stage, allow_all_pairs=True)
    reach(cfg["root"])
    record = steer.adopt(cfg, args.stage, args.experiment, args.pair, args.instance, args.note, args.force)
    print(f"adopted {len(record['outputs'])} file(s) as {args.experiment}/{args.pair}/{args.stage}"
          f"{'/' + args.instance if args.instance else ''}: " + ", ".join(o["path"] for o in record["outputs"]))
    return 0


def cmd_prune(args) -> int:
    """Remove the archived workspaces beyond the retention that nothing needs
    (slim those only an attempt history reads)."""
    from . import prune

    cfg = load_config(args)
    wconfig.check_names(cfg, args.experiment, args.pair, args.stage, allow_all_pairs=True)
    reach(cfg["root"])
    archives, problems = prune.prune(cfg, args.experiment, args.pair, args.stage, dry_run=args.dry_run)
    if not archives:
        print(f"no archived workspaces (.attempts/) under {cfg['root']} for this selection")
        return 0
    lines, trouble = prune.report(archives, problems, args.dry_run)
    print("\n".join(lines))
    if trouble:
        print(trouble, file=sys.stderr)
        return 1
    return 0


def cmd_plan(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from . import plan

    cfg = load_config(args)
    extra = extra_args(args)
    wconfig.check_names(cfg, stages=stage_args(extra))
    reach(cfg["root"])
    config_path = None if args.config == DEFAULT_CONFIG else args.config
    code, text, found = plan.dry_run(args.profile, config_path, args.workflow,
                              [*snakemake_options(cfg["root"]), *with_profile_config(args.profile, extra)])
    if code != 0:
        print(text[-4000:], file=sys.stderr)
        print("waypost: the dry run failed (above)", file=sys.stderr)
        return code
    rows = plan.next_run(plan.parse_jobs(found, (cfg.get(wconfig.AXIS_KEY) or {}).get("word", "pair")), cfg)
    if args.instance:
        found = {name for r in rows for name in r["instances"]} | instances_on_disk(cfg, workflow_facts(args))
        wconfig.check_instance_names(cfg, args.instance, None, found)
        rows = plan.only_instances(rows, lambda names: wconfig.match_instances(args.instance, names))

    drifted, code_unknown = plan.drift(cfg, graph.code_versions(), workflow_facts(args)["funnels"], args.instance)
    groups = plan.collapse(drifted, cfg)
    unknown_note = (f"code version unknown (recorded before per-stage code versions): {code_unknown} done "
                    f"stage(s)" if code_unknown else "")
    drift_code = 1 if args.check and drifted else 0   # --check: drift is a problem found
    if args.json:
        json.dump({"next_run": rows, "drift": drifted, "drift_groups": groups, "code_unknown": code_unknown},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
        return drift_code
    console = Console(width=args.width)
    axis = cfg.get("_axis")   # (a workflow without an axis: no column for it)
    if rows:
        jobs = sum(g["count"] for r in rows for g in r["reasons"])
        table = Table(title=f"next run: {jobs:,} job(s)", title_justify="left")
        named = any(r["instances"] for r in rows)   # (a column for instances when a stage has them)
        for column in ("experiment", *([axis["word"]] if axis else []), "stage", "jobs",
                       *(["instances"] if named else []), "why"):
            table.add_column(column, overflow="fold", justify="right" if column == "jobs" else "left")
        unnamed = 0
        for r in rows:   # a row per stage and reason: its jobs, and their instances when few
            for g in r["reasons"]:
                names = g["instances"]
                if len(names) > NAMED_INSTANCES and not args.all_instances:
                    unnamed += 1
                    names_text = "…"
                else:
                    names_text = ", ".join(sorted(names, key=_natural))
                table.add_row(r["experiment"], *([_pair_heading(r["pair"], axis)] if axis else []),
                              escape(r["stage"]), f"{g['count']:,}", *([escape(names_text)] if named else []),
                              escape(g["why"]))
        console.print(table)
        if unnamed:
            console.print(f"…: more than {NAMED_INSTANCES} instances; `waypost plan --all-instances` names them all")
    else:
        console.print("next run: nothing to do")
    titles = {False: "done, but made with other settings, code or inputs than now "
                     "(kept in presence mode; `waypost rerun STAGE` redoes one)",
              True: "not done, and the next series goes on with work made under other settings"}
    for unfinished in (False, True):
        shown = [g for g in groups if g["unfinished"] == unfinished]
        if not shown:
            continue
        table = Table(title=titles[unfinished], title_justify="left")
        for column in ("experiment", *([axis["word"]] if axis else []), "stage", "made", "what differs"):
            table.add_column(column, overflow="fold")
        for g in shown:   # cells of a stage with the same differences: one row, with their count
            made = " … ".join(dict.fromkeys(m[:16].replace("T", " ") for m in g["made"]))
            table.add_row(", ".join(g["experiments"]),
                          *([", ".join(_pair_heading(p, axis) for p in g["pairs"])] if axis else []),
                          escape(g["stage"] + (f" [{_names_shown(g['instances'])}]" if g["instances"] else "")
                                 + (f" ×{g['count']}" if g["count"] > 1 else "")),
                          made + (f" (reused from {', '.join(g['reused_from'])})" if g["reused_from"] else ""),
                          escape("\n".join(g["what"])))
        console.print(table)
    if not drifted:
        console.print("no drift in settings or inputs" if code_unknown else
                      "no drift: every done stage was made with the current settings and code")
    if unknown_note:
        console.print(unknown_note)
    return drift_code


def instances_on_disk(cfg: dict, facts: dict) -> set[str]:
    """The names of the instance directories of the workflow's stages with
    instances, in every experiment (one listing of each stage directory)."""
    from . import stores

    tree = stores.store_for(cfg["root"], snapshot=True)
    found = set()
    for experiment, spec in cfg["experiments"].items():
        for pair in [*spec["pairs"], layout.ALL_PAIRS]:
            for stage in facts.get("instanced") or []:
                stage_dir = layout.stage_dir(cfg["root"], pair, experiment, stage)
                if tree.isdir(stage_dir):
                    found.update(name for name, _ in tree.state_dirs(stage_dir) if name is not None)
    return found


# `waypost plan` names the instances of a row of the next run up to this many.
NAMED_INSTANCES = 10


def _natural(name: str) -> list:
    """A sort key that puts cells50 before cells150."""
    import re
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _names_shown(names: list[str], shown: int = 8) -> str:
    """Instance names for a table cell: the first few, then how many more."""
    names = sorted(names, key=_natural)
    return ", ".join(names[:shown]) + (f", … +{len(names) - shown}" if len(names) > shown else "")


def cmd_run(args) -> int:
    """Snakemake up to a stage, for some experiments and pairs."""
    cmd = [sys.executable, "-m", "snakemake", "-s", os.path.join(args.workflow, "Snakefile"), "--profile", args.profile]
    if args.config != DEFAULT_CONFIG:
        cmd += ["--configfile", args.config]
    cfg = load_config(args)
    extra = extra_args(args)
    wconfig.check_names(cfg, args.experiment, args.pair, [*(args.until or []), *stage_args(extra)])
    reach(cfg["root"])
    cmd += snakemake_options(cfg["root"])
    if args.until:
        cmd += ["--until", *args.until]
    select = {k: v for k, v in (("experiments", args.experiment), ("pairs", args.pair)) if v}
    cmd += with_profile_config(args.profile, extra, select)
    print("waypost: " + " ".join(shlex.quote(c) for c in ["snakemake", *cmd[3:]]), file=sys.stderr)
    sys.stdout.flush()
    os.execv(cmd[0], cmd)


EXIT_CODES = """exit codes (every command):
  0  fine
  1  problems found: `verify` found stages not to be trusted (also with --repair),
     `plan --check` found drift, `rerun`/`adopt` refused (an attempt is running,
     nothing to rerun), `reuse` found unfinished source stages, a root
     (gs://) can't be reached or read (`find`: one of its roots)
  2  usage or config error: a bad option, an invalid config, an unknown
     experiment, pair or stage name (checked the same way by every command)
Once Snakemake has started, `run` exits with Snakemake's code; `cron` exits
non-zero only when the workflow could not run at all (docs/operations.md).

reference (in waypost's repository, and the manual's Reference section):
  docs/reference/cli.md     every command and option (`waypost COMMAND --help`)
  docs/reference/config.md  every config key, its default and meaning"""

#: What ``waypost COMMAND --help`` ends with.
COMMAND_EPILOG = ("all options of every command: docs/reference/cli.md; every config key, its default and "
                  "meaning: docs/reference/config.md (in waypost's repository, and the manual's Reference section)")
INSTANCE_HELP = "only this instance{} (repeatable; shell patterns work: --instance 'nu0.01-*'){}"


def _recorded_axis() -> tuple[str, str]:
    """The axis words of the workflow last read here (see graph): the
    options follow them (``--pair``, or ``--point`` in a study of points)."""
    try:
        with open(graph.GRAPH_FILE) as f:
            axis = json.load(f).get("axis") or {}
    except (OSError, ValueError, AttributeError):
        axis = {}
    return axis.get("word") or "pair", axis.get("key") or "pairs"


def build_parser() -> argparse.ArgumentParser:
    word, words = _recorded_axis()
    one = ["--pair"] + ([f"--{word}"] if word != "pair" else [])     # --pair always works too
    many = ["--pairs"] + ([f"--{words}"] if words != "pairs" else [])
    parser = argparse.ArgumentParser(prog="waypost",
                                     description="Look at and steer the file state of a waypost workflow.",
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"waypost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p):
        p.add_argument("--config", default=DEFAULT_CONFIG, help="config file (default: %(default)s)")
        p.add_argument("--workflow", default="workflow", help="workflow dir with schemas/ (default: %(default)s)")
        return p

    p = with_config(sub.add_parser("status", help=f"experiments × {words} × stages, from the stage directories"))
    p.add_argument("--json", action="store_true", help="machine-readable output (indented on a terminal, one line when piped)")
    p.add_argument("--html", metavar="FILE", help="write the grid as one self-contained HTML page")
    p.add_argument("--failed", nargs="*", metavar="STAGE", help="name the stages and instances not done (of "
                   "these stages, default all), each with its state and why: its last decision's reason, given up, "
                   "a parent not accepted; not those running or not yet run")
    p.add_argument("--attempts", nargs="+", metavar="STAGE", help="the attempts of these stages: a line per "
                   "directory (instance or " + word + "): attempts, series, last state and decision; a "
                   "directory's every attempt when it is the only one (--instance NAME)")
    p.add_argument("--all-attempts", action="store_true", help="with --attempts: every attempt of every "
                   "directory, and its archived runs")
    p.add_argument("--experiment", help="only this experiment")
    p.add_argument(*one, dest="pair", help=f"only this {word} (its stages, no funnels)")
    p.add_argument("--instance", action="append", help=INSTANCE_HELP.format(" of the stages with instances", ""))
    p.add_argument("--sizes", action="store_true", help="the archived workspaces (.attempts/) of each stage: "
                   "how many, how big (walks them: only when asked)")
    p.set_defaults(func=cmd_status)

    p = with_config(sub.add_parser("workers", help="the resolved worker pool: class → resources and env"))
    p.add_argument("--profile", help="the pool this Snakemake profile selects (name or path)")
    p.add_argument("--pool", help="a pool of workers.yaml")
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true", help="compare each class of a Slurm pool with the cluster's "
                   "partitions and nodes (scontrol): time limits, CPUs, memory, GPUs, features, accounts, QOS; "
                   "exit 1 when one could never start")
    p.set_defaults(func=cmd_workers)

    p = with_config(sub.add_parser("cron", help="one locked, idempotent run of the workflow (for crontab)"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--no-checksums", action="store_true", help="check output sizes only, not checksums")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_cron)

    p = with_config(sub.add_parser("verify", help="find stages whose manifest or outputs can't be trusted"))
    p.add_argument("--repair", action="store_true", help="archive them so the next run redoes them")
    p.add_argument("--no-checksums", action="store_true", help="check output sizes only, not checksums")
    p.set_defaults(func=cmd_verify)

    p = with_config(sub.add_parser("find", help="stages that already exist, in every root of the catalog"))
    p.add_argument("--stage", help="a stage (shell patterns work: train_*), or STAGE/INSTANCE")
    p.add_argument(*one, dest="pair", help=f"a {word} (shell patterns work)")
    p.add_argument("--experiment", help="an experiment (shell patterns work)")
    p.add_argument("--instance", action="append", help=INSTANCE_HELP.format("", "; --stage STAGE/INSTANCE works too"))
    p.add_argument("--state", help="SUCCESS, FAILED, TIMEOUT, ...")
    p.add_argument("--since", help="made at or after this UTC date/time (2026-11-01 or 2026-11-01T12:00)")
    p.add_argument("--until", help="made before this UTC date/time")
    p.add_argument("--config-hash", help="made with exactly these settings")
    p.add_argument("--against", metavar="EXPERIMENT", help="compare settings with this experiment's (default: "
                   "the stage's own experiment if configured)")
    p.add_argument("--root", action="append", help="one more root to look in (path or gs:// URI)")
    p.add_argument("--db", default=layout.CATALOG_DB, help="the catalog cache (default: %(default)s)")
    p.add_argument("--no-refresh", action="store_true", help="query the cache as it is")
    p.add_argument("--no-archived", action="store_true", help="only current manifests, not the archived "
                   "workspaces (.attempts/<n>) of earlier runs")
    p.add_argument("--lineage", metavar="STAGE_DIR", help="the manifests this stage (or instance, or archive) "
                   "directory was made from, back to the first stage, across roots and reuse")
    p.add_argument("--limit", type=int)
    p.add_argument("--width", type=int, help="table width (default: the terminal's)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", metavar="FILE", help="write what was found as one self-contained HTML page (filters, "
                   "lineage, reuse pointers; opens from a file or a bucket)")
    p.set_defaults(func=cmd_find)

    p = with_config(sub.add_parser("reuse", help="make an experiment take the stages upstream of STAGE from another"))
    p.add_argument("--into", required=True, metavar="NEW", help="the experiment that reuses")
    p.add_argument("--from", dest="source", required=True, metavar="OLD", help="the experiment reused from")
    p.add_argument("--upstream-of", required=True, metavar="STAGE", help="reuse every stage this one depends on")
    p.add_argument(*many, dest="pairs", nargs="+", help=f"only these {words} (default: all of NEW's)")
    p.add_argument("--from-root", help="OLD lives under this root (path or gs:// URI), not the pipeline's")
    p.set_defaults(func=cmd_reuse)

    p = with_config(sub.add_parser("rerun", help="archive stages so the next run computes them again"))
    p.add_argument("stage")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument(*one, dest="pair", action="append", help=f"only this {word} (repeatable)")
    p.add_argument("--instance", action="append", help=INSTANCE_HELP.format(" of the stage", ""))
    p.add_argument("--all", action="store_true", help="in every experiment (needed when the config has more "
                   f"than one and no --experiment, --{word} or --instance narrows it)")
    p.add_argument("--downstream", action="store_true", help="and every stage made from their outputs (also in "
                   "experiments that reuse them)")
    p.add_argument("-n", "--dry-run", action="store_true", help="say what would be archived")
    p.set_defaults(func=cmd_rerun)

    p = with_config(sub.add_parser("retry", help="try stages that were given up (max_series) or are waiting out "
                                   "a series_backoff again at the next run, in place"))
    p.add_argument("stage")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument(*one, dest="pair", action="append", help=f"only this {word} (repeatable)")
    p.add_argument("--instance", action="append", help=INSTANCE_HELP.format(" of the stage", ""))
    p.add_argument("-n", "--dry-run", action="store_true", help="say what would be tried again")
    p.set_defaults(func=cmd_retry)

    p = with_config(sub.add_parser("adopt", help="declare files placed by hand in a stage directory done"))
    p.add_argument("stage")
    p.add_argument("--experiment", required=True)
    p.add_argument(*one, dest="pair", default="_all", help="(default: the per-experiment slot, for funnels)")
    p.add_argument("--instance", help="the instance, for a stage with instances")
    p.add_argument("--note", help="why, for the record")
    p.add_argument("--force", action="store_true", help="even over a stage waypost finished itself")
    p.set_defaults(func=cmd_adopt)

    p = with_config(sub.add_parser("prune", help="remove archived workspaces (.attempts/) beyond the retention "
                                   "that nothing needs"))
    p.add_argument("-n", "--dry-run", action="store_true", help="list what would be removed, slimmed and kept, and why")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument(*one, dest="pair", action="append", help=f"only this {word} (repeatable; _all: the funnels)")
    p.add_argument("--stage", action="append", help="only this stage (repeatable)")
    p.set_defaults(func=cmd_prune)

    p = with_config(sub.add_parser("plan", help="what the next run would do and why; done stages that drifted"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="exit 1 when a done stage drifted (for scripts and CI)")
    p.add_argument("--instance", action="append", help="only the jobs and drift of this instance (repeatable; "
                   "shell patterns work: --instance 'nu0.01-*')")
    p.add_argument("--all-instances", action="store_true", help="name every instance of the next run (by "
                   "default a row of a stage and reason names its instances when there are at most 10)")
    p.add_argument("--width", type=int, help="table width (default: the terminal's)")
    p.add_argument("--json", action="store_true")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_plan)

    p = with_config(sub.add_parser("run", help=f"run the pipeline, up to a stage, for some experiments and {words}"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--until", nargs="+", metavar="STAGE", help="stop after these stages")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument(*one, dest="pair", action="append", help=f"only this {word} (repeatable)")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("init", help="write a runnable pipeline into a new directory: three stages with a "
                       "funnel, its config, a schema, scripts and a test")
    p.add_argument("directory")
    p.add_argument("--no-profiles", action="store_true", help="don't install waypost's profiles for bare names")
    p.add_argument("--profiles-target", default="~/.config/snakemake", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_init)

    profiles = sub.add_parser("profiles", help="Snakemake profiles").add_subparsers(dest="action", required=True)
    p = profiles.add_parser("install", help="make waypost's profiles usable by bare name (--profile local): "
                            "copies of the installed package's, the same from any directory")
    p.add_argument("--target", default="~/.config/snakemake", help="where Snakemake looks (default: %(default)s)")
    p.set_defaults(func=cmd_profiles_install)
    for command in _commands(parser):
        command.epilog = command.epilog or COMMAND_EPILOG
    return parser


def _commands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield command
                yield from _commands(command)


def main(argv: list[str] | None = None) -> int:
    import signal
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `waypost find --json | head` ends quietly
    args = build_parser().parse_args(argv)
    from .stores import gcs
    gcs.quiet_gcsfs_logging()
    try:
        return args.func(args)
    except wconfig.ConfigError as exc:
        print(f"waypost: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # StorageError, SteerError, GraphError: one clear line, nothing changed
        print(f"waypost: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
