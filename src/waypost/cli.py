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

from . import __version__
from . import config as wconfig
from . import layout
from .remote_stage import snakemake_options

DEFAULT_CONFIG = "config/config.yaml"


def load_config(args) -> dict:
    return wconfig.load(args.config, args.workflow)


def cmd_status(args) -> int:
    from . import status

    cfg = load_config(args)
    grid = status.collect(cfg, wconfig.experiment_scoped_stages(args.workflow), args.experiment, args.pair)
    if args.attempts:
        render_attempts(grid, args.attempts)
        return 0
    if args.json:
        # Indented for a terminal; compact when piped, and then through
        # json.dumps's C encoder, which json.dump never uses (8,000 stages:
        # 4 MB in 0.05 s, not 7.5 MB in 0.25 s).
        sys.stdout.write(json.dumps(grid, indent=2 if sys.stdout.isatty() else None) + "\n")
        return 0
    if args.html:
        from . import statuspage
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(statuspage.render(grid))
        print(f"wrote {args.html}")
        return 0
    render_status(grid)
    return 0


def _label(cell: dict) -> tuple[str, str]:
    from . import status

    text, attempts = status.label(cell)
    return text + (f" ×{attempts}" if attempts > 1 else ""), status.look(cell["state"])[1]


def _pair_heading(pair: str) -> str:
    return "all pairs" if pair == layout.ALL_PAIRS else pair


# A stage's summary names at most this many pairs in each state but done.
NAMED_PAIRS = 6


def render_status(grid: dict) -> None:
    """One table per experiment: a row per stage, a column per pair; a legend.
    An experiment with more pairs than the terminal has room for shows, per
    stage, how many pairs are in each state and names those not done."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from . import status

    console = Console()
    summarized = False
    for experiment, columns in grid["experiments"].items():
        labels = {pair: {stage: _label(cell) for stage, cell in cells.items()} for pair, cells in columns.items()}
        stages = [stage for stage in grid["stages"] if any(stage in cells for cells in columns.values())]
        # Each column's widest text, plus its padding and border.
        width = 1 + sum(3 + max([len(_pair_heading(pair)), *(len(text) for text, _ in cells.values())])
                        for pair, cells in labels.items()) + 3 + max(map(len, stages), default=0)
        table = Table(title=f"experiment [bold]{experiment}[/]  (root {grid['root']})", title_justify="left")
        table.add_column("stage", style="bold")
        if width <= console.width:
            for pair in columns:
                table.add_column(_pair_heading(pair))
            for stage in stages:
                table.add_row(stage, *(Text(*cells[stage]) if stage in cells else Text("")
                                       for cells in labels.values()))
        else:
            summarized = True
            pairs = sum(1 for pair in columns if pair != layout.ALL_PAIRS)
            table.add_column(f"{pairs} pairs, by state")
            for stage in stages:
                funnel = labels.get(layout.ALL_PAIRS, {}).get(stage)
                table.add_row(stage, Text(*funnel) if funnel else _stage_summary(columns, stage))
        console.print(table)
    lines = [Text("  ").join(Text(*status.look(state)[:2]) for state in group)
             for group in (status.LOOKS, status.FAILURES)]
    console.print(Text("legend: ") + Text("\n        ").join([*lines, Text(status.LEGEND_MARKS)]))
    if summarized:
        console.print("one pair's cells: waypost status --pair PAIR; every cell: --json, or --html FILE")


def _stage_summary(columns: dict, stage: str):
    """How many pairs are in each state at one stage (done first, then
    worst first), naming the pairs not done: ``done 198  failed 2: a b``."""
    from rich.text import Text

    from . import status

    by_state: dict[str, list[str]] = {}
    for pair, cells in columns.items():
        if stage in cells:
            by_state.setdefault(cells[stage]["state"], []).append(_pair_heading(pair))
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
    """The attempt history of some stages: action, state, exit, checks, decision."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for stage in stages:
        if stage not in grid["stages"]:
            raise wconfig.ConfigError(f"unknown stage {stage!r} (expected one of: {', '.join(grid['stages'])})")
        for exp, p, instance, cell in _stage_cells(grid, stage):
            where = "/".join(x for x in (_pair_heading(p), exp, stage, instance) if x)
            table = Table(title=f"{where}: {_label(cell)[0]}" + (f" — {cell['reason']}" if cell.get("reason") else ""),
                          title_justify="left")
            series = len({a.get("series", 1) for a in cell.get("history", [])}) > 1
            columns = ["#"] + (["series"] if series else []) + ["action", "state", "exit", "checks", "next",
                                                               "secs", "log"]
            for column in columns:
                table.add_column(column, overflow="fold")
            for a in cell.get("history", []):
                exit_text = f"sig {a['signal']}" if a.get("signal") else str(a.get("exit_code", ""))
                checks = " ".join(f"{k}:{'ok' if v == 'SUCCESS' else v}" for k, v in (a.get("checks") or {}).items())
                row = [str(a["number"])] + ([str(a.get("series", 1))] if series else [])
                row += [a.get("action", ""), a.get("state") or "?", exit_text, checks,
                        (a.get("decision") or {}).get("action", ""), f"{a.get('duration_s') or 0:.1f}",
                        a.get("log") or ""]
                table.add_row(*row)
            console.print(table)


PROFILE_MARK = ".waypost-profile"


def _is_waypost_link(path: str) -> bool:
    """A link this command made earlier: dangling, or into a waypost profile
    (one holding the mark file), possibly of another checkout."""
    if not os.path.islink(path):
        return False
    return not os.path.exists(path) or os.path.exists(os.path.join(path, PROFILE_MARK))


def cmd_profiles_install(args) -> int:
    """Link the repo's profiles where Snakemake looks for bare names."""
    source_dir = os.path.abspath(args.source)
    target_dir = os.path.expanduser(args.target)
    os.makedirs(target_dir, exist_ok=True)
    for name in sorted(os.listdir(source_dir)):
        source = os.path.join(source_dir, name)
        if not os.path.isdir(source):
            continue
        target = os.path.join(target_dir, name)
        if os.path.islink(target) and os.path.realpath(target) == os.path.realpath(source):
            print(f"profile {name}: already installed ({target})")
            continue
        if _is_waypost_link(target):
            os.unlink(target)  # ours, from another (or a deleted) checkout
        elif os.path.lexists(target):
            print(f"profile {name}: {target} exists and is not waypost's; left alone "
                  f"(use --profile {os.path.relpath(source)} instead)", file=sys.stderr)
            continue
        os.symlink(source, target)
        print(f"profile {name}: installed {target} -> {source}")
    return 0


def _profile_pool(profile: str) -> str | None:
    """The pool a Snakemake profile selects (its ``config: [pool=...]``)."""
    candidates = [profile, os.path.join("profiles", profile), os.path.expanduser(f"~/.config/snakemake/{profile}"),
                  f"/etc/xdg/snakemake/{profile}"]
    for directory in candidates:
        path = os.path.join(directory, "config.yaml")
        if os.path.exists(path):
            entries = wconfig.load_yaml(path).get("config") or []
            for entry in entries if isinstance(entries, list) else [entries]:
                key, _, value = str(entry).partition("=")
                if key.strip() == "pool":
                    return value.strip().strip("'\"")
            return None
    raise wconfig.ConfigError(f"profile {profile!r} not found (looked in {', '.join(candidates)})")


def cmd_workers(args) -> int:
    """The resolved pool table: class → partition, GPUs, CPUs, memory, runtime, env."""
    from rich.console import Console
    from rich.table import Table

    from . import workers

    cfg = load_config(args)
    pool = args.pool or (args.profile and _profile_pool(args.profile)) or cfg["pool"]
    path = cfg["workers"]
    data = workers.load(path)
    if pool not in data["pools"]:
        raise wconfig.ConfigError(f"{path}: no pool {pool!r} (expected one of: {', '.join(data['pools'])})")
    spec = data["pools"][pool]
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


def cmd_cron(args) -> int:
    from . import cron
    extra = args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args
    return cron.run(args.profile, extra, args.config, args.workflow, checksums=not args.no_checksums)


def cmd_verify(args) -> int:
    from . import verify
    cfg = load_config(args)
    problems = verify.verify(cfg["root"], checksums=not args.no_checksums, repair=args.repair)
    for p in problems:
        action = f"archived in {p.stage_dir}/{p.archived}" if p.archived else "not done (use --repair to set it aside)"
        print(f"{p.stage_dir}: {p.what}; {action}")
    print(f"{len(problems)} stage(s) not to be trusted" if problems else "every manifest checks out")
    if cfg["root"].startswith("gs://"):
        print(verify.SIZES_ONLY)
    return 0


def cmd_find(args) -> int:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from . import catalog

    cfg = load_config(args)
    cat = catalog.Catalog(args.db)
    roots = catalog.roots_of(cfg) + (args.root or [])
    if not args.no_refresh:
        cat.forget_others(roots)
        for root in roots:
            try:
                done = cat.refresh(root)
            except Exception as exc:  # noqa: BLE001 — one root down doesn't hide the others
                print(f"waypost: catalog: {exc}", file=sys.stderr)
                continue
            for problem in done.problems:
                print(f"waypost: catalog: skipped {problem}", file=sys.stderr)
    rows = cat.find(stage=args.stage, pair=args.pair, experiment=args.experiment, state=args.state,
                    since=args.since, until=args.until, config_hash=args.config_hash, limit=args.limit)
    for row in rows:
        against = args.against or (row["experiment"] if row["experiment"] in cfg["experiments"] else
                                   next((e for e, x in cfg["experiments"].items() if row["pair"] in x["pairs"]), None))
        if against and row["stage"] in cfg["stages"] and (row["pair"] in cfg["experiments"][against]["pairs"]
                                                          or row["pair"] == "_all"):
            current = wconfig.step_settings(cfg, against, row["pair"], row["stage"])
            row["differs"] = catalog.settings_diff(row["settings"], current)
            row["compared_with"] = against
        else:
            row["differs"], row["compared_with"] = None, None
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = Table(title=f"{len(rows)} stage(s) found in {len(roots)} root(s), newest first", title_justify="left",
                  box=box.SIMPLE_HEAD)
    locations = [r["location"] if r["location"].startswith("gs://") or not r["location"].startswith(os.getcwd() + os.sep)
                 else os.path.relpath(r["location"]) for r in rows]
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
                      f"[{style}]{text}[/]" + (" (reused)" if row["reused_from"] else ""),
                      (row["created"] or "")[:16].replace("T", " "), str(row["attempts"]),
                      (row["config_hash"] or "–")[:8], escape(differs), escape(location))
    Console(width=args.width).print(table)
    return 0


def cmd_reuse(args) -> int:
    from . import graph, reuse

    cfg = load_config(args)
    parents = graph.load(args.config, args.workflow, cfg["root"])
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


def cmd_rerun(args) -> int:
    from . import steer

    cfg = load_config(args)
    done = steer.rerun(cfg, args.stage, args.experiment, args.pair, args.instance, args.downstream, args.dry_run)
    for directory, archived in done:
        shown = directory if directory.startswith("gs://") else os.path.relpath(directory)
        print(f"{shown}: {'would be archived' if args.dry_run else 'archived in ' + archived}")
    verb = "would be redone" if args.dry_run else "will be redone by the next run"
    print(f"{len(done)} stage(s) {verb}")
    return 0


def cmd_adopt(args) -> int:
    from . import steer

    cfg = load_config(args)
    record = steer.adopt(cfg, args.stage, args.experiment, args.pair, args.instance, args.note, args.force)
    print(f"adopted {len(record['outputs'])} file(s) as {args.experiment}/{args.pair}/{args.stage}"
          f"{'/' + args.instance if args.instance else ''}: " + ", ".join(o["path"] for o in record["outputs"]))
    return 0


def cmd_plan(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from rich.markup import escape

    from . import plan

    cfg = load_config(args)
    extra = args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args
    config_path = None if args.config == DEFAULT_CONFIG else args.config
    code, text = plan.dry_run(args.profile, config_path, args.workflow, [*snakemake_options(cfg["root"]), *extra])
    if code != 0:
        print(text[-4000:], file=sys.stderr)
        print("waypost: the dry run failed (above)", file=sys.stderr)
        return code
    rows = plan.next_run(plan.parse_jobs(text), cfg)
    drifted = plan.drift(cfg, wconfig.code_version(args.workflow), wconfig.experiment_scoped_stages(args.workflow))
    if args.json:
        json.dump({"next_run": rows, "drift": drifted}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    console = Console(width=args.width)
    if rows:
        table = Table(title=f"next run: {sum(max(1, len(r['instances'])) for r in rows)} job(s)", title_justify="left")
        for column in ("experiment", "pair", "stage", "why"):
            table.add_column(column, overflow="fold")
        for r in rows:
            stage = r["stage"] + (f" [{', '.join(sorted(r['instances']))}]" if r["instances"] else "")
            table.add_row(r["experiment"], "all pairs" if r["pair"] == "_all" else r["pair"], escape(stage),
                          escape(r["why"]))
        console.print(table)
    else:
        console.print("next run: nothing to do")
    if drifted:
        table = Table(title="done, but made with other settings, code or inputs than now "
                            "(kept in presence mode; `waypost rerun STAGE` redoes one)", title_justify="left")
        for column in ("experiment", "pair", "stage", "made", "what differs"):
            table.add_column(column, overflow="fold")
        for r in drifted:
            table.add_row(r["experiment"], "all pairs" if r["pair"] == "_all" else r["pair"],
                          r["stage"] + (f"/{r['instance']}" if r["instance"] else ""),
                          (r["created"] or "")[:19].replace("T", " ")
                          + (f" (reused from {r['reused_from']})" if r["reused_from"] else ""),
                          escape("\n".join(r["what"])))
        console.print(table)
    else:
        console.print("no drift: every done stage was made with the current settings and code")
    return 0


def cmd_run(args) -> int:
    """Snakemake up to a stage, for some experiments and pairs."""
    cmd = [sys.executable, "-m", "snakemake", "-s", os.path.join(args.workflow, "Snakefile"), "--profile", args.profile]
    if args.config != DEFAULT_CONFIG:
        cmd += ["--configfile", args.config]
    cmd += snakemake_options(load_config(args)["root"])
    if args.until:
        cmd += ["--until", *args.until]
    select = {k: v for k, v in (("experiments", args.experiment), ("pairs", args.pair)) if v}
    if select:
        cmd += ["--config", "select=" + json.dumps(select, separators=(",", ":"))]
    cmd += args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args
    print("waypost: " + " ".join(shlex.quote(c) for c in ["snakemake", *cmd[3:]]), file=sys.stderr)
    sys.stdout.flush()
    os.execv(cmd[0], cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="waypost", description="Look at and steer the file state of a waypost workflow.")
    parser.add_argument("--version", action="version", version=f"waypost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p):
        p.add_argument("--config", default=DEFAULT_CONFIG, help="config file (default: %(default)s)")
        p.add_argument("--workflow", default="workflow", help="workflow dir with schemas/ (default: %(default)s)")
        return p

    p = with_config(sub.add_parser("status", help="experiments × pairs × stages, from the stage directories"))
    p.add_argument("--json", action="store_true", help="machine-readable output (indented on a terminal, one line when piped)")
    p.add_argument("--html", metavar="FILE", help="write the grid as one self-contained HTML page")
    p.add_argument("--attempts", nargs="+", metavar="STAGE", help="list the attempt history of these stages")
    p.add_argument("--experiment", help="only this experiment")
    p.add_argument("--pair", help="only this pair (its stages, no funnels)")
    p.set_defaults(func=cmd_status)

    p = with_config(sub.add_parser("workers", help="the resolved worker pool: class → resources and env"))
    p.add_argument("--profile", help="the pool this Snakemake profile selects (name or path)")
    p.add_argument("--pool", help="a pool of workers.yaml")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_workers)

    p = with_config(sub.add_parser("cron", help="one locked, idempotent run of the workflow (for crontab)"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--no-checksums", action="store_true", help="check output sizes only, not sha256")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_cron)

    p = with_config(sub.add_parser("verify", help="find stages whose manifest or outputs can't be trusted"))
    p.add_argument("--repair", action="store_true", help="archive them so the next run redoes them")
    p.add_argument("--no-checksums", action="store_true", help="check output sizes only, not sha256")
    p.set_defaults(func=cmd_verify)

    p = with_config(sub.add_parser("find", help="stages that already exist, in every root of the catalog"))
    p.add_argument("--stage", help="a stage (shell patterns work: train_*)")
    p.add_argument("--pair", help="a pair (shell patterns work: en-*)")
    p.add_argument("--experiment", help="an experiment (shell patterns work)")
    p.add_argument("--state", help="SUCCESS, FAILED, TIMEOUT, ...")
    p.add_argument("--since", help="made at or after this UTC date/time (2026-11-01 or 2026-11-01T12:00)")
    p.add_argument("--until", help="made before this UTC date/time")
    p.add_argument("--config-hash", help="made with exactly these settings")
    p.add_argument("--against", metavar="EXPERIMENT", help="compare settings with this experiment's (default: "
                   "the stage's own experiment if configured)")
    p.add_argument("--root", action="append", help="one more root to look in (path or gs:// URI)")
    p.add_argument("--db", default=layout.CATALOG_DB, help="the catalog cache (default: %(default)s)")
    p.add_argument("--no-refresh", action="store_true", help="query the cache as it is")
    p.add_argument("--limit", type=int)
    p.add_argument("--width", type=int, help="table width (default: the terminal's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_find)

    p = with_config(sub.add_parser("reuse", help="make an experiment take the stages upstream of STAGE from another"))
    p.add_argument("--into", required=True, metavar="NEW", help="the experiment that reuses")
    p.add_argument("--from", dest="source", required=True, metavar="OLD", help="the experiment reused from")
    p.add_argument("--upstream-of", required=True, metavar="STAGE", help="reuse every stage this one depends on")
    p.add_argument("--pairs", nargs="+", help="only these pairs (default: all of NEW's)")
    p.add_argument("--from-root", help="OLD lives under this root (path or gs:// URI), not the pipeline's")
    p.set_defaults(func=cmd_reuse)

    p = with_config(sub.add_parser("rerun", help="archive stages so the next run computes them again"))
    p.add_argument("stage")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument("--pair", action="append", help="only this pair (repeatable)")
    p.add_argument("--instance", help="only this instance of the stage")
    p.add_argument("--downstream", action="store_true", help="and every stage made from their outputs")
    p.add_argument("-n", "--dry-run", action="store_true", help="say what would be archived")
    p.set_defaults(func=cmd_rerun)

    p = with_config(sub.add_parser("adopt", help="declare files placed by hand in a stage directory done"))
    p.add_argument("stage")
    p.add_argument("--experiment", required=True)
    p.add_argument("--pair", default="_all", help="(default: the per-experiment slot, for funnels)")
    p.add_argument("--instance")
    p.add_argument("--note", help="why, for the record")
    p.add_argument("--force", action="store_true", help="even over a stage waypost finished itself")
    p.set_defaults(func=cmd_adopt)

    p = with_config(sub.add_parser("plan", help="what the next run would do and why; done stages that drifted"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--width", type=int, help="table width (default: the terminal's)")
    p.add_argument("--json", action="store_true")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_plan)

    p = with_config(sub.add_parser("run", help="run the pipeline, up to a stage, for some experiments and pairs"))
    p.add_argument("--profile", default="local", help="Snakemake profile (default: %(default)s)")
    p.add_argument("--until", nargs="+", metavar="STAGE", help="stop after these stages")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument("--pair", action="append", help="only this pair (repeatable)")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more Snakemake arguments, after --")
    p.set_defaults(func=cmd_run)

    profiles = sub.add_parser("profiles", help="Snakemake profiles").add_subparsers(dest="action", required=True)
    p = profiles.add_parser("install", help="make the repo's profiles usable by bare name (--profile local)")
    p.add_argument("--source", default="profiles", help="the repo's profiles dir (default: %(default)s)")
    p.add_argument("--target", default="~/.config/snakemake", help="where Snakemake looks (default: %(default)s)")
    p.set_defaults(func=cmd_profiles_install)
    return parser


def main(argv: list[str] | None = None) -> int:
    import signal
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `waypost find --json | head` ends quietly
    args = build_parser().parse_args(argv)
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
